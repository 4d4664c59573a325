"""The 12 Hz decoder in the codec runtime: one :class:`TwelveHzStream` per generated segment, the
:class:`TwelveHzCodec` running every stream that flushes in a round, streams with the same chunk
length stacked into one call.

The decoder has no lookahead, so every frame's audio is exact as soon as the frame is decoded:
no provisional audio, no padding at the end, no crossfade. The first chunk is due when the
listener needs audio (at the earliest after ``first_flush_frames``), later ones when
``chunk_frames`` frames wait or the listener would run dry, and the last when the segment ends:
the audio is frames x 1920 samples, each frame decoded once.

A clone in reference-transcript mode speaks on from its reference clip: its stream starts from the
decoder state after the clip's frames (:mod:`.warm`: computed once per voice on a thread of its
own; the stream waits for it before its first chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lyre.codec.base import CodecCounters, CodecStats, FrameStream, StreamSettings, decode_isolated
from lyre.codec.qwen12hz.decoder import Decoder, StreamState
from lyre.codec.qwen12hz.warm import WarmStates, WarmUp
from lyre.cpu import LEDGER


@dataclass
class TwelveHzJob:
    stream: TwelveHzStream
    frames: np.ndarray  # (c, 16) the frames to decode, codebook 0 first
    finishing: bool = False  # the stream's last frames

    @property
    def cost(self) -> int:
        return len(self.frames)


@dataclass
class TwelveHzResult:
    audio: np.ndarray  # (c * 1920,) float32
    state: StreamState


@dataclass(eq=False)
class TwelveHzStream(FrameStream):
    """One segment's frames and its decoder's :class:`StreamState` (None before its first frame)."""

    warm: WarmUp | None = None

    def frames_to_exact(self, emitted: int | None = None) -> int:
        """Frames still to come before exact audio can extend what was emitted: none lag behind."""
        emitted = self.emitted if emitted is None else emitted
        return max(0, emitted // self.codec.samples_per_frame + 1 - self.frames_received)

    def plan(self, chunk_frames: int, need_audio: bool = False) -> TwelveHzJob | None:
        """The job due now (nothing changes until :meth:`complete`), or None.

        Unless its listener needs audio, the newest frame waits: the segment's end (which brings no
        frame) then finds one to go out with, marked as the last (its fade and timestamps)."""
        pending = len(self._pending)
        if self.state is None and self.warm is not None and pending and not self.codec.warm.ready(self.warm):
            return None  # (its clip's state is being computed)
        if self.finished and pending == 0:
            self.close()  # (everything went out before the end came: nothing is left to mark)
        if self.closed or pending == 0:
            return None
        c = min(pending, self.settings.max_chunk_frames)
        if self.finished:
            return TwelveHzJob(self, _frames(self._pending[:c]), finishing=c == pending)
        if self.emitted == 0:  # the first chunk is the caller's call
            ready = need_audio and self.frames_received >= self.settings.first_flush_frames
            return TwelveHzJob(self, _frames(self._pending[:c])) if ready else None
        if need_audio:
            return TwelveHzJob(self, _frames(self._pending[:c]))
        if pending - 1 >= chunk_frames:  # (all but the newest)
            return TwelveHzJob(self, _frames(self._pending[: min(c, pending - 1)]))
        return None

    def complete(self, job: TwelveHzJob, result: TwelveHzResult) -> np.ndarray:
        """Take the job's audio and state; return the samples to emit."""
        del self._pending[: len(job.frames)]
        self.fed += len(job.frames)
        self.state = result.state
        self.emitted += len(result.audio)
        self.codec.counters.samples_emitted += len(result.audio)
        if job.finishing:
            self.close()
        return result.audio


def _frames(frames: list) -> np.ndarray:
    return np.asarray(frames, dtype=np.int64).reshape(len(frames), -1)


class TwelveHzCodec:
    """Runs :class:`TwelveHzJob` s on the torch decoder; jobs of the same length share a call."""

    mode = "stream"
    runtime = "torch"
    parallel = 1

    def __init__(self, decoder: Decoder):
        self.decoder = decoder
        self.samples_per_frame = decoder.cfg.samples_per_frame
        self.counters = CodecCounters(samples_per_frame=self.samples_per_frame)
        self.live: set[TwelveHzStream] = set()
        self.state_bytes = sum(t.numel() * t.element_size() for t in decoder.new_state(1).tensors.values())
        self.warm = WarmStates(decoder)  # clones' starting states (reference-transcript mode)

    def new_stream(self, settings: StreamSettings, warm: WarmUp | None = None) -> TwelveHzStream:
        stream = TwelveHzStream(self, settings, warm=warm)
        self.live.add(stream)
        return stream

    def forget(self, voice_id: str) -> None:
        """Drop the kept states of ``voice_id`` (it was deleted)."""
        self.warm.forget(voice_id)

    def _initial(self, stream: TwelveHzStream) -> StreamState:
        """The state a stream's first frame is decoded from: a fresh one, or its clip's."""
        return self.decoder.new_state(1) if stream.warm is None else self.warm.state(stream.warm)

    def stats(self) -> CodecStats:
        return self.counters.snapshot(self.mode, self.runtime, open_states=len(self.live),
                                      state_bytes_per_stream=self.state_bytes, lag_samples=0)

    def decode(self, jobs: list[TwelveHzJob]) -> list[TwelveHzResult | Exception]:
        """Each job's audio and the stream's new state, in order; a job whose decode fails gets its
        exception (a failed call is retried job by job: the others are unaffected)."""
        groups: dict[int, list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault(len(job.frames), []).append(i)
        out: list[TwelveHzResult | Exception | None] = [None] * len(jobs)
        for idx in groups.values():
            with LEDGER.measure("codec"):
                results = decode_isolated([jobs[i] for i in idx], self._call)
            self.counters.calls += 1
            self.counters.frames_decoded += sum(len(jobs[i].frames) for i in idx)
            for i, result in zip(idx, results, strict=True):
                out[i] = result
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _call(self, group: list[TwelveHzJob]) -> list[TwelveHzResult]:
        p = next(self.decoder.parameters())
        state = StreamState.stack([j.stream.state or self._initial(j.stream) for j in group])
        codes = torch.from_numpy(np.stack([j.frames for j in group])).transpose(1, 2).to(p.device)  # (B, 16, c)
        audio = self.decoder.stream(codes, state)[:, 0].float().cpu().numpy()  # (B, c * 1920)
        # (copies of the state rows: a view would keep the whole batch's tensors alive)
        states = [StreamState({k: v.clone() for k, v in row.tensors.items()}) for row in state.split()]
        return [TwelveHzResult(a, s) for a, s in zip(audio, states, strict=True)]

    def close(self) -> None:
        self.warm.close()
