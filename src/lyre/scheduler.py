"""Sessions and their scheduling: admission, per-step batch choice, timeouts, audio delivery.

A session moves pending -> active -> finished | cancelled | failed. Only the engine thread calls
:class:`Scheduler`; the asyncio side talks to it through :class:`AdmissionGate` (an immediate,
bounded admission decision) and messages, and receives events through each session's ``sink``.

``Scheduler.step()`` reads as: expire (timeouts, stalled consumers, cancels) -> admit (pending
sessions into free KV slots) -> engine step (in the order the policy gives the sessions) -> route
tokens into each segment's parser and stream decoder -> decode every due chunk in batched SNAC
calls -> deliver.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lyre import orpheus
from lyre.codec import SnacDecoder, StreamDecoder, StreamSettings
from lyre.config import SchedulerConfig
from lyre.engine.base import GenerationRequest, SamplingParams, TokenDelta, TokenEngine

log = logging.getLogger("lyre.scheduler")

PENDING, ACTIVE, FINISHED, CANCELLED, FAILED = "pending", "active", "finished", "cancelled", "failed"


# --------------------------------------------------------------------------------------------
# events a session's sink receives (on the engine thread; the sink forwards them)


@dataclass
class ChunkEvent:
    pcm: np.ndarray  # float32 samples at 24 kHz
    offset: int  # absolute sample offset of pcm[0] in the session's audio
    index: int  # 0, 1, 2, ...
    late: bool  # arrived after the audio before it had finished playing


@dataclass
class DoneEvent:
    outcome: str  # finished | cancelled | failed
    reason: str | None  # why it was cancelled or failed: cancelled, timeout, slow_consumer, engine error ...
    metrics: dict[str, Any]


# --------------------------------------------------------------------------------------------
# sessions


@dataclass
class Segment:
    prompt_ids: list[int]
    parser: orpheus.AudioTokenParser = field(default_factory=orpheus.AudioTokenParser)
    decoder: StreamDecoder | None = None
    submitted: bool = False
    done_generating: bool = False


@dataclass(eq=False)
class Session:
    """One synthesis request: its segments, tokens, status and delivery state.

    The scheduler changes ``status``; the consumer side only bumps ``consumed``.
    """

    session_id: str
    segments: list[Segment]
    sampling: SamplingParams
    sink: Callable[[ChunkEvent | DoneEvent], None]
    created: float
    order: int = 0
    status: str = PENDING
    current: int = 0  # segment whose audio is being emitted
    tokens: int = 0  # generated tokens over all segments
    last_run_step: int = -1
    first_token_at: float | None = None
    first_audio_at: float | None = None
    audio_samples: int = 0  # delivered
    chunks: int = 0  # delivered
    consumed: int = 0  # chunks the consumer has taken (written by the consumer side)
    stalled_since: float | None = None
    late_chunks: int = 0
    cancel_reason: str | None = None

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / orpheus.SAMPLE_RATE

    def slack(self, now: float) -> float:
        """Seconds of audio the listener holds beyond what has played (playback starts at the first
        audio); -inf before the first audio."""
        if self.first_audio_at is None:
            return float("-inf")
        return self.audio_seconds - (now - self.first_audio_at)

    def request_id(self, k: int) -> str:
        return f"{self.session_id}#{k}"


# --------------------------------------------------------------------------------------------
# admission


class Overloaded(Exception):
    def __init__(self, retry_after_s: float):
        super().__init__(f"the server is at capacity; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


class AdmissionGate:
    """Bounds sessions in the system (active + pending) and answers at once, from any thread."""

    def __init__(self, max_active: int, max_pending: int):
        self.max_active, self.max_pending = max_active, max_pending
        self._lock = threading.Lock()
        self._inside = 0
        self.mean_session_s = 1.0  # exponential mean of finished sessions' durations

    def enter(self) -> None:
        with self._lock:
            if self._inside >= self.max_active + self.max_pending:
                raise Overloaded(self.retry_after())
            self._inside += 1

    def leave(self, duration_s: float | None = None) -> None:
        with self._lock:
            self._inside -= 1
            if duration_s is not None:
                self.mean_session_s = 0.8 * self.mean_session_s + 0.2 * duration_s

    @property
    def inside(self) -> int:
        return self._inside

    def retry_after(self) -> float:
        """About when a place frees up: the queue ahead drains max_active sessions per mean session time."""
        waves = 1 + max(0, self._inside - self.max_active) / self.max_active
        return round(max(0.1, waves * self.mean_session_s), 1)


# --------------------------------------------------------------------------------------------
# batch policies: which active sessions decode this step when more are ready than max_batch_size


class Policy:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg

    def choose(self, sessions: list[Session], limit: int, step: int, now: float) -> list[Session]:
        """At most ``limit`` of ``sessions`` to decode this step."""
        if len(sessions) <= limit:
            return sessions
        return self.order(sessions, step, now)[:limit]

    def is_new(self, s: Session) -> bool:
        return s.tokens < self.cfg.ttfb_priority_tokens

    def order(self, sessions: list[Session], step: int, now: float) -> list[Session]:
        raise NotImplementedError


class FairPolicy(Policy):
    """Seed 004: sessions that have waited max_wait_steps first (the starvation bound), then new
    sessions (fewer than ttfb_priority_tokens), then the rest round-robin."""

    def order(self, sessions, step, now):
        def key(s: Session):
            starving = step - s.last_run_step > self.cfg.max_wait_steps
            return (not starving, not self.is_new(s), s.last_run_step, s.order)

        return sorted(sessions, key=key)


class DeadlinePolicy(Policy):
    """New sessions first, then least playback slack (audio delivered minus time since the first
    audio): a session far ahead of its listener yields its turn to one about to run dry. A waiting
    session's slack shrinks as its listener plays, so nobody waits for ever."""

    def order(self, sessions, step, now):
        return sorted(sessions, key=lambda s: (not self.is_new(s), s.slack(now), s.order))


POLICIES = {"fair": FairPolicy, "deadline": DeadlinePolicy}


# --------------------------------------------------------------------------------------------
# the scheduler


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        engine: TokenEngine,
        codec: SnacDecoder,
        stream_settings: StreamSettings,
        gate: AdmissionGate,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
        overlap_codec: bool = False,
    ):
        self.cfg = cfg
        self.engine = engine
        self.codec = codec
        self.stream_settings = stream_settings
        self.gate = gate
        self.clock = clock
        self.metrics = metrics
        self.policy: Policy = POLICIES[cfg.policy](cfg)
        self.pending: deque[Session] = deque()
        self.active: dict[str, Session] = {}
        self._by_request: dict[str, tuple[Session, int]] = {}
        self._order = itertools.count()
        self.step_count = 0
        self.total_sessions = 0
        self.total_ended = 0
        self.snapshot: dict[str, Any] = {}
        self._planned: list = []
        self._overlap = ThreadPoolExecutor(1, thread_name_prefix="lyre-snac") if overlap_codec else None
        self.publish()

    # --- messages from the consumer side (delivered on the engine thread) -----------------------

    def submit(self, session: Session) -> None:
        """Queue an admitted session (the gate has already counted it)."""
        session.order = next(self._order)
        self.total_sessions += 1
        self.pending.append(session)

    def cancel(self, session_id: str, reason: str = "cancelled") -> None:
        for s in self.pending:
            if s.session_id == session_id:
                s.cancel_reason = reason
        if session_id in self.active:
            self.active[session_id].cancel_reason = reason

    def has_work(self) -> bool:
        return bool(self.pending or self.active)

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One round; True when anything moved (tokens, audio, admissions, endings)."""
        now = self.clock()
        before = (self.total_ended, len(self.pending))
        self._expire(now)
        self._admit()
        order = self._decode_order(now)
        t0 = time.perf_counter()
        if self._overlap is not None:
            # SNAC decodes last round's chunks on its own thread while the engine steps.
            jobs, self._planned = self._planned, []
            decoding = self._overlap.submit(self._decode, jobs) if jobs else None
            deltas = self.engine.step(order) if self.active or self.engine.has_work() else []
            self._route(deltas, now)
            chunks = self._deliver_audio(jobs, decoding.result(), self.clock()) if decoding else 0
            self._planned = self._plan_audio(self.clock())
        else:
            deltas = self.engine.step(order) if self.active or self.engine.has_work() else []
            self._route(deltas, now)
            jobs = self._plan_audio(self.clock())
            chunks = self._deliver_audio(jobs, self._decode(jobs), self.clock()) if jobs else 0
        self.step_count += 1
        if self.metrics is not None and deltas:
            self.metrics.observe_step(time.perf_counter() - t0, sum(1 for d in deltas if d.token_ids))
        return bool(deltas or chunks or self._planned) or before != (self.total_ended, len(self.pending))

    def publish(self) -> None:
        """Replace ``snapshot`` (seed 004's /v1/stats shape); other threads read only this."""
        e = self.engine.stats()
        if self.metrics is not None:
            self.metrics.set_load(len(self.active), len(self.pending), e.active)
            self.metrics.set_engine(e.extra)
        self.snapshot = {
            "scheduler": {
                "total_sessions": self.total_sessions,
                "active_sessions": len(self.active),
                "pending_sessions": len(self.pending),
                "max_concurrent": self.cfg.max_concurrent_sessions,
                "policy": self.cfg.policy,
            },
            "kv_cache": {"used_slots": e.active, "free_slots": e.capacity - e.active},
            "total_tokens": e.total_tokens,
            "total_batches": e.total_steps,
            "engine": {"backend": e.backend, "kv_cache_bytes": e.kv_cache_bytes, **e.extra},
        }

    def shutdown(self, outcome: str = CANCELLED, reason: str = "shutdown") -> None:
        """End every session (the service is closing, or the loop failed) and drain the engine."""
        now = self.clock()
        for s in list(self.pending) + list(self.active.values()):
            self._end(s, outcome, reason, now)
        self.pending.clear()
        while self.engine.has_work():
            self.engine.step()
        if self._overlap is not None:
            self._overlap.shutdown()
        self.publish()
        if hasattr(self.engine, "close"):
            self.engine.close()

    def _expire(self, now: float) -> None:
        for s in list(self.pending):
            reason = s.cancel_reason or ("timeout" if now - s.created > self.cfg.session_timeout_s else None)
            if reason:
                self.pending.remove(s)
                self._end(s, CANCELLED, reason, now)
        for s in list(self.active.values()):
            reason = s.cancel_reason
            if reason is None and now - s.created > self.cfg.session_timeout_s:
                reason = "timeout"
            if reason is None and s.chunks - s.consumed >= self.cfg.output_queue_chunks:
                s.stalled_since = s.stalled_since if s.stalled_since is not None else now
                if now - s.stalled_since > self.cfg.consumer_timeout_s:
                    reason = "slow_consumer"
            elif reason is None:
                s.stalled_since = None
            if reason:
                self._end(s, CANCELLED, reason, now)

    def _admit(self) -> None:
        """Give free KV slots to, in turn: continuations (no gap mid-stream), pending sessions in
        order, then the next segment's prefill ahead of time where a slot is spare (its decoding
        waits). What the engine has no slot for stays where it is and is tried at a later step."""
        for s in list(self.active.values()):
            k = _next_unsubmitted(s)
            if k is not None and s.segments[k - 1].done_generating:
                self._submit_segment(s, k)
        while self.pending and len(self.active) < self.engine.capacity:
            s = self.pending[0]
            if not self._submit_segment(s, 0) and s.status == PENDING:
                break  # no free slot: it stays first in line
            self.pending.popleft()
            if s.status == PENDING:
                s.status = ACTIVE
                self.active[s.session_id] = s
        stats = self.engine.stats()
        spare = self.engine.capacity - stats.active - stats.waiting
        for s in list(self.active.values()):
            k = _next_unsubmitted(s)
            one_ahead = k is not None and (k < 2 or s.segments[k - 2].done_generating)
            # look-ahead one segment, only into spare slots beyond those reserved for new sessions
            if one_ahead and spare > self.cfg.reserved_slots and self._submit_segment(s, k):
                spare -= 1

    def _submit_segment(self, s: Session, k: int) -> bool:
        """Add segment ``k`` to the engine; False (nothing changed) when the engine has no free slot.
        A request the engine refuses as invalid fails the session (its status says so)."""
        seg = s.segments[k]
        rid = s.request_id(k)
        # continuations first (no gap mid-stream), then sessions still waiting for their first audio
        priority = 2 if k > 0 else 1 if s.first_audio_at is None else 0
        try:
            if not self.engine.add(GenerationRequest(rid, seg.prompt_ids, s.sampling, priority=priority)):
                return False
        except ValueError as e:  # the service validates first; this is the last line of defence
            self._end(s, FAILED, f"request refused by the engine: {e}", self.clock())
            return False
        seg.submitted = True
        seg.decoder = StreamDecoder(self.stream_settings)
        self._by_request[rid] = (s, k)
        return True

    def _decode_order(self, now: float) -> list[str]:
        """Request ids that may decode this step, most urgent first (the policy's order): each
        active session's generating segment. A segment prefilled ahead of time waits until the
        segment before it has finished generating."""
        generating: dict[Session, str] = {}
        for s in self.active.values():
            k = next((i for i, seg in enumerate(s.segments) if not seg.done_generating), None)
            if k is not None and s.segments[k].submitted:
                generating[s] = s.request_id(k)
        return [generating[s] for s in self.policy.order(list(generating), self.step_count, now)]

    # --- tokens in, audio out -------------------------------------------------------------------

    def _route(self, deltas: list[TokenDelta], now: float) -> None:
        for d in deltas:
            s, k = self._by_request.get(d.request_id, (None, None))
            if s is None:
                continue
            seg = s.segments[k]
            if d.token_ids:
                if all(earlier.done_generating for earlier in s.segments[:k]):
                    s.last_run_step = self.step_count  # it decoded (a look-ahead prefill does not count)
                s.tokens += len(d.token_ids)
                if s.first_token_at is None:
                    s.first_token_at = now
                if self.metrics is not None:
                    self.metrics.tokens.inc(len(d.token_ids))
                seg.decoder.push(seg.parser.feed(d.token_ids))
            if d.finished:
                del self._by_request[d.request_id]
                if d.finish_reason == "error":
                    self._end(s, FAILED, f"engine error: {d.error}", now)
                elif d.finish_reason in ("stop", "length"):
                    seg.done_generating = True
                    seg.decoder.finish()

    def _plan_audio(self, now: float) -> list[tuple[Session, Segment, Any]]:
        """Decode jobs due now (at most one per session); sessions with all audio out end here."""
        jobs = []
        for s in list(self.active.values()):
            while s.current < len(s.segments):  # skip past segments whose audio is all out
                seg = s.segments[s.current]
                job = seg.decoder.plan() if seg.decoder is not None else None
                if job is not None:
                    jobs.append((s, seg, job))
                    break
                if seg.done_generating and seg.decoder.all_out:
                    s.current += 1
                    continue
                break
            if s.current >= len(s.segments):
                self._end(s, FINISHED, None, now)
        return jobs

    def _decode(self, jobs: list) -> list[np.ndarray] | Exception:
        try:
            return self.codec.decode([j for _, _, j in jobs])
        except Exception as e:  # a failed decode fails the sessions in it, not the loop
            log.exception("audio decode failed")
            return e

    def _deliver_audio(self, jobs: list, audio: list[np.ndarray] | Exception, now: float) -> int:
        if isinstance(audio, Exception):
            for s, _, _ in jobs:
                self._end(s, FAILED, f"audio decode failed: {type(audio).__name__}: {audio}", now)
            return 0
        for (s, seg, job), window in zip(jobs, audio, strict=True):
            if s.status != ACTIVE:
                continue  # ended while its audio was decoding
            pcm = seg.decoder.complete(job, window)
            self._deliver(s, pcm, now, segment_start=job.start == 0, segment_end=seg.decoder.finished and seg.decoder.all_out)
        return len(jobs)

    def _deliver(self, s: Session, pcm: np.ndarray, now: float, segment_start: bool, segment_end: bool) -> None:
        if len(s.segments) > 1:
            _fade_segment_edges(pcm, s.current > 0 and segment_start, s.current < len(s.segments) - 1 and segment_end)
        late = s.first_audio_at is not None and now > s.first_audio_at + s.audio_seconds
        if s.first_audio_at is None:
            s.first_audio_at = now
            if self.metrics is not None:
                self.metrics.ttfb.observe(now - s.created)
        ev = ChunkEvent(pcm=pcm, offset=s.audio_samples, index=s.chunks, late=late)
        s.audio_samples += len(pcm)
        s.chunks += 1
        s.late_chunks += late
        if self.metrics is not None:
            self.metrics.audio_seconds.inc(len(pcm) / orpheus.SAMPLE_RATE)
            if late:
                self.metrics.late_chunks.inc()
        s.sink(ev)
        if s.current == len(s.segments) - 1 and segment_end:
            self._end(s, FINISHED, None, now)

    def _end(self, s: Session, status: str, reason: str | None, now: float) -> None:
        if s.status in (FINISHED, CANCELLED, FAILED):
            return
        s.status = status
        self.total_ended += 1
        self.active.pop(s.session_id, None)
        for k in range(len(s.segments)):
            rid = s.request_id(k)
            if rid in self._by_request:
                del self._by_request[rid]
                self.engine.cancel(rid)
        duration = now - s.created
        self.gate.leave(duration if status == FINISHED else None)
        metrics = {
            "ttfb_ms": None if s.first_audio_at is None else 1000 * (s.first_audio_at - s.created),
            "tokens": s.tokens,
            "prompt_tokens": sum(len(seg.prompt_ids) for seg in s.segments),
            "audio_seconds": s.audio_seconds,
            "elapsed_s": duration,
            "real_time_factor": (duration / s.audio_seconds) if s.audio_seconds else None,
            "chunks": s.chunks,
            "late_chunks": s.late_chunks,
            "segments": len(s.segments),
        }
        if self.metrics is not None:
            self.metrics.sessions.labels(outcome=reason or status).inc()
        s.sink(DoneEvent(status, reason, metrics))


def _next_unsubmitted(s: Session) -> int | None:
    return next((i for i, seg in enumerate(s.segments) if not seg.submitted), None)


def _fade_segment_edges(pcm: np.ndarray, fade_in: bool, fade_out: bool, n: int = 240) -> None:
    """10 ms fades where one segment's audio meets the next, so the join has no click or gap."""
    n = min(n, len(pcm))
    ramp = (np.arange(n, dtype=np.float32) + 0.5) / n
    if fade_in:
        pcm[:n] *= ramp
    if fade_out:
        pcm[-n:] *= ramp[::-1]
