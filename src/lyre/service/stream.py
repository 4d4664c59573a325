"""What a synthesis gives back: audio chunks as they are decoded (:class:`SpeechStream`), or the
whole utterance (:class:`Audio`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lyre.core.session import CANCELLED, FINISHED, ChunkEvent, Session
from lyre.errors import ServiceUnavailable, SynthesisCancelled, SynthesisFailed, SynthesisTimeout
from lyre.model import orpheus

if TYPE_CHECKING:
    from lyre.service.tts import TTSService
    from lyre.trust.audit import AuditEntry




@dataclass
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    offset_samples: int  # of pcm[0] in the whole utterance
    index: int
    elapsed_ms: float  # request received -> this chunk delivered
    late: bool  # delivered after the audio before it had finished playing

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


@dataclass
class Audio:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    metrics: dict[str, Any] = field(default_factory=dict)  # ttfb_ms, tokens, audio_seconds, real_time_factor, ...

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


def to_int16(pcm: np.ndarray) -> np.ndarray:
    return (np.clip(pcm, -1.0, 1.0) * 32767.0).round().astype(np.int16)


class SpeechStream:
    """Async iterator over one utterance's :class:`AudioChunk` s; ``metrics`` is set at the end.
    Leaving the loop early (break, exception, aclose) cancels the synthesis and frees its slot.

    Every chunk is watermarked (``mark``: the session's stateful watermarker, or None) and hashed
    into the audit entry; the stream that owns its entry records it when it ends (an utterance's
    pieces share the utterance's entry, which the utterance records)."""

    def __init__(self, service: TTSService, session: Session, events: asyncio.Queue, audit: AuditEntry | None = None,
                 owns_audit: bool = True, mark: Callable[[np.ndarray], np.ndarray] | None = None):
        self._service, self._session, self._events = service, session, events
        self.session_id = session.session_id
        self.metrics: dict[str, Any] | None = None
        self._done = False
        self._audit, self._owns_audit, self._mark = audit, owns_audit, mark

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            ev = await self._events.get()
        except BaseException:
            self.cancel()
            raise
        if isinstance(ev, ChunkEvent):
            self._session.consumed_samples += len(ev.pcm)
            pcm = to_int16(ev.pcm if self._mark is None else self._mark(ev.pcm))
            if self._audit is not None:
                self._audit.add_pcm(pcm)
            return AudioChunk(
                pcm=pcm,
                sample_rate=orpheus.SAMPLE_RATE,
                offset_samples=ev.offset,
                index=ev.index,
                elapsed_ms=1000 * (time.monotonic() - self._session.created),
                late=ev.late,
            )
        self._done = True
        self.metrics = ev.metrics
        self._record(ev.outcome, None if ev.outcome == FINISHED else ev.reason)
        if ev.outcome == FINISHED:
            raise StopAsyncIteration
        if ev.outcome == CANCELLED and ev.reason == "shutdown":
            raise ServiceUnavailable("the service shut down before this synthesis finished")
        if ev.outcome == CANCELLED and ev.reason == "timeout":
            raise SynthesisTimeout("synthesis made no progress (no audio generated or read) for scheduler.session_timeout_s")
        if ev.outcome == CANCELLED:
            raise SynthesisCancelled(f"synthesis was cancelled ({ev.reason})")
        raise SynthesisFailed(ev.reason or "synthesis failed")

    def cancel(self) -> None:
        if not self._done:
            self._done = True
            self._service._cancel(self.session_id)
            self._record(CANCELLED, "cancelled")

    def _record(self, outcome: str, reason: str | None) -> None:
        if self._audit is not None and self._owns_audit:
            self._audit.finish(outcome, reason)

    async def aclose(self) -> None:
        self.cancel()

    def __del__(self) -> None:
        # left without aclose (a library caller's ``break``): the synthesis stops and its row is recorded
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - interpreter shutdown, or the service is gone
            pass
