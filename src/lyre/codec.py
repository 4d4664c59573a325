"""Streaming SNAC decoding: frames in, seam-free PCM out, batched across sessions.

A :class:`StreamDecoder` (one per generated segment) takes complete frames from the
``AudioTokenParser`` and plans decode jobs; a :class:`SnacDecoder` runs the jobs of every session
that flushes in the same round as batched SNAC calls.

Exactness. SNAC's receptive field is about +-2.25 Orpheus frames, so a frame decoded with
``context_frames`` (3) frames of context on each side matches one decode of the whole stream
(~1e-6). A frame is *final* once that right context exists (or the stream has ended), and normal
chunks emit only final frames.

Warm-up. The first chunk is due after ``flush_first_n_tokens`` (one frame), long before any frame
is final. During the first ``warmup_frames`` frames, a flush with no exact progress possible emits
*provisional* audio up to the last frame minus a short holdback, keeping the held-back tail; the
next chunk starts with a crossfade from that tail into the better decode of the same samples.
After the warm-up only final frames are emitted, so the exact boundary (which lags the newest frame
by ``context_frames``) catches up with what was emitted and stays exact. ``warmup_frames = 1``
makes only the first chunk provisional; a longer warm-up gives the listener more audio while exact
decoding catches up, for streams generated at less than ~4x real time. Only the warm-up region
differs from an offline decode; every chunk boundary is continuous. At the end every remaining
frame is emitted: total audio = frames x 2048 samples exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from lyre import orpheus

F = orpheus.SAMPLES_PER_FRAME


@dataclass(frozen=True)
class StreamSettings:
    context_frames: int = 3
    first_flush_frames: int = 1  # flush_first_n_tokens / 7
    every_flush_frames: int = 2  # flush_every_n_tokens / 7
    warmup_frames: int = 1  # provisional chunks may be emitted while at most this many frames exist
    holdback: int = 256  # provisional tail held back for the crossfade (samples)


@dataclass
class DecodeJob:
    frames: np.ndarray  # (T, 7) window of frame codes
    window_start: int  # absolute sample index of the window's first sample
    start: int  # absolute samples [start, end) to emit
    end: int
    provisional: bool  # the window lacks right context; keep a held-back tail


@dataclass
class StreamDecoder:
    """Plans the decode jobs of one stream of frames and stitches their audio."""

    settings: StreamSettings = field(default_factory=StreamSettings)
    emitted: int = 0  # samples emitted so far
    provisional_end: int = 0  # samples up to here (plus the crossfade after) came from a warm-up decode
    finished: bool = False
    _frames: list = field(default_factory=list)  # frames from index _base on
    _base: int = 0
    _n: int = 0  # frames received
    _flushed_at: int = 0  # frame count at the last flush
    _held: np.ndarray | None = None  # provisional tail: samples [emitted, emitted + holdback)

    @property
    def frames_received(self) -> int:
        return self._n

    @property
    def all_out(self) -> bool:
        """Every frame received so far has been emitted."""
        return self.emitted == self._n * F

    def push(self, frames: list[orpheus.Frame]) -> None:
        self._frames.extend(frames)
        self._n += len(frames)

    def finish(self) -> None:
        self.finished = True

    def _due(self) -> bool:
        s = self.settings
        if self.finished:
            return not self.all_out
        if self._flushed_at == 0:
            return self._n >= s.first_flush_frames
        return self._n - self._flushed_at >= s.every_flush_frames

    def plan(self) -> DecodeJob | None:
        """The decode job due now, or None."""
        if not self._due():
            return None
        s, n = self.settings, self._n
        self._flushed_at = n
        final_end = n * F if self.finished else max(0, n - s.context_frames) * F
        if final_end > self.emitted:
            start, end, provisional = self.emitted, final_end, False
            lo = max(0, start // F - s.context_frames)
            hi = min(n, -(-end // F) + s.context_frames)
        elif n <= s.warmup_frames:
            end = n * F - s.holdback
            if end <= self.emitted:
                return None
            start, provisional = self.emitted, True
            lo, hi = max(0, start // F - s.context_frames), n
        else:
            return None  # wait until exact decoding passes what the warm-up emitted
        window = np.asarray(self._frames[lo - self._base : hi - self._base], dtype=np.int64)  # (T, 7)
        return DecodeJob(window, lo * F, start, end, provisional)

    def complete(self, job: DecodeJob, audio: np.ndarray) -> np.ndarray:
        """Stitch the window's decoded ``audio`` (float32, window samples); return the samples to emit."""
        out = audio[job.start - job.window_start : job.end - job.window_start].copy()
        if self._held is not None:
            h = min(len(self._held), len(out))
            ramp = (np.arange(h, dtype=np.float32) + 0.5) / h
            out[:h] = self._held[:h] * (1 - ramp) + out[:h] * ramp
        if job.provisional:
            tail = job.end - job.window_start
            self._held = audio[tail : tail + self.settings.holdback].copy()
            self.provisional_end = job.end
        else:
            self._held = None
        self.emitted = job.end
        # frames before the next window's left context are never needed again
        keep_from = max(0, self.emitted // F - self.settings.context_frames)
        if keep_from > self._base:
            del self._frames[: keep_from - self._base]
            self._base = keep_from
        return out


class _SeededNoise(nn.Module):
    """SNAC's NoiseBlock with its noise drawn from a dedicated generator."""

    def __init__(self, block: nn.Module, generator: torch.Generator):
        super().__init__()
        self.linear = block.linear
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t = x.shape
        noise = torch.randn((b, 1, t), generator=self.generator, device="cpu", dtype=torch.float32)
        return x + noise.to(device=x.device, dtype=x.dtype) * self.linear(x)


def configure_noise(snac: nn.Module, enabled: bool, seed: int | None = None) -> nn.Module:
    """Switch SNAC's decoder noise off, or draw it from a generator seeded with ``seed``."""
    from snac.layers import NoiseBlock

    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    for module in list(snac.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (NoiseBlock, _SeededNoise)):
                if not enabled:
                    replacement = nn.Identity()
                elif generator is not None:
                    replacement = _SeededNoise(child, generator)
                else:
                    continue
                setattr(module, child_name, replacement)
    return snac


class SnacDecoder:
    """Runs decode jobs; windows of equal length share one batched SNAC call."""

    def __init__(self, snac: nn.Module, device: torch.device, dtype: torch.dtype = torch.float32):
        self.snac = snac
        self.device = device
        self.dtype = dtype
        self.calls = 0  # SNAC forward passes, for metrics and tests

    @torch.inference_mode()
    def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        """Float32 audio of each job's window, in order."""
        out: list[np.ndarray | None] = [None] * len(jobs)
        by_len: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            by_len.setdefault(len(job.frames), []).append(i)
        for idx in by_len.values():
            frames = np.stack([jobs[i].frames for i in idx])  # (B, T, 7)
            b, t = frames.shape[:2]
            c0, c1, c2 = orpheus.frames_to_codes(frames.reshape(-1, 7))  # (B*T,), (B*2T,), (B*4T,)
            codes = [torch.from_numpy(c).view(b, -1).to(self.device) for c in (c0, c1, c2)]
            audio = self.snac.decode(codes)  # (B, 1, T * 2048)
            self.calls += 1
            audio = audio[:, 0].float().cpu().numpy()
            for row, i in enumerate(idx):
                out[i] = audio[row]
        return out  # type: ignore[return-value]
