"""Audio formats for the front ends: streaming encoders from 24 kHz int16 PCM.

``AudioEncoder(format, sample_rate, speed)`` takes int16 chunks as they are decoded and returns the
bytes to send now; ``finish()`` returns the rest. ``speed`` (0.25-4.0, OpenAI's parameter) changes
the tempo, not the pitch, with FFmpeg's ``atempo`` filter at the source rate; 1.0 inserts no filter.
Resampling is stateful (soxr's streaming resampler), so chunk joins stay clean. Formats:

- ``pcm``: raw s16le; ``wav``: a RIFF header whose RIFF and data sizes are 0xFFFFFFFF (unknown
  length while streaming), then s16le;
- ``mulaw`` / ``alaw``: raw G.711 (8 kHz by default for telephony), encoded by PyAV's codecs;
- ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS), ``flac``: encoded and muxed by PyAV as audio arrives.

What a stream cannot hold, because its header is sent before its length is known:

- ``flac``: STREAMINFO's total sample count and MD5 are 0 ("unknown", as RFC 9639 allows). FFmpeg
  decodes every sample, and so does libsndfile's C API, but libsndfile reports the length as
  SF_COUNT_MAX, so python-soundfile's ``read()`` (which sizes its array from that, then seeks past
  the end) fails: a client wanting a file that soundfile reads whole needs ``stream=False``.
- ``mp3``: the muxer writes its Xing/LAME frame only into a seekable file. A stream gets our own
  LAME "Info" frame ahead of the audio, holding the encoder delay (known before encoding) but no
  frame count, byte count, TOC or end padding: FFmpeg-based decoders drop the delay (the audio
  starts on time) but keep the end padding (up to about one frame of silence: 576 samples below
  32 kHz, 1152 above); mpg123 (libsndfile's mp3 reader) wants the frame count, so drops neither.
- ``opus``: Ogg pages of one 20 ms packet each, written as they fill (not the muxer's default of
  one second a page); the muxer holds back the last page, to mark the end of the stream on it.

``stream=False`` (a response sent whole) muxes into a seekable buffer instead, so the muxers
complete their headers (FLAC's sample count and MD5, MP3's Xing/LAME frame with frame count and
padding, WAV's sizes); container formats and WAV then return everything from ``finish()``.
"""

from __future__ import annotations

import contextlib
import io
import math
import struct
import threading
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np

from lyre.audio.mp3info import MP3_DECODER_DELAY, mp3_info_frame
from lyre.cpu import LEDGER
from lyre.model import orpheus

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
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# (container format, codec) for PyAV, and the sample rates the codec accepts
_COMPRESSED = {
    "mp3": ("mp3", "libmp3lame", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("ogg", "libopus", (8000, 12000, 16000, 24000, 48000)),
    "aac": ("adts", "aac", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "flac": ("flac", "flac", None),
}
# Muxer options for a stream. Ogg: close a page per packet (20 ms), not per second of audio.
_STREAM_OPTIONS = {"opus": {"page_duration": "20000"}}


class AudioFormatError(ValueError):
    """An unsupported format, sample rate or speed."""


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


# Compressed formats' bit rates (bits/s): the default (a 24 kHz mono voice: LAME's own default gave
# 32 kb/s, thin) and the range a request may ask for; mp3 below 32 kHz tops out lower (160, 64 kb/s)
BITRATES = {"mp3": (64000, 8000, 320000), "aac": (64000, 16000, 320000), "opus": (48000, 6000, 256000)}


def check_bitrate(fmt: str, sample_rate: int, bitrate: int | None) -> int | None:
    """The bit rate ``fmt`` is encoded at (None: not a compressed format); raises AudioFormatError
    for one out of the format's range, or given for a format without one."""
    if fmt not in BITRATES:
        if bitrate is not None:
            raise AudioFormatError(f"bitrate applies to {', '.join(BITRATES)}, not {fmt}")
        return None
    default, low, high = BITRATES[fmt]
    if fmt == "mp3" and sample_rate < 32000:  # MPEG-2 (16-24 kHz) and MPEG-2.5 (8-12 kHz) have lower ceilings
        high = 160000 if sample_rate >= 16000 else 64000
    if bitrate is None:
        return min(default, high)
    if isinstance(bitrate, bool) or not isinstance(bitrate, int) or not low <= bitrate <= high:
        raise AudioFormatError(f"{fmt} bitrate at {sample_rate} Hz must be an integer from {low} to {high} bits/s, "
                               f"got {bitrate!r}")
    return bitrate


def check_speed(speed: float) -> float:
    """``speed`` as a float; raises AudioFormatError unless it is a number from 0.25 to 4.0."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise AudioFormatError(f"speed must be a number from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}")
    return float(speed)


def wav_header(sample_rate: int, channels: int = 1, bits: int = 16, data_size: int = 0xFFFFFFFF) -> bytes:
    """A WAV header; by default its RIFF and data chunk sizes are 0xFFFFFFFF (length unknown)."""
    block = channels * bits // 8
    riff = min(data_size + 36, 0xFFFFFFFF)
    return (
        b"RIFF" + struct.pack("<I", riff) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data" + struct.pack("<I", min(data_size, 0xFFFFFFFF))
    )


class _Sink(io.RawIOBase):
    """A write-only, unseekable file that hands out what was written since the last drain."""

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


class Stretch:
    """Tempo times ``speed``, pitch kept: FFmpeg's ``atempo``, chained so each instance stays within
    0.5-2.0 (beyond 2.0 a single atempo skips input instead of blending it). At the end, silence
    pushes out what atempo still holds, and the output is cut to the input's length / ``speed``."""

    FRAME = 256  # input samples per filter frame (~11 ms): the first chunk's audio comes out with it

    def __init__(self, speed: float):
        import av.filter

        stages = max(1, math.ceil(abs(math.log2(speed)) - 1e-9))
        tempo = speed ** (1 / stages)
        graph = av.filter.Graph()
        nodes = [graph.add_abuffer(sample_rate=SOURCE_RATE, format="s16", layout="mono",
                                   time_base=Fraction(1, SOURCE_RATE))]
        nodes += [graph.add("atempo", tempo=repr(tempo)) for _ in range(stages)]
        nodes += [graph.add("aformat", sample_fmts="s16", channel_layouts="mono"), graph.add("abuffersink")]
        graph.link_nodes(*nodes).configure()
        self._graph, self._speed, self._pts, self._given = graph, speed, 0, 0

    def process(self, pcm: np.ndarray, last: bool) -> np.ndarray:
        """What the filter gives out for ``pcm`` (all of the rest, when ``last``)."""
        self._push(pcm)
        total = self._pts  # input samples, without the padding below
        if last:
            self._push(np.zeros(SOURCE_RATE // 4, dtype=np.int16))  # > atempo's window, every stage
            self._graph.push(None)
        out = [np.zeros(0, dtype=np.int16)]
        while True:
            try:
                out.append(self._graph.pull().to_ndarray().reshape(-1))
            except (BlockingIOError, EOFError):  # wants more input / drained
                break
        stretched = np.concatenate(out)
        if last:
            stretched = stretched[: max(0, round(total / self._speed) - self._given)]
        self._given += stretched.size
        return stretched

    def _push(self, pcm: np.ndarray) -> None:
        """``pcm`` in frames of at most FRAME samples: atempo gives out what a frame allows only when the
        next one comes, so a whole chunk pushed as one frame would be held until the next chunk (a first
        chunk's audio ~90 ms late)."""
        import av

        for at in range(0, pcm.size, Stretch.FRAME):
            part = pcm[at : at + Stretch.FRAME]
            frame = av.AudioFrame.from_ndarray(part[None, :], format="s16", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = SOURCE_RATE, self._pts, Fraction(1, SOURCE_RATE)
            self._pts += part.size
            self._graph.push(frame)


class AudioEncoder:
    def __init__(self, fmt: str, sample_rate: int | None = None, speed: float = 1.0, *, stream: bool = True,
                 mark: Callable[[np.ndarray], np.ndarray] | None = None, bitrate: int | None = None):
        """``mark``: a watermarker applied after the tempo change (a time-stretch moves a mark applied
        before it away from its period; see lyre.audio.watermark). ``bitrate``: of mp3, aac and opus
        (:data:`BITRATES`)."""
        self.format = fmt
        self.sample_rate = check_format(fmt, sample_rate)
        self.bitrate = check_bitrate(fmt, self.sample_rate, bitrate)
        self.speed = check_speed(speed)
        self.content_type = CONTENT_TYPES[fmt]
        self.streaming = stream
        self._stretch = Stretch(self.speed) if self.speed != 1.0 else None
        self._mark = mark if self._stretch is not None else None
        self._resampler = None
        if self.sample_rate != SOURCE_RATE:
            import soxr

            self._resampler = soxr.ResampleStream(SOURCE_RATE, self.sample_rate, 1, dtype="int16")
        self._header = wav_header(self.sample_rate) if fmt == "wav" and stream else b""
        self._held: list[bytes] | None = None if stream or fmt != "wav" else []
        self._codec = self._container = self._stream = self._sink = None
        self._pts = 0
        self._mp3_info = stream and fmt == "mp3"  # our Info frame goes ahead of the first mp3 frame
        self._guard = threading.Lock()  # over the two fields below: close() may come while a worker thread encodes
        self._users = 0  # encode/finish calls in progress
        self._closed = False  # close() was called: the last call in progress releases the codec
        if fmt in ("mulaw", "alaw"):
            import av

            self._codec = av.CodecContext.create(f"pcm_{fmt}", "w")
            self._codec.sample_rate = self.sample_rate
            self._codec.layout = "mono"
            self._codec.format = "s16"
        elif fmt in _COMPRESSED:
            import av

            container_fmt, codec, _ = _COMPRESSED[fmt]
            self._sink = _Sink() if stream else io.BytesIO()
            options = {"flush_packets": "1", **_STREAM_OPTIONS.get(fmt, {})} if stream else {}
            self._container = av.open(self._sink, mode="w", format=container_fmt, container_options=options)
            self._stream = self._container.add_stream(codec, rate=self.sample_rate, layout="mono")
            if self.bitrate is not None:
                self._stream.bit_rate = self.bitrate

    @property
    def cheap(self) -> bool:
        """Raw PCM or WAV at the source rate and speed: a copy, cheap enough for the event loop."""
        return (self._resampler is None and self._stretch is None and self._codec is None
                and self._container is None)

    def close(self) -> None:
        """Release the encoder without finishing (the stream was abandoned). Safe to call twice, and
        from another thread while a worker thread encodes (a caller cancelled while it waited): the
        codec is then released when that call returns, never under it. Later calls return nothing."""
        with self._guard:
            self._closed = True
            if self._users:
                return
        self._release()

    @contextlib.contextmanager
    def _using(self) -> Iterator[bool]:
        """Around each encode/finish: yields False once closed (nothing more is encoded)."""
        with self._guard:
            self._users += 1
            open_ = not self._closed
        try:
            yield open_
        finally:
            with self._guard:
                self._users -= 1
                release = self._closed and not self._users
            if release:
                self._release()

    def _release(self) -> None:
        with self._guard:  # (taken out under the lock: a close and a call returning may both get here)
            container, self._container, self._stream = self._container, None, None
            self._codec = self._resampler = self._stretch = None
        if container is not None:
            try:
                container.close()
            except Exception:  # noqa: BLE001 - an abandoned container may refuse its trailer
                pass

    def encode(self, pcm: np.ndarray, last: bool = False) -> bytes:
        """Bytes for the int16 24 kHz ``pcm`` (possibly empty while an encoder fills a frame)."""
        with self._using() as open_, LEDGER.measure("encoding"):
            return self._encode_chunk(pcm, last) if open_ else b""

    def _encode_chunk(self, pcm: np.ndarray, last: bool) -> bytes:
        pcm = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
        if self._stretch is not None:
            pcm = self._stretch.process(pcm, last)
            if self._mark is not None and pcm.size:
                marked = self._mark(pcm.astype(np.float32) / 32768)
                pcm = np.clip(np.round(marked * 32768), -32768, 32767).astype(np.int16)
        if self._resampler is not None:
            pcm = self._resampler.resample_chunk(pcm, last=last)
        body = self._encode(pcm)
        out, self._header = self._header + body, b""
        return out

    def finish(self) -> bytes:
        """Everything still buffered (the filter's and resampler's tails, the encoder's last frames,
        trailers; with ``stream=False``, the whole file)."""
        with self._using() as open_:
            return self._finish() if open_ else b""

    def _finish(self) -> bytes:
        if self._stretch is not None or self._resampler is not None:
            out = self.encode(np.zeros(0, dtype=np.int16), last=True)
        else:
            out, self._header = self._header, b""
        if self._held is not None:  # wav, stream=False: now the sizes are known
            data = b"".join(self._held)
            self._held = None
            return wav_header(self.sample_rate, data_size=len(data)) + data
        if self._codec is not None:
            out += b"".join(bytes(p) for p in self._codec.encode(None))
        elif self._container is not None:
            self._mux(self._stream.encode(None))
            self._container.close()
            out += self._sink.drain() if self.streaming else self._sink.getvalue()
        return out

    def _encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size == 0:
            return b""
        if self._codec is None and self._container is None:
            data = pcm.astype("<i2").tobytes()
            if self._held is None:
                return data
            self._held.append(data)
            return b""
        import av

        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        if self._codec is not None:
            return b"".join(bytes(p) for p in self._codec.encode(frame))
        frame.pts, frame.time_base = self._pts, Fraction(1, self.sample_rate)
        self._pts += pcm.size
        self._mux(self._stream.encode(frame))
        return self._sink.drain() if self.streaming else b""

    def _mux(self, packets: list) -> None:
        if packets and self._mp3_info:
            import av

            first = packets[0]
            # libmp3lame stamps its first packet -(encoder delay + decoder delay)
            delay = -first.pts - MP3_DECODER_DELAY if first.pts is not None else 576
            info = av.Packet(mp3_info_frame(bytes(first), delay))
            info.stream = self._stream
            self._container.mux(info)
            self._mp3_info = False
        self._container.mux(packets)
