"""Lyre's logits processing for the TensorRT-LLM backend, as the executor's batched logits
post-processor: the repetition penalty over a request's most recent generated tokens (the
executor's own penalty has no window and covers the prompt, so it would penalise a cloned
voice's reference codes), then the frame-slot constraint (after start-of-speech only the 4096
codes of the current slot, and end-of-speech at frame boundaries, keep their logits), and every
stop id held back until ``min_tokens`` (the executor's ``min_tokens`` holds back its end id only). This is
the PyTorch engine's processing (``lyre.engine.torch.sampler``); ``tests/engine/test_logits_spec.py``
holds both to one specification.

Per request and step it costs one in-place add of a precomputed mask row (7 slot rows + slot 0
with end-of-speech, made once per device and dtype) and, for a penalised request, one gather,
one ``where`` and one scatter over its recent distinct tokens, whose indices for the whole batch
go to the device in one copy. It reads only the tail of each request's token list (TensorRT-LLM
1.2.1's bindings still convert each request's whole token list to Python lists for every call:
no API passes only the tail).

NOT YET RUN ON A GPU BY THIS PROJECT (see :mod:`lyre.engine.trtllm.engine`): tested only through
``tests/support/fake_trtllm.py``, which calls it as TensorRT-LLM 1.2.1's executor does. Its CUDA
branch has never run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from lyre.engine.base import SamplingParams
from lyre.model import orpheus

log = logging.getLogger("lyre.engine")

BAND = orpheus.CODEBOOK_SIZE
STOP_ROW = orpheus.FRAME_TOKENS  # mask row of frame slot 0 with end-of-speech allowed


def mask_rows(vocab: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(8, vocab) additive masks: row ``s`` keeps frame slot ``s``'s codes (0) and sends the rest to
    -inf; row 7 is slot 0 with end-of-speech kept too."""
    masks = torch.full((orpheus.FRAME_TOKENS + 1, vocab), float("-inf"), dtype=dtype)
    for slot in range(orpheus.FRAME_TOKENS):
        lo = orpheus.AUDIO_TOKEN_OFFSET + slot * BAND
        masks[slot, lo:lo + BAND] = 0
    masks[STOP_ROW] = masks[0]
    masks[STOP_ROW, orpheus.END_OF_SPEECH] = 0
    return masks.to(device)


@dataclass
class _Request:
    prompt_len: int
    min_tokens: int
    constrain: bool
    penalty: float  # 1.0: none
    stop_ids: tuple[int, ...]  # -inf until min_tokens tokens are generated
    window: int  # generated tokens the penalty looks back over; 0 = all of them
    audio_start: int | None  # index in the token list of the first audio token; None before start-of-speech
    scanned: int  # tokens already searched for start-of-speech
    seen: int  # prompt + generated tokens at the last call: what was sampled under the processing


@dataclass
class Row:
    """One request's work this step."""

    client_id: int
    logits: torch.Tensor  # (1, beam, vocab), edited in place
    audio_index: int | None  # the audio token about to be sampled (its frame slot is this % 7); None before any
    mask: int | None  # mask row to add; None: not (yet) constrained
    penalised: list[int]  # distinct recent tokens the penalty covers
    penalty: float
    stops: tuple[int, ...] = ()  # stop ids sent to -inf (min_tokens not yet reached)
    cols: torch.Tensor | None = None  # ``penalised`` on the device (a view of the batch's one copy)


def process_row(row: Row, masks: torch.Tensor | None, stops: torch.Tensor | None = None) -> None:
    """The penalty (positive logits divided by it, negative ones multiplied), then the mask, or the
    stop ids to -inf before ``min_tokens``."""
    flat = row.logits.view(-1, row.logits.shape[-1])  # (beam, vocab)
    if stops is not None:
        flat.index_fill_(1, stops, float("-inf"))
    if row.cols is not None:
        seen = flat.index_select(1, row.cols)
        flat.index_copy_(1, row.cols, torch.where(seen > 0, seen / row.penalty, seen * row.penalty))
    if row.mask is not None:
        assert masks is not None
        flat.add_(masks[row.mask])


class LogitsPostProcessor:
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
    request whose processing fails is left out and listed in ``failed`` with how many of its
    tokens were sampled under it (the engine delivers those, then ends it)."""

    def __init__(self) -> None:
        self.requests: dict[int, _Request] = {}
        self.failed: dict[int, tuple[str, int]] = {}  # client id -> (why, good tokens); taken by the engine thread
        self._masks: dict[tuple, torch.Tensor] = {}  # (device, dtype, vocab) -> mask_rows
        self._stops: dict[tuple, torch.Tensor] = {}  # (device, stop ids) -> them on the device

    @staticmethod
    def wanted(p: SamplingParams) -> bool:
        """Does a request with these settings need the post-processor?"""
        return p.constrain_audio or p.repetition_penalty != 1.0 or p.min_tokens > 0

    def register(self, client_id: int, prompt_ids: list[int], p: SamplingParams) -> None:
        n = len(prompt_ids)
        start = n if prompt_ids[-1] == orpheus.START_OF_SPEECH else None
        self.requests[client_id] = _Request(n, p.min_tokens, p.constrain_audio, p.repetition_penalty,
                                            tuple(p.stop_ids), p.repetition_window, start, scanned=n, seen=n)

    def drop(self, client_id: int) -> None:
        self.requests.pop(client_id, None)

    def __call__(self, req_ids, logits_list, beam_tokens, stream_ptr, client_ids) -> None:
        rows: list[Row] = []
        try:
            rows = [row for row in map(self._row, client_ids, logits_list, beam_tokens) if row is not None]
            if not rows:
                return
            device = rows[0].logits.device
            if device.type == "cuda":  # on the executor's stream (of the logits' device), before its sampling
                with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr, device=device)):
                    self._apply(rows)
            else:
                self._apply(rows)
        except Exception as e:  # noqa: BLE001 - never into the executor (see the class doc)
            log.exception("logits post-processing failed for a whole batch")
            # the requests it had work for (the others' logits were not touched), or, failing before
            # it knew them, every registered one in the batch
            for client_id in [r.client_id for r in rows] or [c for c in client_ids if c in self.requests]:
                self._fail(client_id, e)

    def _row(self, client_id, logits, beams) -> Row | None:
        """This step's work for a registered request (None: nothing to do, or not ours)."""
        state = self.requests.get(client_id) if client_id is not None else None
        if state is None or client_id in self.failed:
            return None
        try:
            tokens = beams[0]
            n = len(tokens)
            state.seen = n
            mask = k = None
            if state.constrain:
                if state.audio_start is None:  # free sampling until start-of-speech comes
                    for i in range(state.scanned, n):
                        if tokens[i] == orpheus.START_OF_SPEECH:
                            state.audio_start = i + 1
                    state.scanned = n
                if state.audio_start is not None:
                    k = n - state.audio_start
                    slot = k % orpheus.FRAME_TOKENS
                    mask = STOP_ROW if slot == 0 and n - state.prompt_len >= state.min_tokens else slot
            penalised: list[int] = []
            if state.penalty != 1.0:
                since = state.prompt_len if not state.window else max(state.prompt_len, n - state.window)
                penalised = sorted({int(t) for t in tokens[since:n]})
            early = n - state.prompt_len < state.min_tokens
            stops = state.stop_ids if early and mask is None else ()  # (a mask row has them, when constrained)
            if mask is None and not penalised and not stops:
                return None
            return Row(client_id, logits, k, mask, penalised, state.penalty, stops)
        except Exception as e:  # noqa: BLE001 - this request's own fault
            self._fail(client_id, e)
            return None

    def _apply(self, rows: list[Row]) -> None:
        first = rows[0].logits
        masks = None
        if any(r.mask is not None for r in rows):
            key = (first.device, first.dtype, first.shape[-1])
            if key not in self._masks:
                self._masks[key] = mask_rows(first.shape[-1], first.device, first.dtype)
            masks = self._masks[key]
        penalised = [r for r in rows if r.penalised]
        if penalised:  # every row's indices in one copy to the device
            flat = torch.tensor([t for r in penalised for t in r.penalised], dtype=torch.long).to(first.device)
            at = 0
            for r in penalised:
                r.cols, at = flat[at:at + len(r.penalised)], at + len(r.penalised)
        for row in rows:
            try:
                process_row(row, masks, self._stop_ids(row.stops, first.device) if row.stops else None)
            except Exception as e:  # noqa: BLE001 - this request's own fault
                self._fail(row.client_id, e)

    def _stop_ids(self, stops: tuple[int, ...], device: torch.device) -> torch.Tensor:
        key = (device, stops)
        if key not in self._stops:
            self._stops[key] = torch.tensor(stops, dtype=torch.long).to(device)
        return self._stops[key]

    def _fail(self, client_id: int, error: Exception) -> None:
        state = self.requests.get(client_id)
        if state is None:  # finished meanwhile (the engine thread dropped it)
            return
        log.warning("logits post-processing failed for client id %d: %s: %s", client_id, type(error).__name__, error)
        why = f"the logits post-processing failed: {type(error).__name__}: {error}"
        self.failed.setdefault(client_id, (why, state.seen - state.prompt_len))  # the first failure counts
