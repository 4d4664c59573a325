"""The audio half of a scheduler step: plan due chunks, decode them in batched codec calls, deliver.

:class:`AudioPipeline` owns the codec and every segment's codec stream. Each round it plans the
chunks that are due, most urgent first (least playback slack; sessions still waiting for their
first audio before all), and decodes as many as fit in ``codec.max_round_ms`` at the recent cost
per frame (at least one; with a codec that runs ``parallel`` calls at once, that much on each of
its lanes) — the rest stay due for the next round, so a burst of flushes never
stalls the token engine, or a new session's first chunk, for long. With
``overlap`` the codec decodes on its own thread while the engine keeps stepping: the engine thread
hands it one round of jobs, steps on, and delivers that round's audio at the first step after it is
done (on CPU the engine and the codec then each have their own cores). The
listener's clock drives the chunks: a session's chunks grow with its slack (``every_flush_frames``,
doubling up to ``max_chunk_frames`` while the chunk is at most half the audio its listener holds),
so a session far ahead of its listener costs fewer, larger, cheaper calls; and a session whose
listener would run dry before its exact audio can follow gets what can be emitted at once —
provisional audio during a stream's warm-up only then, not on every frame. Segments of one session
are joined with 10 ms fades.

The pipeline tells the scheduler which sessions have all their audio out or failed to decode; the
scheduler ends them.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lyre.codec.base import StreamSettings
from lyre.core.fair import by_account
from lyre.core.session import ACTIVE, ChunkEvent, Segment, Session
from lyre.family import ORPHEUS, Family
from lyre.family.base import SAMPLE_RATE

log = logging.getLogger("lyre.pipeline")


@dataclass
class AudioOutcome:
    finished: list[Session] = field(default_factory=list)  # all audio out: end them
    failed: list[tuple[Session, str]] = field(default_factory=list)
    chunks: int = 0  # delivered this round
    busy: bool = False  # decode work was done or is in flight


Job = tuple[Session, Segment, Any]


class AudioPipeline:
    def __init__(self, codec: Any, settings: StreamSettings, max_round_s: float = 0.05, metrics: Any = None,
                 overlap: bool = False, first_chunk: str = "bridge", max_round_frames: int | None = None,
                 family: Family = ORPHEUS):
        self.codec = codec
        self.frame_samples, self.ids_per_frame = family.samples_per_frame, family.ids_per_frame
        self.ids_per_step = family.ids_per_step
        self.frame_s = family.samples_per_frame / SAMPLE_RATE  # audio seconds per frame
        self.first_chunk = first_chunk
        self.settings = settings
        self.max_round_s = max_round_s
        self.max_round_frames = max_round_frames  # a fixed cap instead (deterministic: tests)
        self.metrics = metrics
        self._overlap = ThreadPoolExecutor(1, thread_name_prefix="lyre-codec") if overlap else None
        self._inflight: tuple[list[Job], Future] | None = None
        self.round_s = 0.0  # recent decode time of a round (exponential mean)
        self.frame_cost_s = 0.0  # recent decode time per frame (exponential mean): what a round can hold
        # the same over rounds without batch frames: what a live session's next chunk will cost (batch rounds,
        # large and beside the batch lane's long steps, cost more a frame: a live first chunk would wait longer)
        self.live_frame_cost_s = 0.0
        self._rounds = 0  # rounds planned (the account served first rotates with it)

    # --- segments -------------------------------------------------------------------------------

    def open(self, seg: Segment) -> None:
        warm = {} if seg.codec_warmup is None else {"warm": seg.codec_warmup}
        seg.decoder = self.codec.new_stream(self.settings, **warm)

    def close(self, s: Session) -> None:
        """Free every codec state of ``s`` (it ended)."""
        for seg in s.segments:
            if seg.decoder is not None:
                seg.decoder.close()

    def chunk_frames(self, s: Session, now: float) -> int:
        """The chunk size for ``s``: the smallest while its listener holds little audio, doubling up to
        ``max_chunk_frames`` while a chunk is at most half of what it holds."""
        c, limit = self.settings.every_flush_frames, self.settings.max_chunk_frames
        held = s.slack(now) * s.tempo / self.frame_s  # frames the listener holds
        while c * 2 <= limit and c * 2 <= held / 2:
            c *= 2
        return c

    def backlogged(self, s: Session) -> bool:
        """More of ``s``'s frames wait for the codec than two chunks and the decoder's lookahead: its
        tokens are not needed until the codec catches up (generation yields to decoding)."""
        if s.current >= len(s.segments) or s.segments[s.current].decoder is None:
            return False
        stream = s.segments[s.current].decoder
        waiting = stream.frames_received - stream.emitted / self.frame_samples
        return waiting > 2 * self.settings.max_chunk_frames + 3

    def needs_audio(self, s: Session, stream: Any, now: float, sharing: int = 1) -> bool:
        """Must ``s``'s listener get audio now?

        - Its first audio: at once (``first_chunk: eager``), or (``bridge``) once a first chunk of
          the frames so far would last until the stream's exact audio can follow it at the session's
          pace (a frame comes no faster than it is generated, nor than the codec decodes it for the
          ``sharing`` sessions it serves) — a first chunk that runs dry is a stutter, worse than a
          later start — and at the latest after ``warmup_frames`` frames.
        - Later: when it would run dry before the next round could help (its slack is under one frame
          of generation plus a round of decoding), and — the last warm-up frame being the last chance
          for provisional audio — when its slack would not last until the exact audio passes what was
          emitted."""
        frame_s = self._frame_s(s)
        if frame_s is not None:  # a frame comes no faster than it is generated, nor than the codec (shared) decodes it
            # (the sessions share the codec's lanes; one session's call is never split)
            cost = self.frame_cost_s if s.batch else (self.live_frame_cost_s or self.frame_cost_s)
            frame_s = max(frame_s, cost * max(1.0, sharing / self.codec.parallel))
        slack = s.slack(now)
        if slack == float("-inf"):
            if self.first_chunk == "eager" or frame_s is None or stream.frames_received >= self.settings.warmup_frames:
                return True
            first = stream.frames_received * self.frame_samples - self.settings.holdback
            wait = (stream.frames_to_exact(first) + 1) * frame_s + self.round_s
            return first / SAMPLE_RATE / s.tempo >= wait  # (played tempo times faster)
        if frame_s is None or slack < frame_s + self.round_s:
            return True
        last_chance = stream.frames_received >= self.settings.warmup_frames
        return last_chance and slack < (stream.frames_to_exact() + 1) * frame_s + self.round_s

    def _frame_s(self, s: Session) -> float | None:
        """Seconds per frame at the session's pace of generation so far; None before two steps' ids."""
        if s.tokens < 2 * self.ids_per_step:
            return None
        return self.ids_per_frame * (s.last_token_at - s.first_token_at) / (s.tokens - self.ids_per_step)

    # --- the round ------------------------------------------------------------------------------

    def finish(self, sessions: list[Session], now: float, batch: bool = True) -> AudioOutcome:
        """The audio half of a round. Without overlap: plan, decode and deliver now. With overlap: if
        the codec thread is still decoding, return at once (the engine keeps stepping); else deliver
        what it decoded, then plan the next jobs and hand them to it."""
        out = AudioOutcome()
        if self._overlap is None:
            jobs = self._plan(sessions, now, out, batch)
            if jobs:
                self._deliver(jobs, self._decode(jobs), now, out)
                out.busy = True
            return out
        if self._inflight is not None:
            jobs, future = self._inflight
            if not future.done():
                return out
            self._inflight = None
            self._deliver(jobs, future.result(), now, out)
            out.busy = True
        jobs = self._plan(sessions, now, out, batch)
        if jobs:
            self._inflight = (jobs, self._overlap.submit(self._decode, jobs))
        return out

    def wait(self) -> None:
        """With overlap: block until the codec thread's current decode is done."""
        if self._inflight is not None:
            self._inflight[1].result()

    def shutdown(self) -> None:
        if self._overlap is not None:
            self._overlap.shutdown()
        self.codec.close()

    def _plan(self, sessions: list[Session], now: float, out: AudioOutcome, batch: bool = True) -> list[Job]:
        """Due jobs (at most one per session), least slack first with accounts in turn, within the
        round's budget."""
        due: list[Job] = []
        live = sum(not s.batch for s in sessions)  # (the codec serves live jobs first: batch ones share what is left)
        for s in sessions:
            if s.batch and not batch:  # (not even planned: a round kept for live audio stays short)
                continue
            try:
                job = self._due(s, now, len(sessions) if s.batch else live)
            except Exception as e:  # noqa: BLE001 - this stream's bookkeeping failed: it alone fails
                log.exception("planning the audio of %s failed", s.session_id)
                out.failed.append((s, f"audio planning failed: {type(e).__name__}: {e}"))
                continue
            if job is not None:
                due.append(job)
            elif s.current >= len(s.segments):
                out.finished.append(s)
        due.sort(key=lambda j: (j[0].slack(now), j[0].order))
        self._rounds += 1  # each account's most urgent first, accounts in turn (the first one rotating);
        # every live job before any batch job (lyre.core.lanes); none at all in a round the scheduler
        # keeps for live audio (``batch`` false: a live session waits for its first audio or runs low)
        due = [j for lane in (False, True)
               for j in by_account([j for j in due if j[0].batch == lane], lambda j: j[0].account, self._rounds)]
        # per lane: a codec that runs ``parallel`` calls at once decodes that many jobs in a round's time
        budget = self.max_round_frames or (self.max_round_s / self.frame_cost_s if self.frame_cost_s else float("inf"))
        lanes = [0] * self.codec.parallel  # frames planned on each
        jobs = []
        for job in due:
            cost, lane = job[2].cost, min(range(len(lanes)), key=lanes.__getitem__)
            if lanes[lane] and lanes[lane] + cost > budget:
                continue  # stays due: planned again next round
            jobs.append(job)
            lanes[lane] += cost
        return jobs

    def _due(self, s: Session, now: float, sessions: int) -> Job | None:
        """The session's due job, moving past segments whose audio is all out; None when none is due."""
        while s.current < len(s.segments):
            seg = s.segments[s.current]
            job = (seg.decoder.plan(self.chunk_frames(s, now), self.needs_audio(s, seg.decoder, now, sessions))
                   if seg.decoder is not None else None)
            if job is not None:
                return s, seg, job
            if not (seg.done_generating and seg.decoder.all_out):
                return None
            s.current += 1
        return None

    def _decode(self, jobs: list[Job]) -> list[Any] | Exception:
        t0 = time.perf_counter()
        try:
            return self.codec.decode([j for _, _, j in jobs])
        except Exception as e:  # a failed decode fails the sessions in it, not the loop
            log.exception("audio decode failed")
            return e
        finally:
            spent = time.perf_counter() - t0
            self.codec.counters.decode_s += spent
            frames = sum(job.cost for _, _, job in jobs)
            lanes = min(self.codec.parallel, max(1, len(jobs)))  # (a lane's time per frame)
            per_frame = spent * lanes / max(1, frames)
            self.frame_cost_s = 0.7 * self.frame_cost_s + 0.3 * per_frame
            if not any(s.batch for s, _, _ in jobs):  # (what a live session waits: a round the lane sits out)
                self.round_s = 0.7 * self.round_s + 0.3 * spent
                # (from its first sample: a mean that starts at 0 would promise cheap frames for a while)
                self.live_frame_cost_s = 0.7 * self.live_frame_cost_s + 0.3 * per_frame if self.live_frame_cost_s \
                    else per_frame

    def _deliver(self, jobs: list[Job], results: list[Any] | Exception, now: float, out: AudioOutcome) -> None:
        if isinstance(results, Exception):
            why = f"audio decode failed: {type(results).__name__}: {results}"
            out.failed += [(s, why) for s, _, _ in jobs if s.status == ACTIVE]
            return
        for (s, seg, job), result in zip(jobs, results, strict=True):
            if s.status != ACTIVE:
                continue  # ended while its audio was decoding
            if isinstance(result, Exception):  # its call failed (the others in the round did not)
                out.failed.append((s, f"audio decode failed: {type(result).__name__}: {result}"))
                continue
            starts = seg.decoder.emitted == 0
            try:
                pcm = seg.decoder.complete(job, result)
            except Exception as e:  # noqa: BLE001 - this stream's bookkeeping failed: it alone fails
                log.exception("completing the audio of %s failed", s.session_id)
                out.failed.append((s, f"audio decode failed: {type(e).__name__}: {e}"))
                continue
            ends = seg.decoder.finished and seg.decoder.all_out
            if len(pcm):
                self._send(s, pcm, now, starts, ends)
                out.chunks += 1
            if ends and s.current == len(s.segments) - 1:
                out.finished.append(s)

    def _send(self, s: Session, pcm: np.ndarray, now: float, segment_start: bool, segment_end: bool) -> None:
        if len(s.segments) > 1:
            _fade_segment_edges(pcm, s.current > 0 and segment_start, s.current < len(s.segments) - 1 and segment_end)
        late = s.clock_at is not None and s.playing_at(now) > s.audio_seconds
        if s.first_audio_at is None:
            s.start_clock(now)
            if self.metrics is not None and not s.batch:
                self.metrics.ttfb.observe(now - s.created)
        ev = ChunkEvent(pcm=pcm, offset=s.audio_samples, index=s.chunks, late=late, segment=s.current,
                        segment_end=segment_end)
        if s.consumed_samples >= s.audio_samples:  # its client had read everything: this is new to wait for
            s.unread_since = now
        s.audio_samples += len(pcm)
        s.chunks += 1
        s.late_chunks += late
        if self.metrics is not None:
            self.metrics.audio_seconds.inc(len(pcm) / SAMPLE_RATE)
            if late:
                self.metrics.late_chunks.inc()
        s.deliver(ev)


def _fade_segment_edges(pcm: np.ndarray, fade_in: bool, fade_out: bool, n: int = 240) -> None:
    """10 ms fades where one segment's audio meets the next, so the join has no click or gap."""
    n = min(n, len(pcm))
    ramp = (np.arange(n, dtype=np.float32) + 0.5) / n
    if fade_in:
        pcm[:n] *= ramp
    if fade_out:
        pcm[-n:] *= ramp[::-1]
