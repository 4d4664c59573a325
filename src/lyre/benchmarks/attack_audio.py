"""Audio files of the isolation benchmark's attacks (:mod:`lyre.benchmarks.attacks`): WAVs whose header
declares what their data is not, and a FLAC that is small to send and large to decode."""

from __future__ import annotations

import io
import struct
from fractions import Fraction

import numpy as np


def wav(samples: np.ndarray, rate: int, declared_frames: int | None = None) -> bytes:
    """(channels, n) int16 as a 16-bit WAV whose header declares ``declared_frames`` (default n)."""
    channels, n = samples.shape
    data_bytes = min(0xFFFFFFFF - 36, 2 * channels * (n if declared_frames is None else declared_frames))
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + data_bytes, b"WAVE", b"fmt ", 16, 1, channels, rate,
                         rate * channels * 2, channels * 2, 16, b"data", data_bytes)
    return header + samples.T.astype("<i2").tobytes()


def oversized_files(seconds: float, max_bytes: int) -> list[tuple[str, bytes]]:
    """(name, file): 8 channels at 384 kHz (as much as ``max_bytes`` holds, and declaring ``seconds``),
    a mono WAV declaring hours, and an 8-channel 384 kHz FLAC of ``seconds`` of near silence."""
    rate, channels = 384_000, 8
    frames = min(int(seconds * rate), (max_bytes - 44) // (2 * channels))
    wide = np.tile(_tone(frames, rate), (channels, 1))
    mono = _tone(min(int(seconds * 48_000), (max_bytes - 44) // 2), 48_000)[None, :]
    return [("wav_8ch_384k", wav(wide, rate, declared_frames=max(frames, int(seconds * rate)))),
            ("wav_declares_hours", wav(mono, 48_000, declared_frames=(0xFFFFFF00 - 36) // 2)),
            ("flac_8ch_384k", _silent_flac(seconds, rate, channels))]


def _tone(n: int, rate: int) -> np.ndarray:
    return (3000 * np.sin(np.arange(n) * 2 * np.pi * 220 / rate)).astype(np.int16)


def _silent_flac(seconds: float, rate: int, channels: int) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="7.1" if channels == 8 else "mono")
        for second in range(max(1, int(np.ceil(seconds)))):
            n = min(rate, int(seconds * rate) - second * rate) or rate
            block = np.zeros((1, n * channels), np.int16)
            if second == 0:  # a short tone: all the rest is silence, which FLAC stores in a few bytes a block
                block[0, : channels * (n // 4)] = np.repeat((3000 * np.sin(np.arange(n // 4) / 20)).astype(np.int16),
                                                            channels)
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout=stream.layout.name)
            frame.sample_rate, frame.pts, frame.time_base = rate, second * rate, Fraction(1, rate)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
