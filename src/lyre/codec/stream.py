"""``codec.mode: stream``: each frame decoded once by the exact streaming decoder, batched across sessions.

An :class:`ExactStream` (one per generated segment) holds the segment's decoder state and plans
its chunks; a :class:`StreamCodec` runs the jobs of every session that flushes in the same round,
stacking the states of jobs with the same chunk length into one call.

Chunks. The exact audio trails the newest frame by the decoder's lag (~2.3 frames). The first
chunk is due after ``first_flush_frames``, long before any sample is exact: while at most
``warmup_frames`` frames exist, a flush that cannot emit exact audio emits *provisional* audio —
the stream's state is stepped as usual, then a copy of it is finished as if the stream ended
there (what an offline decode of the frames so far gives) — up to the newest frame minus a short
holdback, and the held-back tail is crossfaded into the next chunk. Afterwards only exact audio
is emitted; the exact stream takes over from the provisional one with that crossfade, so only the
warm-up region differs from an offline decode. At the end the stream is finished with padding
frames and every frame is emitted: total audio = frames x 2048 samples exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lyre import orpheus
from lyre.codec.base import CodecCounters, Crossfade, F, StreamSettings
from lyre.codec.streaming import StreamingSnac

State = list[torch.Tensor]  # one (1, C, K) tensor per decoder layer with context
# (c0, c1, c2, fed, end, noise, states) -> (audio (B, c * 2048), states)
Runner = Callable[..., tuple[Any, Sequence[Any]]]


@dataclass
class StreamJob:
    stream: ExactStream
    frames: np.ndarray  # (c, 7): the new frames, then padding frames when the stream is finishing
    real: int  # how many of ``frames`` are the stream's own
    fed: int  # frames the stream's state had been given before
    finishing: bool  # the stream ends with these frames: emit everything
    provisional: bool  # after the step, finish a copy of the state and emit that (warm-up)

    @property
    def cost(self) -> int:
        """Frames this job runs through the decoder (the warm-up's finishing copy included)."""
        return len(self.frames) + (self.stream.codec.pad_frames if self.provisional else 0)


@dataclass
class StreamResult:
    audio: np.ndarray  # float32 samples from absolute position fed * 2048 - lag on
    state: State | None


@dataclass(eq=False)
class ExactStream:
    """Plans the chunks of one stream of frames and stitches their audio."""

    codec: StreamCodec
    settings: StreamSettings
    emitted: int = 0  # samples emitted so far
    provisional_end: int = 0  # samples up to here (plus the crossfade after) came from a warm-up decode
    finished: bool = False
    closed: bool = False
    state: State | None = None  # None: fresh (all zeros)
    fed: int = 0  # frames given to the state
    _pending: list = field(default_factory=list)  # frames received, not yet fed
    _fade: Crossfade = field(default_factory=Crossfade)

    @property
    def frames_received(self) -> int:
        return self.fed + len(self._pending)

    @property
    def all_out(self) -> bool:
        """Every frame received so far has been emitted."""
        return self.emitted == self.frames_received * F

    def push(self, frames: list[orpheus.Frame]) -> None:
        self._pending.extend(frames)

    def finish(self) -> None:
        self.finished = True

    def close(self) -> None:
        """Free the decoder state (the segment ended, finished or not)."""
        if not self.closed:
            self.closed = True
            self.state = None
            self._pending.clear()
            self.codec.live.discard(self)

    def plan(self, chunk_frames: int) -> StreamJob | None:
        """The job due now (without changing anything), or None. A chunk is due once
        ``chunk_frames`` frames wait (the first after ``first_flush_frames``; during the warm-up,
        every frame), or at the end."""
        s, lag, pending = self.settings, self.codec.lag, len(self._pending)
        if self.closed or (self.finished and self.all_out):
            return None
        c = min(pending, s.max_chunk_frames)
        if self.finished and c == pending:
            pad = np.zeros((self.codec.pad_frames, orpheus.FRAME_TOKENS), dtype=np.int64)
            frames = np.concatenate([self._frame_array(c), pad]) if c else pad
            return StreamJob(self, frames, c, self.fed, finishing=True, provisional=False)
        if self.emitted == 0:
            due = self.frames_received >= s.first_flush_frames
        else:  # during the warm-up every frame is due: provisional audio keeps the listener fed
            due = pending >= (1 if self.frames_received <= s.warmup_frames else chunk_frames)
        if not (due and c) and not self.finished:
            return None
        after = self.fed + c
        provisional = (not self.finished and after * F - lag <= self.emitted and after <= s.warmup_frames
                       and after * F - s.holdback > self.emitted)
        return StreamJob(self, self._frame_array(c), c, self.fed, finishing=False, provisional=provisional)

    def _frame_array(self, c: int) -> np.ndarray:
        return np.asarray(self._pending[:c], dtype=np.int64).reshape(c, orpheus.FRAME_TOKENS)

    def complete(self, job: StreamJob, result: StreamResult) -> np.ndarray:
        """Take the job's decoded audio and new state; return the samples to emit (maybe none)."""
        del self._pending[: job.real]
        self.fed += job.real
        self.state = result.state
        start = job.fed * F - self.codec.lag  # absolute position of result.audio[0]
        if job.finishing:
            limit = self.fed * F
        elif job.provisional:
            limit = self.fed * F - self.settings.holdback
        else:
            limit = self.fed * F - self.codec.lag
        if limit <= self.emitted:
            return np.zeros(0, dtype=np.float32)
        out = self._fade.apply(result.audio[self.emitted - start : limit - start].copy())
        if job.provisional:
            self._fade.hold(result.audio[limit - start : limit - start + self.settings.holdback])
            self.provisional_end = limit
        else:
            self._fade.hold(None)
        self.emitted = limit
        self.codec.counters.samples_emitted += len(out)
        if job.finishing:
            self.close()
        return out


class StreamCodec:
    """Runs :class:`StreamJob` s: jobs with the same chunk length share one batched call."""

    mode = "stream"

    def __init__(self, model: StreamingSnac, runner: Runner | None = None, runtime: str = "torch",
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 noise_seed: int | None = None):
        self.model = model
        self.runner = runner or _torch_runner(model)
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

    def stats(self) -> dict[str, object]:
        return self.counters.snapshot(self.mode, self.runtime, open_states=len(self.live),
                                      state_bytes_per_stream=self.model.state_bytes, lag_samples=self.lag)

    def decode(self, jobs: list[StreamJob]) -> list[StreamResult]:
        """Each job's audio (from ``fed * 2048 - lag`` on) and new state, in order."""
        out: list[StreamResult | None] = [None] * len(jobs)
        by_len: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            by_len.setdefault(len(job.frames), []).append(i)
        for idx in by_len.values():
            group = [jobs[i] for i in idx]
            ends = [j.fed + j.real if j.finishing else StreamingSnac.OPEN for j in group]
            audio, states = self._run(np.stack([j.frames for j in group]), [j.fed for j in group], ends,
                                      [j.stream.state for j in group])
            for row, i in enumerate(idx):
                out[i] = StreamResult(audio[row], None if jobs[i].finishing else [s[row : row + 1] for s in states])
        warm = [i for i, job in enumerate(jobs) if job.provisional]
        if warm:  # finish a copy of each warm-up state: the audio as if the stream ended here
            fed = [jobs[i].fed + jobs[i].real for i in warm]
            pad = np.zeros((len(warm), self.pad_frames, orpheus.FRAME_TOKENS), dtype=np.int64)
            audio, _ = self._run(pad, fed, fed, [out[i].state for i in warm])
            for row, i in enumerate(warm):
                out[i].audio = np.concatenate([out[i].audio, audio[row]])
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _run(self, frames: np.ndarray, fed: list[int], end: list[int], states: list[State | None]):
        """One batched call: ``frames`` (B, c, 7) -> audio (B, c * 2048) float32 numpy, states."""
        b, c = frames.shape[:2]
        c0, c1, c2 = orpheus.frames_to_codes(frames.reshape(-1, orpheus.FRAME_TOKENS))  # (B*c,), (B*2c,), (B*4c,)
        codes = [torch.from_numpy(x).view(b, -1).to(self.device) for x in (c0, c1, c2)]
        fresh = self.model.new_state(self.dtype, self.device)
        stacked = [torch.cat([(s if s is not None else fresh)[k] for s in states]) for k in range(len(fresh))]
        noise = [torch.randn((b, 1, c * p), generator=self.generator).to(self.device, self.dtype)
                 for p in self.model.noise_per_frame]
        audio, new_states = self.runner(*codes, torch.tensor(fed, device=self.device),
                                        torch.tensor(end, device=self.device), noise, stacked)
        self.counters.frames_decoded += b * c
        self.counters.calls += 1
        if isinstance(audio, torch.Tensor):
            audio = audio.float().cpu().numpy()
        return audio, [torch.as_tensor(s) for s in new_states]


def _torch_runner(model: StreamingSnac) -> Runner:
    def run(c0, c1, c2, fed, end, noise, states):
        return model(c0, c1, c2, fed, end, noise, states)

    return run
