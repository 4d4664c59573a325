"""Reference clips for enrollment tests: a speech-like signal (a voiced source with a moving pitch
and syllable-rate loudness) written in real container formats by PyAV."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np


def speechlike(seconds: float, rate: int = 44100, channels: int = 1, seed: int = 0, level: float = 0.3) -> np.ndarray:
    """(channels, n) float32: harmonics of a gliding 110-220 Hz pitch, 4 Hz syllables, a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 160 + 50 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(h * phase) / h for h in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 0.5
    x = level * (voiced * syllables / 2 + 0.01 * rng.standard_normal(t.size))
    return np.stack([x * (1 - 0.2 * c) for c in range(channels)]).astype(np.float32)


_FORMATS = {  # container, codec, sample format
    "wav": ("wav", "pcm_s16le", "s16"),
    "wav8": ("wav", "pcm_u8", "u8"),
    "flac": ("flac", "flac", "s16"),
    "mp3": ("mp3", "libmp3lame", "fltp"),
    "ogg": ("ogg", "libopus", "flt"),
}


def audio_file(pcm: np.ndarray, rate: int, fmt: str) -> bytes:
    """``pcm`` (channels, n) float32 as a file of format ``fmt`` (wav, wav8, flac, mp3, ogg)."""
    container_fmt, codec, sample_fmt = _FORMATS[fmt]
    channels = pcm.shape[0]
    layout = "mono" if channels == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container_fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        data = np.clip(pcm, -1, 1)
        if sample_fmt == "s16":
            frame = av.AudioFrame.from_ndarray((data.T.reshape(1, -1) * 32767).astype(np.int16), format="s16",
                                               layout=layout)
        elif sample_fmt == "u8":
            frame = av.AudioFrame.from_ndarray((data.T.reshape(1, -1) * 127 + 128).astype(np.uint8), format="u8",
                                               layout=layout)
        elif sample_fmt == "flt":
            frame = av.AudioFrame.from_ndarray(data.T.reshape(1, -1).astype(np.float32), format="flt", layout=layout)
        else:
            frame = av.AudioFrame.from_ndarray(data.astype(np.float32), format="fltp", layout=layout)
        frame.sample_rate = rate
        frame.pts, frame.time_base = 0, Fraction(1, rate)
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()
