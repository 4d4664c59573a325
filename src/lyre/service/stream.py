"""What a synthesis gives back: audio chunks as they are decoded (:class:`SpeechStream`), or the
whole utterance (:class:`Audio`)."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lyre.core.session import CANCELLED, FINISHED, ChunkEvent, DoneEvent, Session
from lyre.core.stats import SessionMetrics
from lyre.errors import ServiceUnavailable, SynthesisCancelled, SynthesisFailed, SynthesisTimeout
from lyre.model import orpheus
from lyre.service.shaping import Shaping, to_int16
from lyre.service.timing import Timeline

if TYPE_CHECKING:
    from lyre.trust.audit import AuditEntry


@dataclass
class AudioChunk:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    offset_samples: int  # of pcm[0] in the whole utterance
    index: int
    elapsed_ms: float  # request received -> this chunk delivered
    late: bool  # delivered after the audio before it had finished playing
    segment: int = 0  # which of its synthesis' text segments it is audio of
    segment_end: bool = False  # the last chunk of that segment
    silence_before: int = 0  # samples of SSML silence (<break>) at its start, before its segment's speech
    silence_after: int = 0  # and at its end, after it

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


@dataclass
class Audio:
    pcm: np.ndarray  # int16 mono
    sample_rate: int
    metrics: SessionMetrics | None = None  # ttfb_ms, tokens, audio_seconds, real_time_factor, ...

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.sample_rate


class _Ending:
    """How a stream ends, shared by the stream and its finalizer (which must not hold the stream):
    once, with its audit row recorded by the stream that owns it, and the engine told when it
    is the caller who ends it."""

    def __init__(self, cancel: Callable[[], None], audit: AuditEntry | None, owns_audit: bool):
        self.cancel, self.audit, self.owns_audit = cancel, audit, owns_audit
        self.closed = False

    def end(self, outcome: str, reason: str | None) -> None:
        """The engine ended it (its last event came)."""
        self.closed = True
        if self.audit is not None and self.owns_audit:
            self.audit.finish(outcome, reason)

    def abandon(self) -> None:
        """The caller ends it early: the engine frees its slot at the next step."""
        if not self.closed:
            self.cancel()
            self.end(CANCELLED, "cancelled")


class SpeechStream:
    """Async iterator over one utterance's :class:`AudioChunk` s; ``metrics`` is set at the end.
    ``closed`` says it has ended. Leaving the loop early (break, exception, :meth:`aclose`,
    ``async with`` around it) cancels the synthesis and frees its slot; so does dropping the
    stream without closing it (its finalizer does what :meth:`cancel` does).

    Every chunk is watermarked (``mark``: the session's stateful watermarker, or None) and hashed
    into the audit entry; the stream that owns its entry records it when it ends (an utterance's
    pieces share the utterance's entry, which the utterance records).

    ``timeline`` places its text segments in its audio (:mod:`lyre.service.timing`; ``text``: the
    caller's text, which its offsets refer to); an utterance's pieces have none (the utterance's own
    timeline places them)."""

    def __init__(self, session: Session, events: asyncio.Queue, cancel: Callable[[], None],
                 audit: AuditEntry | None = None, owns_audit: bool = True,
                 mark: Callable[[np.ndarray], np.ndarray] | None = None, text: str | None = None):
        self._session, self._events, self._mark = session, events, mark
        self._audit = audit
        self.session_id = session.session_id
        self.segment_texts = [seg.text for seg in session.segments]
        self.segment_places = [seg.places for seg in session.segments]  # (SSML: each character's offset)
        self._shaping = Shaping(session.segments)
        self._samples = 0  # audio handed out (silence and stretches included)
        self._index = 0
        self._done: DoneEvent | None = None  # the end, held back while a last chunk of silence goes out first
        self.timeline: Timeline | None = None
        if text is not None:
            self.timeline = Timeline()
            self.timeline.add_text(text)
            for i, (piece, places) in enumerate(zip(self.segment_texts, self.segment_places, strict=True)):
                self.timeline.expect(i, piece, places)
        self.metrics: SessionMetrics | None = None
        self._ending = _Ending(cancel, audit, owns_audit)
        weakref.finalize(self, self._ending.abandon).atexit = False  # not at interpreter exit: nothing to free

    @property
    def closed(self) -> bool:
        return self._ending.closed

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self.closed:
            raise StopAsyncIteration
        if self._done is not None:
            ev = self._done
        else:
            try:
                ev = await self._events.get()
            except BaseException:
                self.cancel()
                raise
        if isinstance(ev, ChunkEvent):
            self._session.consumed_samples += len(ev.pcm)
            pcm, before, after = self._shaping.chunk(ev)
            return await self._out(pcm, ev.segment, ev.segment_end, ev.late, before, after)
        if ev.outcome == FINISHED and self._done is None:
            tail, silence = self._shaping.finish()
            if len(tail):  # (a stretch's last audio, the silence after the last segment)
                self._done = ev
                last = len(self.segment_texts) - 1
                return await self._out(tail, last, True, False, 0, silence)
        self._done = None
        self.metrics = ev.metrics
        if self.timeline is not None and ev.outcome == FINISHED:
            self.timeline.finish()
        self._ending.end(ev.outcome, ev.metrics.stop_reason if ev.outcome == FINISHED else ev.reason)
        if ev.outcome == FINISHED:
            raise StopAsyncIteration
        if ev.outcome == CANCELLED and ev.reason == "shutdown":
            raise ServiceUnavailable("the service shut down before this synthesis finished")
        if ev.outcome == CANCELLED and ev.reason == "timeout":
            raise SynthesisTimeout("synthesis made no progress (no audio generated or read) for scheduler.session_timeout_s")
        if ev.outcome == CANCELLED:
            raise SynthesisCancelled(f"synthesis was cancelled ({ev.reason})", reason=ev.reason)
        raise SynthesisFailed(ev.reason or "synthesis failed")

    async def _out(self, pcm: np.ndarray, segment: int, end: bool, late: bool, before: int, after: int) -> AudioChunk:
        """A chunk as it goes out: watermarked, audited, placed on the timeline."""
        pcm = to_int16(pcm if self._mark is None else self._mark(pcm))
        if self._audit is not None:
            await self._audit.recorded()  # no audio goes out before its audit row is written
            self._audit.add_pcm(pcm)
        if self.timeline is not None:
            self.timeline.place(segment, len(pcm), end, before, after)
        chunk = AudioChunk(pcm=pcm, sample_rate=orpheus.SAMPLE_RATE, offset_samples=self._samples, index=self._index,
                           elapsed_ms=1000 * (time.monotonic() - self._session.created), late=late, segment=segment,
                           segment_end=end, silence_before=before, silence_after=after)
        self._samples += len(pcm)
        self._index += 1
        return chunk

    def cancel(self) -> None:
        """Stop now: the engine frees the slot at its next step; iterating again ends at once."""
        self._ending.abandon()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> SpeechStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()
