"""``codec.mode: window``: each chunk decoded inside a window of context frames, batched across sessions.

A :class:`StreamDecoder` (one per generated segment) takes complete frames from the
``AudioTokenParser`` and plans decode jobs; a :class:`SnacDecoder` runs the jobs of every session
that flushes in the same round as batched SNAC calls. Each emitted frame is decoded about
``1 + 2 * context_frames / every_flush_frames`` times (~3.9 with the defaults); ``codec.mode:
stream`` (:mod:`lyre.codec.streaming`) decodes each frame once.

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

from lyre.codec.base import CodecCounters, CodecStats, Crossfade, F, StreamSettings, decode_isolated
from lyre.cpu import LEDGER
from lyre.model import orpheus


@dataclass
class DecodeJob:
    stream: WindowStream
    frames: np.ndarray  # (T, 7) window of frame codes
    window_start: int  # absolute sample index of the window's first sample
    start: int  # absolute samples [start, end) to emit
    end: int
    provisional: bool  # the window lacks right context; keep a held-back tail
    received: int  # frames received when the job was planned

    @property
    def cost(self) -> int:
        """Frames this job decodes."""
        return len(self.frames)


@dataclass(eq=False)
class WindowStream:
    """Plans the decode jobs of one stream of frames and stitches their audio."""

    codec: WindowCodec
    settings: StreamSettings = field(default_factory=StreamSettings)
    emitted: int = 0  # samples emitted so far
    provisional_end: int = 0  # samples up to here (plus the crossfade after) came from a warm-up decode
    finished: bool = False
    closed: bool = False
    _frames: list = field(default_factory=list)  # frames from index _base on
    _base: int = 0
    _n: int = 0  # frames received
    _flushed_at: int = 0  # frame count at the last flush
    _fade: Crossfade = field(default_factory=Crossfade)

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

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._frames.clear()
            self.codec.live.discard(self)

    def _due(self, chunk_frames: int) -> bool:
        if self.finished:
            return not self.all_out
        if self._flushed_at == 0:
            return self._n >= self.settings.first_flush_frames
        exact_backlog = max(0, self._n - self.settings.context_frames) * F - self.emitted  # left by max_chunk_frames
        return self._n - self._flushed_at >= chunk_frames or exact_backlog >= chunk_frames * F

    def frames_to_exact(self, emitted: int | None = None) -> int:
        return 0  # window mode plans its warm-up by frame count alone

    def plan(self, chunk_frames: int, need_audio: bool = False) -> DecodeJob | None:
        """The decode job due now, or None. Planning a job changes nothing until :meth:`complete`."""
        if self.closed or not self._due(chunk_frames):
            return None
        s, n = self.settings, self._n
        final_end = n * F if self.finished else max(0, n - s.context_frames) * F
        if final_end > self.emitted:
            start, end, provisional = self.emitted, min(final_end, self.emitted + s.max_chunk_frames * F), False
            lo = max(0, start // F - s.context_frames)
            hi = min(n, -(-end // F) + s.context_frames)
        elif n <= s.warmup_frames:
            end = n * F - s.holdback
            if end <= self.emitted:
                self._flushed_at = n  # this flush had nothing to emit
                return None
            start, provisional = self.emitted, True
            lo, hi = max(0, start // F - s.context_frames), n
        else:
            self._flushed_at = n  # nothing to emit: wait until exact decoding passes what the warm-up emitted
            return None
        window = np.asarray(self._frames[lo - self._base : hi - self._base], dtype=np.int64)  # (T, 7)
        return DecodeJob(self, window, lo * F, start, end, provisional, n)

    def complete(self, job: DecodeJob, audio: np.ndarray) -> np.ndarray:
        """Stitch the window's decoded ``audio`` (float32, window samples); return the samples to emit."""
        self._flushed_at = job.received
        out = self._fade.apply(audio[job.start - job.window_start : job.end - job.window_start].copy())
        if job.provisional:
            tail = job.end - job.window_start
            self._fade.hold(audio[tail : tail + self.settings.holdback])
            self.provisional_end = job.end
        else:
            self._fade.hold(None)
        self.emitted = job.end
        self.codec.counters.samples_emitted += len(out)
        # frames before the next window's left context are never needed again
        keep_from = max(0, self.emitted // F - self.settings.context_frames)
        if keep_from > self._base:
            del self._frames[: keep_from - self._base]
            self._base = keep_from
        if self.finished and self.all_out:
            self.close()
        return out


class WindowCodec:
    """Runs decode jobs; windows of equal length share one batched SNAC call."""

    mode = "window"
    runtime = "torch"
    parallel = 1  # calls run at once (one: in the caller's thread)

    def __init__(self, snac: nn.Module, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.snac = snac
        self.device = torch.device(device)
        self.dtype = dtype
        self.counters = CodecCounters()
        self.live: set[WindowStream] = set()

    def new_stream(self, settings: StreamSettings) -> WindowStream:
        stream = WindowStream(self, settings)
        self.live.add(stream)
        return stream

    def close(self) -> None:
        """(Nothing to release: window mode runs in the caller's thread.)"""

    def stats(self) -> CodecStats:
        return self.counters.snapshot(self.mode, self.runtime, open_states=len(self.live))

    def decode(self, jobs: list[DecodeJob]) -> list[np.ndarray | Exception]:
        """Float32 audio of each job's window, in order; a job whose decode fails gets its exception."""
        out: list[np.ndarray | Exception | None] = [None] * len(jobs)
        by_len: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            by_len.setdefault(len(job.frames), []).append(i)
        for idx in by_len.values():
            # (B, T, 7) -> (B, T * 2048); a failed batch is retried job by job
            with LEDGER.measure("codec"):
                audio = decode_isolated([jobs[i] for i in idx],
                                        lambda group: self._decode(np.stack([j.frames for j in group])))
            for row, i in enumerate(idx):
                out[i] = audio[row]
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _decode(self, frames: np.ndarray) -> np.ndarray:
        b, t = frames.shape[:2]
        c0, c1, c2 = orpheus.frames_to_codes(frames.reshape(-1, 7))  # (B*T,), (B*2T,), (B*4T,)
        codes = [torch.from_numpy(c).view(b, -1).to(self.device) for c in (c0, c1, c2)]
        audio = self.snac.decode(codes)  # (B, 1, T * 2048)
        self.counters.calls += 1
        self.counters.frames_decoded += b * t
        return audio[:, 0].float().cpu().numpy()
