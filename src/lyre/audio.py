"""Audio formats for the front ends: streaming encoders from 24 kHz int16 PCM.

``AudioEncoder(format, sample_rate)`` takes int16 chunks as they are decoded and returns the bytes
to send now; ``finish()`` returns the rest. Resampling is stateful (soxr's streaming resampler), so
chunk joins stay clean. Formats:

- ``pcm``: raw s16le; ``wav``: a RIFF header whose RIFF and data sizes are 0xFFFFFFFF (unknown
  length while streaming), then s16le;
- ``mulaw`` / ``alaw``: raw G.711 (8 kHz by default for telephony), encoded by PyAV's codecs;
- ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS), ``flac``: encoded and muxed by PyAV as audio arrives.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from lyre import orpheus

SOURCE_RATE = orpheus.SAMPLE_RATE

CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
}
FORMATS = tuple(CONTENT_TYPES)
DEFAULT_RATES = {"mulaw": 8000, "alaw": 8000}
MIN_RATE, MAX_RATE = 8000, 48000
# (container format, codec) for PyAV, and the sample rates the codec accepts
_COMPRESSED = {
    "mp3": ("mp3", "libmp3lame", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", (8000, 12000, 16000, 24000, 48000)),
    "aac": ("adts", "aac", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "flac": ("flac", "flac", None),
}


class AudioFormatError(ValueError):
    """An unsupported format or sample rate."""


def check_format(fmt: str, sample_rate: int | None) -> int:
    """The output sample rate for ``fmt``; raises AudioFormatError naming what is allowed."""
    if fmt not in CONTENT_TYPES:
        raise AudioFormatError(f"unsupported response_format {fmt!r}; one of: {', '.join(FORMATS)}")
    rate = sample_rate or DEFAULT_RATES.get(fmt, SOURCE_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
        raise AudioFormatError(f"sample_rate must be an integer from {MIN_RATE} to {MAX_RATE}, got {rate!r}")
    allowed = _COMPRESSED.get(fmt, (None, None, None))[2]
    if allowed is not None and rate not in allowed:
        raise AudioFormatError(f"{fmt} supports sample rates {', '.join(map(str, allowed))}; got {rate}")
    return rate


def wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A streaming WAV header: RIFF and data chunk sizes 0xFFFFFFFF (length unknown)."""
    block = channels * bits // 8
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


class _Sink(io.RawIOBase):
    """A write-only file that hands out what was written since the last drain."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self._parts.append(bytes(b))
        return len(b)

    def drain(self) -> bytes:
        out = b"".join(self._parts)
        self._parts = []
        return out


class AudioEncoder:
    def __init__(self, fmt: str, sample_rate: int | None = None):
        self.format = fmt
        self.sample_rate = check_format(fmt, sample_rate)
        self.content_type = CONTENT_TYPES[fmt]
        self._resampler = None
        if self.sample_rate != SOURCE_RATE:
            import soxr

            self._resampler = soxr.ResampleStream(SOURCE_RATE, self.sample_rate, 1, dtype="int16")
        self._header = wav_header(self.sample_rate) if fmt == "wav" else b""
        self._codec = self._container = self._stream = self._sink = None
        if fmt in ("mulaw", "alaw"):
            import av

            self._codec = av.CodecContext.create(f"pcm_{fmt}", "w")
            self._codec.sample_rate = self.sample_rate
            self._codec.layout = "mono"
            self._codec.format = "s16"
        elif fmt in _COMPRESSED:
            import av

            container_fmt, codec, _ = _COMPRESSED[fmt]
            self._sink = _Sink()
            self._container = av.open(self._sink, mode="w", format=container_fmt)
            self._stream = self._container.add_stream(codec, rate=self.sample_rate, layout="mono")

    @property
    def cheap(self) -> bool:
        """Raw PCM or WAV at the source rate: a copy, cheap enough for the event loop."""
        return self._resampler is None and self._codec is None and self._container is None

    def close(self) -> None:
        """Release the encoder without finishing (the stream was abandoned). Safe to call twice."""
        if self._container is not None:
            try:
                self._container.close()
            except Exception:  # noqa: BLE001 - an abandoned container may refuse its trailer
                pass
            self._container = self._stream = None
        self._codec = self._resampler = None

    def encode(self, pcm: np.ndarray, last: bool = False) -> bytes:
        """Bytes for the int16 24 kHz ``pcm`` (possibly empty while an encoder fills a frame)."""
        pcm = np.ascontiguousarray(pcm, dtype=np.int16)
        if self._resampler is not None:
            pcm = self._resampler.resample_chunk(pcm, last=last)
        out = self._header + self._encode(pcm)
        self._header = b""
        return out

    def finish(self) -> bytes:
        """Everything still buffered (the resampler's tail, the encoder's last frames, trailers)."""
        out = self.encode(np.zeros(0, dtype=np.int16), last=True) if self._resampler is not None else self._header
        self._header = b""
        if self._codec is not None:
            out += b"".join(bytes(p) for p in self._codec.encode(None))
        elif self._container is not None:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
            out += self._sink.drain()
        return out

    def _encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size == 0:
            return b""
        if self._codec is None and self._container is None:
            return pcm.astype("<i2").tobytes()
        import av

        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        if self._codec is not None:
            return b"".join(bytes(p) for p in self._codec.encode(frame))
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.drain()
