"""``codec.mode: stream``: each frame decoded once by the exact streaming decoder, batched across sessions.

An :class:`ExactStream` (one per generated segment) holds the segment's decoder state and plans
its chunks; a :class:`StreamCodec` runs the jobs of every session that flushes in the same round,
stacking the states of jobs with the same chunk length into one call.

Chunks. The exact audio trails the newest frame by the decoder's lag (~2.3 frames). The first
chunk is due after ``first_flush_frames``, long before any sample is exact. While at most
``warmup_frames`` frames exist and the listener would otherwise run dry before exact audio can
follow (the caller says so: ``need_audio``), the stream emits *provisional* audio: one offline
decode of all its frames so far (a *prefix decode* through :class:`OfflineSnac`: n frames cost n,
where finishing the streaming decoder early would cost n + 3), up to the newest frame minus a
short holdback (the first chunk always so, from however many frames the caller waited for, up to
``warmup_frames + max_chunk_frames``), the
held-back tail crossfaded into the next chunk. Its exact state is fed meanwhile as chunks become
due, and once its exact audio passes what was emitted it takes over with that crossfade, so only
the warm-up region differs from an offline decode. A listener that holds enough audio (a later
segment of a long text, a fast stream) gets no provisional chunk at all. At the end the stream is
finished with padding frames and every frame is emitted: total audio = frames x 2048 exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lyre.codec.base import (
    CodecCounters,
    CodecStats,
    Crossfade,
    F,
    FrameStream,
    StreamSettings,
    decode_isolated,
)
from lyre.codec.streaming import OfflineSnac, StreamingSnac
from lyre.cpu import LEDGER
from lyre.model import orpheus

State = list[torch.Tensor]  # one (1, C, K) tensor per decoder layer with context
# stream: (c0, c1, c2, fed, end, noise, states) -> (audio (B, c * 2048), states);
# offline: (c0, c1, c2, noise) -> audio (B, T * 2048)
Runner = Callable[..., Any]


@dataclass
class StreamJob:
    stream: ExactStream
    frames: np.ndarray  # (c, 7): new frames (then padding when finishing), or every frame so far (prefix)
    real: int  # how many of ``frames`` the state takes (0 for a prefix decode)
    fed: int  # frames the stream's state had been given before
    finishing: bool = False  # the stream ends with these frames: emit everything
    prefix: bool = False  # warm-up: an offline decode of the frames so far; the state is left alone

    @property
    def cost(self) -> int:
        """Frames this job runs through the decoder."""
        return len(self.frames)


@dataclass
class StreamResult:
    audio: np.ndarray  # float32 samples from absolute position fed * 2048 - lag on (a prefix decode: from 0)
    state: State | None


@dataclass(eq=False)
class ExactStream(FrameStream):
    """Plans the chunks of one stream of frames and stitches their audio (its state: a list of
    SNAC layer contexts, None while fresh, all zeros)."""

    provisional_end: int = 0  # samples up to here (plus the crossfade after) came from a warm-up decode
    _head: list = field(default_factory=list)  # the first warmup_frames frames (for prefix decodes)
    _fade: Crossfade = field(default_factory=Crossfade)

    def push(self, frames: list[orpheus.Frame]) -> None:
        room = self.settings.warmup_frames - len(self._head)
        if room > 0:
            self._head.extend(frames[:room])
        super().push(frames)

    def close(self) -> None:
        self._head.clear()
        super().close()

    def frames_to_exact(self, emitted: int | None = None) -> int:
        """Frames still to come before exact audio can extend what was emitted (or ``emitted`` samples)."""
        emitted = self.emitted if emitted is None else emitted
        takeover = (emitted + self.codec.lag) // F + 1  # the first m with m * 2048 - lag > emitted
        return max(0, takeover - self.frames_received)

    def plan(self, chunk_frames: int, need_audio: bool = False) -> StreamJob | None:
        """The job due now (without changing anything), or None.

        A chunk is due once ``chunk_frames`` frames wait, or at the end. When the listener
        ``need_audio`` (it would run dry before the next chunk; always before the first audio,
        which is due after ``first_flush_frames``), whatever can be emitted is due now: exact
        audio, or — while at most ``warmup_frames`` frames exist — a prefix decode."""
        s, lag, pending, n = self.settings, self.codec.lag, len(self._pending), self.frames_received
        if self.closed or (self.finished and self.all_out):
            return None
        c = min(pending, s.max_chunk_frames)
        if self.finished and c == pending:
            pad = np.zeros((self.codec.pad_frames, orpheus.FRAME_TOKENS), dtype=np.int64)
            frames = np.concatenate([_frames(self._pending[:c]), pad]) if c else pad
            return StreamJob(self, frames, c, self.fed, finishing=True)
        if c == 0 or (self.emitted == 0 and (n < s.first_flush_frames or not need_audio)):
            return None  # (the first chunk is the caller's call: its exact audio would come in a small piece)
        exact = (self.fed + c) * F - lag > self.emitted
        if need_audio and not self.finished and self.emitted == 0:  # the first chunk: all the frames so far
            return StreamJob(self, _frames(self._pending[: s.warmup_frames + s.max_chunk_frames]), 0, 0, prefix=True)
        if need_audio and not self.finished and n <= s.warmup_frames and n * F - s.holdback > self.emitted:
            return StreamJob(self, _frames(self._head[:n]), 0, self.fed, prefix=True)  # emits more than exact could
        if (need_audio and exact) or pending >= chunk_frames or self.finished:
            return StreamJob(self, _frames(self._pending[:c]), c, self.fed)
        return None

    def complete(self, job: StreamJob, result: StreamResult) -> np.ndarray:
        """Take the job's decoded audio (and new state); return the samples to emit (maybe none)."""
        if job.prefix:
            start, limit = 0, len(job.frames) * F - self.settings.holdback
        else:
            del self._pending[: job.real]
            self.fed += job.real
            self.state = result.state
            start = job.fed * F - self.codec.lag  # absolute position of result.audio[0]
            limit = self.fed * F if job.finishing else self.fed * F - self.codec.lag
        if limit <= self.emitted:
            if job.finishing:
                self.close()
            return np.zeros(0, dtype=np.float32)
        out = self._fade.apply(result.audio[self.emitted - start : limit - start].copy())
        if job.prefix:
            self._fade.hold(result.audio[limit - start : limit - start + self.settings.holdback])
            self.provisional_end = limit
        else:
            self._fade.hold(None)
        self.emitted = limit
        self.codec.counters.samples_emitted += len(out)
        if job.finishing:
            self.close()
        return out


def _frames(frames: list) -> np.ndarray:
    return np.asarray(frames, dtype=np.int64).reshape(len(frames), orpheus.FRAME_TOKENS)


class StreamCodec:
    """Runs :class:`StreamJob` s: jobs with the same chunk length share one batched call, and so do
    prefix decodes of the same length. ``runner``/``offline`` run the two graphs (default: the torch
    modules; :mod:`lyre.codec.onnx` for the ONNX runtimes)."""

    mode = "stream"
    samples_per_frame = F

    def __init__(self, model: StreamingSnac, runner: Runner | None = None, runtime: str = "torch",
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 noise_seed: int | None = None, offline: Runner | None = None, parallel: int = 1):
        self.model = model
        # A batched call of several streams is split into up to ``parallel`` calls that run at once
        # (the runners are safe to call concurrently and release the GIL: onnxruntime): on 2 cores,
        # 8 streams decode in 0.49x the wall time of one call on one thread (0.70x with 2 intra-op
        # threads instead). A call of one stream is never split.
        self.parallel = max(1, parallel)
        self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="lyre-codec-part") \
            if self.parallel > 1 else None
        self.runner = runner or model
        self.offline = offline or OfflineSnac(model)
        self.runtime = runtime
        self.device, self.dtype = torch.device(device), dtype
        self.lag, self.pad_frames = model.lag, model.pad_frames
        self.generator = torch.Generator()
        if noise_seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(noise_seed)
        self.counters = CodecCounters()
        self.live: set[ExactStream] = set()  # streams holding (or about to hold) a decoder state

    def new_stream(self, settings: StreamSettings) -> ExactStream:
        stream = ExactStream(self, settings)
        self.live.add(stream)
        return stream

    def stats(self) -> CodecStats:
        return self.counters.snapshot(self.mode, self.runtime, open_states=len(self.live),
                                      state_bytes_per_stream=self.model.state_bytes, lag_samples=self.lag)

    def decode(self, jobs: list[StreamJob]) -> list[StreamResult | Exception]:
        """Each job's audio and new state, in order; a job whose decode fails gets its exception
        instead (a failed batched call is retried job by job: the others are unaffected).

        Jobs of the same chunk length (and kind) share a call; with ``parallel`` > 1, groups are
        split until the round has about ``parallel`` calls, which run at once. Each group's inputs
        are made here, whole and in job order (its noise drawn as for one call), and cut by rows."""
        groups: dict[tuple[bool, int], list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault((job.prefix, len(job.frames)), []).append(i)
        calls: list[tuple[bool, list[int], tuple]] = []
        for (prefix, _), idx in groups.items():
            try:
                args = self._inputs([jobs[i] for i in idx], prefix)
            except Exception:  # noqa: BLE001 - made again job by job: only a job whose inputs fail gets its error
                for i in idx:
                    try:
                        calls.append((prefix, [i], self._inputs([jobs[i]], prefix)))
                    except Exception as e:  # noqa: BLE001
                        calls.append((prefix, [i], e))
                continue
            n = max(1, min(len(idx), round(self.parallel * len(idx) / len(jobs))))
            bounds = [len(idx) * k // n for k in range(n + 1)]
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                rows = list(range(lo, hi))
                calls.append((prefix, idx[lo:hi], args if n == 1 else _rows(args, rows)))
        work = lambda call: self._call_isolated(call[0], [jobs[i] for i in call[1]], call[2])  # noqa: E731
        if self._pool is None or len(calls) == 1:
            outputs = [work(call) for call in calls]
        else:
            outputs = list(self._pool.map(work, calls))
        out: list[StreamResult | Exception | None] = [None] * len(jobs)
        for (_, part, _), results in zip(calls, outputs, strict=True):
            self.counters.frames_decoded += len(part) * len(jobs[part[0]].frames)
            self.counters.calls += 1
            for i, result in zip(part, results, strict=True):
                out[i] = result
        return out  # type: ignore[return-value]

    def _call_isolated(self, prefix: bool, group: list[StreamJob], args: tuple | Exception
                       ) -> list[StreamResult | Exception]:
        """One call for ``group`` with ``args``; if it raises, each job alone (its rows of ``args``)."""
        if isinstance(args, Exception):  # (its inputs could not be made: see decode)
            return [args] * len(group)
        def one_call(rows: list[int]) -> list[StreamResult]:  # (charged to the codec: see lyre.cpu)
            return self._results(group, rows, prefix, *self._call(prefix, _rows(args, rows) if len(rows) < len(group)
                                                                    else args))
        with LEDGER.measure("codec"):
            return decode_isolated(list(range(len(group))), one_call)

    def _results(self, group: list[StreamJob], rows: list[int], prefix: bool, audio: np.ndarray,
                 states: State | None) -> list[StreamResult]:
        if prefix:
            return [StreamResult(a, None) for a in audio]
        # (copies of the state rows: a view would keep the whole batch's buffers alive)
        return [StreamResult(audio[k], None if group[r].finishing else [s[k : k + 1].clone() for s in states])
                for k, r in enumerate(rows)]

    def _inputs(self, group: list[StreamJob], prefix: bool) -> tuple:
        """The runner's arguments for ``group``: (codes..., noise) offline, (codes..., fed, end,
        noise, stacked states) streaming."""
        frames = np.stack([j.frames for j in group])  # (B, c, 7)
        b, c = frames.shape[:2]
        if prefix:
            return (*self._codes(frames), self._noise(b, c))
        fresh = self.model.new_state(self.dtype, self.device)
        states = [j.stream.state for j in group]
        stacked = [torch.cat([(s if s is not None else fresh)[k] for s in states]) for k in range(len(fresh))]
        ends = [j.fed + j.real if j.finishing else StreamingSnac.OPEN for j in group]
        return (*self._codes(frames), torch.tensor([j.fed for j in group], device=self.device),
                torch.tensor(ends, device=self.device), self._noise(b, c), stacked)

    @torch.inference_mode()
    def _call(self, prefix: bool, args: tuple) -> tuple[np.ndarray, State | None]:
        """Run one call: audio (B, samples) float32 numpy, and the new states (streaming)."""
        if prefix:
            audio, states = self.offline(*args), None
        else:
            audio, new_states = self.runner(*args)
            states = [torch.as_tensor(s) for s in new_states]
        if isinstance(audio, torch.Tensor):
            audio = audio.float().cpu().numpy()
        return audio, states

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def _codes(self, frames: np.ndarray) -> list[torch.Tensor]:
        b = frames.shape[0]
        c0, c1, c2 = orpheus.frames_to_codes(frames.reshape(-1, orpheus.FRAME_TOKENS))  # (B*c,), (B*2c,), (B*4c,)
        return [torch.from_numpy(x).view(b, -1).to(self.device) for x in (c0, c1, c2)]

    def _noise(self, b: int, c: int) -> list[torch.Tensor]:
        return [torch.randn((b, 1, c * p), generator=self.generator).to(self.device, self.dtype)
                for p in self.model.noise_per_frame]


def _rows(args: tuple, rows: list[int]) -> tuple:
    """The runner's arguments for some rows of its batch (every argument has the batch first)."""
    def cut(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, torch.tensor(rows, device=t.device))

    return tuple([cut(t) for t in a] if isinstance(a, list) else cut(a) for a in args)
