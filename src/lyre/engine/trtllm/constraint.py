"""Constrained audio sampling for the TensorRT-LLM backend, as the executor's batched logits
post-processor: after start-of-speech only the 4096 codes of the current frame slot, and
end-of-speech at frame boundaries, keep their logits.

NOT YET RUN ON A GPU BY THIS PROJECT (see :mod:`lyre.engine.trtllm.engine`): tested only through
``tests/support/fake_trtllm.py``, which calls it as TensorRT-LLM 1.2.1's executor does. Its CUDA branch
has never run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from lyre.model import orpheus

log = logging.getLogger("lyre.engine")

BAND = orpheus.CODEBOOK_SIZE




def constrain_logits(logits: torch.Tensor, audio_index: int, allow_stop: bool) -> None:
    """In place over the last dim of ``logits`` (..., vocab): only the codes of frame slot
    ``audio_index % 7`` stay, plus end-of-speech at a frame boundary when ``allow_stop``."""
    slot = audio_index % orpheus.FRAME_TOKENS
    lo = orpheus.AUDIO_TOKEN_OFFSET + slot * BAND
    band = logits[..., lo:lo + BAND].clone()
    stop = logits[..., orpheus.END_OF_SPEECH].clone()
    logits.fill_(float("-inf"))
    logits[..., lo:lo + BAND] = band
    if slot == 0 and allow_stop:
        logits[..., orpheus.END_OF_SPEECH] = stop


@dataclass
class _Constrained:
    prompt_len: int
    min_tokens: int
    audio_start: int | None  # index in the token list of the first audio token; None before start-of-speech
    scanned: int = 0  # tokens already searched for start-of-speech
    seen: int = 0  # prompt + generated tokens at the last call: what was sampled under the constraint


class AudioConstraint:
    """The executor's ``LogitsPostProcessorBatched``: ``(req_ids, logits, beam_tokens, stream_ptr,
    client_ids)``; ``logits[i]`` is a (1, beam, vocab) view of the GPU logits, edited in place on
    the executor's CUDA stream ``stream_ptr``, and ``beam_tokens[i][0]`` holds the prompt and the
    tokens generated so far (``LlmRequest::getTokens``). Only requests that name the batched
    processor are passed.

    It runs on the executor's own thread, from the iteration that samples a request's first token
    on: that can come right after ``enqueue_request`` returns, before the executor id it returned
    is stored anywhere. So requests are known by their ``client_id`` (Lyre's own number for the
    request, set on the executor ``Request``) and registered BEFORE enqueueing. Registered and
    dropped from the engine thread, read from the executor's (single dict operations; the GIL
    orders them).

    It never raises: the executor answers an exception here by failing every active request. A
    request whose constraint fails is left out and listed in ``failed`` with how many of its
    tokens were sampled under the constraint (the engine delivers those, then ends it)."""

    def __init__(self) -> None:
        self.requests: dict[int, _Constrained] = {}
        self.failed: dict[int, tuple[str, int]] = {}  # client id -> (why, good tokens); taken by the engine thread

    def register(self, client_id: int, prompt_ids: list[int], min_tokens: int) -> None:
        n = len(prompt_ids)
        start = n if prompt_ids[-1] == orpheus.START_OF_SPEECH else None
        self.requests[client_id] = _Constrained(n, min_tokens, start, scanned=n, seen=n)

    def drop(self, client_id: int) -> None:
        self.requests.pop(client_id, None)

    def __call__(self, req_ids, logits_list, beam_tokens, stream_ptr, client_ids) -> None:
        try:
            rows = [row for row in map(self._row, client_ids, logits_list, beam_tokens) if row is not None]
            if not rows:
                return
            if rows[0][1].is_cuda:  # masks go on the executor's stream, ordered before its sampling
                with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr)):
                    self._apply(rows)
            else:
                self._apply(rows)
        except Exception as e:  # noqa: BLE001 - never into the executor (see the class doc)
            log.exception("audio constraint failed for a whole batch")
            for client_id in client_ids:
                if client_id in self.requests:
                    self._fail(client_id, e)

    def _row(self, client_id, logits, beams) -> tuple[int, torch.Tensor, int, bool] | None:
        """(client id, logits, audio token index, end-of-speech allowed) for a constrained request."""
        state = self.requests.get(client_id) if client_id is not None else None
        if state is None or client_id in self.failed:
            return None
        try:
            tokens = beams[0]
            state.seen = len(tokens)
            if state.audio_start is None:  # free sampling until start-of-speech comes
                for i in range(state.scanned, len(tokens)):
                    if tokens[i] == orpheus.START_OF_SPEECH:
                        state.audio_start = i + 1
                state.scanned = len(tokens)
                if state.audio_start is None:
                    return None
            generated = len(tokens) - state.prompt_len
            return client_id, logits, len(tokens) - state.audio_start, generated >= state.min_tokens
        except Exception as e:  # noqa: BLE001 - this request's own fault
            self._fail(client_id, e)
            return None

    def _apply(self, rows: list[tuple[int, torch.Tensor, int, bool]]) -> None:
        for client_id, logits, k, allow_stop in rows:
            try:
                constrain_logits(logits, k, allow_stop)
            except Exception as e:  # noqa: BLE001 - this request's own fault
                self._fail(client_id, e)

    def _fail(self, client_id: int, error: Exception) -> None:
        state = self.requests.get(client_id)
        if state is None:  # finished meanwhile (the engine thread dropped it)
            return
        log.warning("audio constraint failed for client id %d: %s: %s", client_id, type(error).__name__, error)
        why = f"the audio constraint failed: {type(error).__name__}: {error}"
        self.failed.setdefault(client_id, (why, state.seen - state.prompt_len))  # the first failure counts
