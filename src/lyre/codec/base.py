"""What the codecs share: settings, a segment's stream of frames, the warm-up crossfade, the decode counters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lyre.model import orpheus

F = orpheus.SAMPLES_PER_FRAME


@dataclass(frozen=True)
class StreamSettings:
    context_frames: int = 3  # window mode: frames of context on each side of the emitted frames
    first_flush_frames: int = 1  # flush_first_n_tokens / 7
    every_flush_frames: int = 2  # flush_every_n_tokens / 7: the smallest later chunk
    max_chunk_frames: int = 8  # the largest chunk (chunks grow with the listener's slack)
    warmup_frames: int = 1  # provisional chunks may be emitted while at most this many frames exist
    holdback: int = 256  # provisional tail held back for the crossfade (samples)


@dataclass(eq=False)
class FrameStream:
    """A segment's frames as a streaming codec holds them: received (pending), given to its decoder
    state (``fed``), their samples emitted; finished once the segment ends, closed once its state is
    freed. ``codec`` has ``samples_per_frame`` and the ``live`` set of streams holding a state."""

    codec: Any
    settings: StreamSettings
    emitted: int = 0  # samples emitted so far
    finished: bool = False
    closed: bool = False
    state: Any = None  # None: before its first frame
    fed: int = 0  # frames given to the state
    _pending: list = field(default_factory=list)  # frames received, not yet fed

    @property
    def frames_received(self) -> int:
        return self.fed + len(self._pending)

    @property
    def all_out(self) -> bool:
        """Every frame received so far has been emitted."""
        return self.emitted == self.frames_received * self.codec.samples_per_frame

    def push(self, frames: list[tuple[int, ...]]) -> None:
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


class Crossfade:
    """The tail of a provisional chunk, held back and faded into the next decode of the same samples."""

    def __init__(self) -> None:
        self.held: np.ndarray | None = None

    def hold(self, tail: np.ndarray | None) -> None:
        self.held = None if tail is None else tail.copy()

    def apply(self, out: np.ndarray) -> np.ndarray:
        """``out`` (the next samples to emit, float32) starting with a fade from the held tail."""
        if self.held is not None:
            h = min(len(self.held), len(out))
            ramp = (np.arange(h, dtype=np.float32) + 0.5) / h
            out[:h] = self.held[:h] * (1 - ramp) + out[:h] * ramp
        return out


@dataclass
class CodecCounters:
    """Frames run through SNAC against frames emitted: the decode cost of each emitted frame."""

    frames_decoded: int = 0  # frames' worth of decoder input, padding and provisional decodes included
    samples_emitted: int = 0
    samples_per_frame: int = F
    calls: int = 0  # batched decoder calls
    decode_s: float = 0.0  # wall time spent decoding

    @property
    def frames_emitted(self) -> float:
        return self.samples_emitted / self.samples_per_frame

    def snapshot(self, mode: str, runtime: str, open_states: int, state_bytes_per_stream: int | None = None,
                 lag_samples: int | None = None) -> CodecStats:
        emitted = self.frames_emitted
        return CodecStats(
            mode=mode,
            runtime=runtime,
            frames_decoded=self.frames_decoded,
            frames_emitted=round(emitted, 3),
            decoded_per_emitted=round(self.frames_decoded / emitted, 3) if emitted else None,
            calls=self.calls,
            decode_s=round(self.decode_s, 3),
            decode_ms_per_emitted_frame=round(1000 * self.decode_s / emitted, 2) if emitted else None,
            open_states=open_states,
            state_bytes_per_stream=state_bytes_per_stream,
            lag_samples=lag_samples,
        )


@dataclass(frozen=True)
class CodecStats:
    """The codec's figures (``/v1/stats`` ``codec``): what each emitted frame cost to decode."""

    mode: str  # stream | window
    runtime: str  # torch | onnxruntime | openvino
    frames_decoded: int  # padding and provisional decodes included
    frames_emitted: float
    decoded_per_emitted: float | None
    calls: int  # batched decoder calls
    decode_s: float
    decode_ms_per_emitted_frame: float | None
    open_states: int  # streams holding a decoder state
    state_bytes_per_stream: int | None = None  # stream mode
    lag_samples: int | None = None  # stream mode: how far exact audio trails the newest frame

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in _ALWAYS}


_ALWAYS = {"decoded_per_emitted", "decode_ms_per_emitted_frame"}


log = logging.getLogger("lyre.codec")


def decode_isolated(jobs: Sequence[Any], call: Callable[[list[Any]], Sequence[Any]]) -> list[Any]:
    """``call(jobs)`` (one batched decode: a result per job); when it raises, each job alone, so
    only the jobs that fail alone get their exception (a fault stays with its stream)."""
    try:
        return list(call(list(jobs)))
    except Exception as e:  # noqa: BLE001 - handed to the job(s) that caused it
        if len(jobs) == 1:
            log.warning("audio decode failed: %s: %s", type(e).__name__, e)
            return [e]
        log.exception("audio decode failed (%d streams); decoding them one at a time", len(jobs))
    return [result for job in jobs for result in decode_isolated([job], call)]
