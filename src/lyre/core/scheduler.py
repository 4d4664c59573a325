"""The scheduler: sessions' lifecycle, the admission queue, the per-step batch order, session endings.

Only the engine thread calls :class:`Scheduler`; the asyncio side talks to it through the
:class:`~lyre.core.admission.AdmissionGate` (an immediate, bounded admission decision) and messages,
and receives events through each session's ``sink``.

``Scheduler.step()`` reads as: expire (cancels, stalled clients, sessions without progress) ->
admit (pending sessions into free KV slots, shared fairly across accounts by
:class:`~lyre.core.fair.FairQueue`, each account within its ``max_sessions``; the engine's ``add``
says when no slot is free) ->
engine step (in the order the policy gives; a session whose frames wait for the codec sits out) ->
route tokens into each segment's parser and codec stream -> audio (the
:class:`~lyre.core.pipeline.AudioPipeline` decodes and delivers due chunks).

Session-ending rules measure what they mean. A client is a slow consumer only when it is more
than ``consumer_timeout_s`` behind its listener's clock (it read less audio than a real-time
player would have played), or read nothing for that long while behind it; one reading at playback
speed is never cut off, however far ahead the server is, because a session whose client holds
``max_buffer_s`` of unread audio stops generating (backpressure) instead of piling audio up.
``session_timeout_s`` counts time without progress (no token generated, no audio read), not age.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from lyre.config import SchedulerConfig
from lyre.core.admission import AdmissionGate
from lyre.core.fair import FairQueue
from lyre.core.lanes import EVICTED, BatchLane, split
from lyre.core.pipeline import AudioPipeline
from lyre.core.policy import POLICIES, Policy
from lyre.core.session import ACTIVE, CANCELLED, ENDED, FAILED, FINISHED, PENDING, DoneEvent, Session
from lyre.core.stats import (
    STOP_REASONS,
    AccountLoad,
    KVCacheStats,
    SchedulerStats,
    SessionMetrics,
    StatsSnapshot,
    worst_stop,
)
from lyre.engine.base import TokenDelta, TokenEngine
from lyre.family import ORPHEUS, Family

log = logging.getLogger("lyre.scheduler")

OUTCOME_LABELS = {"cancelled", "timeout", "slow_consumer", "shutdown", "delivery_failed"}
LOOP_LATE_S = 0.5  # the event loop's heartbeat older than this: it is late writing audio, listeners' clocks pause


class Scheduler:
    def __init__(
        self,
        cfg: SchedulerConfig,
        engine: TokenEngine,
        audio: AudioPipeline,
        gate: AdmissionGate,
        clock: Callable[[], float] = time.monotonic,
        metrics: Any = None,
        family: Family = ORPHEUS,
    ):
        self.cfg = cfg
        self.family = family
        self.engine = engine
        self.audio = audio
        self.gate = gate
        self.clock = clock
        self.metrics = metrics
        self.policy: Policy = POLICIES[cfg.policy](cfg)
        limits = gate.limits
        # the admission queue, fair across accounts by their weights
        self.pending = FairQueue((lambda account: limits(account).weight) if limits else (lambda account: 1.0))
        self._slots_allowed = (lambda account: limits(account).max_sessions) if limits else (lambda account: 1 << 30)
        self.active: dict[str, Session] = {}  # live sessions holding a KV slot
        # batch items' sessions (lyre.core.lanes): waiting, or holding a slot
        self.batch = BatchLane(cfg.batch_live_slack_s, cfg.max_buffer_s)
        self.active_by_account: Counter[str] = Counter()
        self._by_request: dict[str, tuple[Session, int]] = {}
        self._order = itertools.count()
        self.step_count = 0
        self.total_sessions = 0
        self.total_ended = 0
        self.snapshot: StatsSnapshot | None = None  # published after every step
        self.closed: tuple[str, str] | None = None  # shut down: the outcome and reason of any later session
        # when the event loop that writes audio to clients last beat (written by it; on ``clock``'s scale);
        # None: no loop watched (a library caller that reads in its own time)
        self.loop_beat: float | None = None
        self.publish()

    # --- messages from the consumer side (delivered on the engine thread) -----------------------

    def submit(self, session: Session) -> None:
        """Queue an admitted session (the gate has already counted it); after shutdown, end it at once."""
        session.order = next(self._order)
        self.total_sessions += 1
        if self.closed:
            self._end(session, *self.closed, self.clock())
            return
        if session.batch:
            self.batch.waiting.append(session)
        else:
            self.pending.append(session)

    def cancel(self, session_id: str, reason: str = "cancelled") -> None:
        for s in [*self.pending, *self.batch.sessions()]:
            if s.session_id == session_id:
                s.cancel_reason = reason
        if session_id in self.active:
            self.active[session_id].cancel_reason = reason

    def has_work(self) -> bool:
        return bool(self.pending or self.active or self.batch)

    # --- the step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """One round; True when anything moved (tokens, audio, admissions, endings)."""
        now = self.clock()
        before = (self.total_ended, len(self.pending))
        self._expire(now)
        self._admit()
        live, batch = split({s: rid for s, rid in self._generating().items() if not self.audio.backlogged(s)})
        order = [live[s] for s in self.policy.decode_order(list(live), self.step_count, now)]
        # the batch lane runs (decodes, prefills, gets codec rounds) only while every live session has audio in hand
        lane_runs = self.batch.may_decode(list(self.active.values()), self.policy.is_new, now)
        if batch and lane_runs:
            order += [batch[s] for s in self.batch.seats(batch, len(order), self.cfg.max_batch_size, self.step_count)]
        t0 = time.perf_counter()
        deltas = self.engine.step(order) if self.active or self.engine.has_work() else []
        self._route(deltas, now)
        now = self.clock()
        audio = self.audio.finish([*self.active.values(), *self.batch.active.values()], now, batch=lane_runs)
        for s, why in audio.failed:
            self._end(s, FAILED, why, now)
        for s in audio.finished:
            self._end(s, FINISHED, None, now)
        self.step_count += 1
        if self.metrics is not None and deltas:
            self.metrics.observe_step(time.perf_counter() - t0, sum(1 for d in deltas if d.token_ids))
        return bool(deltas) or audio.busy or before != (self.total_ended, len(self.pending))

    def publish(self) -> None:
        """Replace ``snapshot`` (a frozen :class:`StatsSnapshot`); other threads read only this."""
        e = self.engine.stats()
        waiting = self.pending.waiting()
        if self.metrics is not None:
            self.metrics.set_load(len(self.active), len(self.pending), e.active, self.utilisation)
            self.metrics.set_engine(e.extra)
            self.metrics.set_prompts(e.prompt_tokens, e.prefilled_tokens, e.extra)
            self.metrics.set_codec(self.audio.codec.counters)
            self.metrics.set_accounts(self.active_by_account, waiting)
            self.metrics.set_lanes(len(self.active), len(self.batch.active))
        self.snapshot = StatsSnapshot(
            scheduler=SchedulerStats(
                total_sessions=self.total_sessions,
                active_sessions=len(self.active),
                pending_sessions=len(self.pending),
                max_concurrent=self.cfg.max_concurrent_sessions,
                policy=self.cfg.policy,
                throttled_sessions=sum(s.throttled for s in self.active.values()),
                batch_sessions=len(self.batch.active),
                batch_waiting=len(self.batch.waiting),
            ),
            kv_cache=KVCacheStats(used_slots=e.active, free_slots=e.capacity - e.active),
            engine=e,
            codec=self.audio.codec.stats(),
            capacity_utilisation=self.utilisation,
            accounts={a: AccountLoad(self.active_by_account.get(a, 0), waiting.get(a, 0))
                      for a in {*self.active_by_account, *waiting}},
        )

    @property
    def utilisation(self) -> float:
        """Active + pending sessions over the KV slots (max_concurrent_sessions): 1 = every slot busy;
        above 1, callers wait. The figure to autoscale on."""
        return (len(self.active) + len(self.pending)) / self.cfg.max_concurrent_sessions

    def shutdown(self, outcome: str = CANCELLED, reason: str = "shutdown") -> None:
        """End every session (the service is closing, or the loop failed) and drain the engine. A
        session submitted later ends at once with the same outcome reason."""
        self.closed = (outcome, reason)
        now = self.clock()
        for s in [*self.pending, *self.active.values(), *self.batch.sessions()]:
            self._end(s, outcome, reason, now)
        self.pending.clear()
        try:
            while self.engine.has_work():
                self.engine.step()
        finally:  # the codec and the engine are closed whatever failed above (an executor left open can hang the exit)
            try:
                self.audio.shutdown()
                self.publish()
            finally:
                if hasattr(self.engine, "close"):
                    self.engine.close()

    # --- expire ---------------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        for s in list(self.pending):
            reason = s.cancel_reason or ("timeout" if now - s.created > self.cfg.session_timeout_s else None)
            if reason:
                self.pending.remove(s)
                self._end(s, CANCELLED, reason, now)
        for s in self.batch.sessions():  # (no listener: no timeout, never a slow consumer)
            s.throttled = s.unread_seconds > self.cfg.max_buffer_s  # its writer is behind: it waits for it
            if s.cancel_reason:
                self._end(s, CANCELLED, s.cancel_reason, now)
        late = self.loop_beat is not None and now - self.loop_beat > LOOP_LATE_S
        for s in list(self.active.values()):
            s.tick(now, server_late=late)
            s.throttled = s.unread_seconds > self.cfg.max_buffer_s
            reason = s.cancel_reason
            if reason is None and now - s.last_progress() > self.cfg.session_timeout_s:
                reason = "timeout"
            if reason is None and s.slow_consumer(now, self.cfg.consumer_timeout_s):
                reason = "slow_consumer"
                log.info("session %s: slow consumer: %.1f s behind its listener's clock, %.1f s unread, last read "
                         "%.1f s ago, audio waiting for %.1f s%s", s.session_id, s.behind_s(), s.unread_seconds,
                         now - s.last_read_at, now - (s.unread_since or now), " (throttled)" if s.throttled else "")
            if reason:
                self._end(s, CANCELLED, reason, now)

    # --- admit ----------------------------------------------------------------------------------

    def _admit(self) -> None:
        """Give free KV slots to, in turn: continuations (no gap mid-stream), pending sessions (fair
        across accounts, each below its quota of slots; in order within one), then the next segment's
        prefill ahead of time where a slot is spare (its decoding waits). What the engine has no slot
        for stays where it is and is tried at a later step."""
        for s in [*self.active.values(), *self.batch.active.values()]:
            k = _next_unsubmitted(s)
            if k is not None and s.segments[k - 1].done_generating:
                self._submit_segment(s, k)
        while self.pending and len(self.active) < self.engine.capacity:
            s = self.pending.next(lambda account: self.active_by_account[account] < self._slots_allowed(account))
            if s is None:
                break  # every waiting account holds its quota of slots (accounts.max_sessions)
            if not self._submit_segment(s, 0) and s.status == PENDING:
                break  # no free slot: it stays first in line
            self.pending.admitted(s)
            if s.status == PENDING:
                s.status = ACTIVE
                self.active[s.session_id] = s
                self.active_by_account[s.account] += 1
        waiting = self._live_waiting()  # (live sessions a slot is wanted for: the lane yields to them)
        self._evict_for_live(waiting)
        stats = self.engine.stats()
        spare = self.engine.capacity - stats.active - stats.waiting
        for s in list(self.active.values()):
            k = _next_unsubmitted(s)
            one_ahead = k is not None and (k < 2 or s.segments[k - 2].done_generating)
            # look-ahead one segment, only into spare slots beyond those reserved for new sessions
            if one_ahead and spare > self.cfg.reserved_slots and self._submit_segment(s, k):
                spare -= 1
        if not any(self.policy.is_new(s) for s in self.active.values()) and not waiting:
            # (no batch prefill beside a first audio; no slot taken that a live session waits for)
            self.batch.admit(self.engine, self.cfg.reserved_slots, lambda s: self._submit_segment(s, 0))

    def _evict_for_live(self, waiting: int) -> None:
        """``waiting`` live sessions wait with room in their accounts' quotas but no slot is free: evict as
        many batch sessions (their slots are free at the next engine step)."""
        if waiting and self.batch.active:
            now = self.clock()
            self.batch.evict(waiting, lambda victim: self._end(victim, CANCELLED, EVICTED, now))

    def _live_waiting(self) -> int:
        """Pending live sessions whose accounts have room for them in their max_sessions (the others
        wait for their own account's sessions, not for a slot)."""
        return self.pending.with_room(self.active_by_account, self._slots_allowed)

    def _submit_segment(self, s: Session, k: int) -> bool:
        """Add segment ``k`` to the engine; False (nothing changed) when the engine has no free slot.
        A request the engine refuses as invalid fails the session (its status says so)."""
        seg = s.segments[k]
        rid = s.request_id(k)
        # continuations first (no gap mid-stream), then sessions still waiting for their first audio
        priority = -1 if s.batch else 2 if k > 0 else 1 if s.first_audio_at is None else 0  # (batch: prefilled last)
        try:
            if not self.engine.add(self.family.request(rid, seg.prompt, s.sampling, priority, seg.prefix_key,
                                                       seg.prefix_len)):
                return False
        except ValueError as e:  # the service validates first; this is the last line of defence
            self._end(s, FAILED, f"request refused by the engine: {e}", self.clock())
            return False
        except Exception as e:  # noqa: BLE001 - the engine failed on this request: it alone fails
            log.exception("engine.add failed for %s", rid)
            self._end(s, FAILED, f"the engine could not take the request: {type(e).__name__}: {e}", self.clock())
            return False
        seg.submitted = True
        seg.parser = self.family.new_parser()
        self.audio.open(seg)
        self._by_request[rid] = (s, k)
        return True

    def _generating(self) -> dict[Session, str]:
        """Each active session's generating segment's request id. A segment prefilled ahead of time
        waits until the segment before it has finished generating."""
        out: dict[Session, str] = {}
        for s in [*self.active.values(), *self.batch.active.values()]:
            k = next((i for i, seg in enumerate(s.segments) if not seg.done_generating), None)
            if k is not None and s.segments[k].submitted:
                out[s] = s.request_id(k)
        return out

    # --- route ----------------------------------------------------------------------------------

    def _route(self, deltas: list[TokenDelta], now: float) -> None:
        routed = 0
        for d in deltas:
            s, k = self._by_request.get(d.request_id, (None, None))
            if s is None:
                continue
            routed += len(d.token_ids)
            try:
                self._route_one(s, k, d, now)
            except Exception as e:  # noqa: BLE001 - its tokens could not be used: it alone fails
                log.exception("routing the tokens of %s failed", d.request_id)
                # _end cancels its requests: a KV slot it still holds is freed at the next engine step
                self._end(s, FAILED, f"its tokens could not be decoded: {type(e).__name__}: {e}", now)
        if self.metrics is not None and routed:
            self.metrics.tokens.inc(routed)  # (once a step: a counter's increment per delta cost ~1 us a session)

    def _route_one(self, s: Session, k: int, d: TokenDelta, now: float) -> None:
        """One delta into its segment's parser and codec stream."""
        seg = s.segments[k]
        if d.token_ids:
            if k == 0 or all(earlier.done_generating for earlier in s.segments[:k]):
                s.last_run_step = self.step_count  # it decoded (a look-ahead prefill does not count)
            s.tokens += len(d.token_ids)
            s.last_token_at = now
            if s.first_token_at is None:
                s.first_token_at = now
            frames = seg.parser.feed(d.token_ids)
            if frames:  # (a frame every 7 tokens: most deltas complete none)
                seg.decoder.push(frames)
        if d.finished:
            del self._by_request[d.request_id]
            if d.finish_reason == "error":
                self._end(s, FAILED, f"engine error: {d.error}", now)
            elif d.finish_reason in STOP_REASONS:
                seg.done_generating = True
                seg.stop = STOP_REASONS[d.finish_reason]
                seg.decoder.finish()

    # --- endings --------------------------------------------------------------------------------

    def _end(self, s: Session, status: str, reason: str | None, now: float) -> None:
        if s.status in ENDED:
            return
        s.status = status
        self.total_ended += 1
        if s.batch:
            self.batch.leave(s)
        elif self.active.pop(s.session_id, None) is not None:
            self.active_by_account[s.account] -= 1
            if not self.active_by_account[s.account]:
                del self.active_by_account[s.account]
        for k in range(len(s.segments)):
            rid = s.request_id(k)
            if rid in self._by_request:
                del self._by_request[rid]
                self.engine.cancel(rid)
        self.audio.close(s)
        duration = now - s.created
        if not s.batch:  # (batch sessions never passed the gate)
            self.gate.leave(s.account, duration if status == FINISHED else None)
        metrics = SessionMetrics(
            ttfb_ms=None if s.first_audio_at is None else 1000 * (s.first_audio_at - s.created),
            tokens=s.tokens,
            prompt_tokens=sum(len(seg.prompt) for seg in s.segments),
            audio_seconds=s.audio_seconds,
            elapsed_s=duration,
            real_time_factor=(duration / s.audio_seconds) if s.audio_seconds else None,
            chunks=s.chunks,
            late_chunks=s.late_chunks,
            segments=len(s.segments),
            stop_reason=functools.reduce(worst_stop, (seg.stop for seg in s.segments), None),
        )
        if self.metrics is not None and not s.batch:  # (the batch lane counts its items itself)
            # a bounded label: the known reasons, else the outcome (an error's text is not a label)
            self.metrics.sessions.labels(outcome=reason if reason in OUTCOME_LABELS else status).inc()
        s.deliver(DoneEvent(status, reason, metrics))


def _next_unsubmitted(s: Session) -> int | None:
    return next((i for i, seg in enumerate(s.segments) if not seg.submitted), None)
