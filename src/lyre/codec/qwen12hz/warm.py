"""Where a clone's stream starts: the 12 Hz decoder's state after its voice's reference clip.

A clone in reference-transcript mode speaks on from its clip (the reference decodes clip and speech
as one sequence and cuts the clip off), so its stream starts from the state the clip's frames leave.
:class:`WarmStates` computes that state once per voice, on a thread of its own (never in the
codec's round: a long clip would hold up every other stream's audio), keeps the newest
``WARM_STATES``, and drops a voice's at once when the voice is deleted (a computation still
running for it is not kept).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from lyre.codec.qwen12hz.decoder import Decoder, StreamState

log = logging.getLogger("lyre.codec")

WARM_STATES = 32  # voices whose warmed-up decoder state is kept


@dataclass(frozen=True, eq=False)
class WarmUp:
    """Frames decoded before a stream's first, unheard: a cloned voice's reference clip."""

    key: str  # the voice and its clip ("<voice id>:<audio hash>"): the kept state's name
    frames: np.ndarray  # (T, 16) codes, codebook 0 first

    @property
    def voice_id(self) -> str:
        return self.key.split(":", 1)[0]


class WarmStates:
    def __init__(self, decoder: Decoder, keep: int = WARM_STATES):
        self.decoder, self.keep = decoder, keep
        self.frames = 0  # clip frames decoded (unheard: not the codec's frames_decoded)
        self._states: OrderedDict[str, StreamState] = OrderedDict()
        self._pending: dict[str, Future] = {}
        self._failed: dict[str, Exception] = {}
        self._forgotten: set[str] = set()  # deleted voices: never kept again
        self._lock = threading.Lock()  # (forget() comes from the event loop, the rest from the codec's thread)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lyre-codec-warm")

    def ready(self, warm: WarmUp) -> bool:
        """Whether a stream of ``warm`` can start now: its state is kept (or computing it failed: the
        stream's first decode then fails with that error; or its voice was deleted: a synthesis
        already running finishes, its state computed in the decode and not kept). Otherwise its
        computation is started."""
        with self._lock:
            if warm.key in self._states or warm.key in self._failed or warm.voice_id in self._forgotten:
                return True
            if warm.key not in self._pending:
                self._pending[warm.key] = self._pool.submit(self._compute, warm)
            return False

    def state(self, warm: WarmUp) -> StreamState:
        """A copy of the state after ``warm``'s frames (computed here if it is not kept: evicted since
        :meth:`ready`); the computation's error if it failed (dropped: a later stream tries again)."""
        with self._lock:
            failed = self._failed.pop(warm.key, None)
            state = self._states.get(warm.key)
            if state is not None:
                self._states.move_to_end(warm.key)
        if failed is not None:
            raise failed
        if state is None:
            state = self._decode(warm)
        return StreamState({k: v.clone() for k, v in state.tensors.items()})

    def forget(self, voice_id: str) -> None:
        """Drop ``voice_id``'s states (it was deleted); a computation under way for it is not kept."""
        with self._lock:
            self._forgotten.add(voice_id)
            for key in [k for k in self._states if k.split(":", 1)[0] == voice_id]:
                del self._states[key]

    def keys(self) -> list[str]:
        with self._lock:
            return [*self._states, *self._pending]

    def settle(self) -> None:
        """Wait for the computations under way (tests, shutdown)."""
        with self._lock:
            pending = list(self._pending.values())
        for future in pending:
            future.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compute(self, warm: WarmUp) -> None:
        try:
            state = self._decode(warm)
        except Exception as e:  # noqa: BLE001 - the stream that needs it fails with it
            log.warning("warming the codec up with voice %s's clip failed: %s: %s", warm.voice_id, type(e).__name__, e)
            with self._lock:
                self._pending.pop(warm.key, None)
                self._failed[warm.key] = e
            return
        with self._lock:
            self._pending.pop(warm.key, None)
            if warm.voice_id not in self._forgotten:
                self._states[warm.key] = state
                while len(self._states) > self.keep:
                    self._states.popitem(last=False)

    @torch.inference_mode()
    def _decode(self, warm: WarmUp) -> StreamState:
        state = self.decoder.new_state(1)
        codes = torch.from_numpy(np.ascontiguousarray(warm.frames.T))[None]  # (1, 16, T)
        self.decoder.stream(codes.to(next(self.decoder.parameters()).device), state)  # (its audio unheard)
        self.frames += codes.shape[-1]
        return state
