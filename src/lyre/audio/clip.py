"""A reference clip for cloning, from an uploaded audio file.

Any container and codec FFmpeg reads (WAV, FLAC, MP3, Ogg/Opus, ...), any sample rate, mono or
stereo (at most 48 kHz: checked from the header before any sample is decoded): decoded by PyAV,
downmixed to mono, resampled to 24 kHz by soxr, checked (duration, not
silent, not clipping only), loudness-normalised to -20 LUFS (ITU-R BS.1770, pyloudnorm) with peaks
kept under -1 dBFS, and stored as 16-bit FLAC. Every refusal is an :class:`InvalidAudio` (422) or
:class:`UploadTooLarge` (413) whose message says what was wrong and what is accepted.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np

from lyre.audio.formats import AudioEncoder
from lyre.config import VoicesConfig
from lyre.errors import InvalidAudio, UploadTooLarge
from lyre.model import orpheus

RATE = orpheus.SAMPLE_RATE
TARGET_LUFS = -20.0
PEAK_LIMIT = 10 ** (-1.0 / 20)  # -1 dBFS
SILENCE_PEAK = 10 ** (-50 / 20)  # a clip whose loudest sample is under -50 dBFS holds no speech
CLIPPED = 0.99  # |sample| at or above this is at full scale
MAX_CLIPPED_SHARE = 0.05  # more than this share of samples at full scale: clipping, not speech
# the containers an upload may be (FFmpeg probes only these: playlists and ffconcat files, which
# name other files to read, are never opened)
FORMATS = "wav,w64,flac,mp3,ogg,mov,mp4,m4a,3gp,matroska,webm,aiff,caf,aac,amr,au,avi,asf,mpeg"
# what an upload may be, checked from its header before any sample is decoded (and on every frame:
# a header can lie), so that what decoding holds in memory is bounded by max_seconds at these
MAX_CHANNELS = 2
MAX_RATE = 48000


@dataclass(frozen=True)
class ReferenceClip:
    pcm: np.ndarray  # (N,) float32 in [-1, 1], 24 kHz mono, normalised
    flac: bytes  # the same, as 16-bit FLAC
    flac_sha256: str
    upload_sha256: str  # of the bytes as uploaded (the consent record names them)

    @property
    def seconds(self) -> float:
        return self.pcm.size / RATE


def prepare_clip(data: bytes, limits: VoicesConfig) -> ReferenceClip:
    """The reference clip in the uploaded ``data``; raises InvalidAudio / UploadTooLarge."""
    if len(data) > limits.max_upload_bytes:
        raise UploadTooLarge(f"the audio file has {len(data)} bytes; at most {limits.max_upload_bytes} are accepted "
                             "(voices.max_upload_bytes)")
    if not data:
        raise InvalidAudio("the audio file is empty")
    pcm, rate = decode(data, limits.max_seconds + 1.0, longest=limits.max_seconds)
    seconds = pcm.size / rate
    if not limits.min_seconds <= seconds <= limits.max_seconds:
        raise InvalidAudio(f"the clip is {seconds:.1f} s long; a reference clip must last {limits.min_seconds:g} to "
                           f"{limits.max_seconds:g} s")
    peak = float(np.max(np.abs(pcm)))
    if peak < SILENCE_PEAK:
        raise InvalidAudio(f"the clip is silent (its loudest sample is {20 * np.log10(max(peak, 1e-12)):.0f} dBFS)")
    clipped = float(np.mean(np.abs(pcm) >= CLIPPED)) if peak >= CLIPPED else 0.0  # (before resampling rings)
    if clipped > MAX_CLIPPED_SHARE:
        raise InvalidAudio(f"{clipped:.0%} of the clip's samples are at full scale: it is clipping, not a clean "
                           "recording of speech")
    pcm = normalise(to_24k(pcm, rate))
    encoder = AudioEncoder("flac", RATE, stream=False)
    flac = encoder.encode(np.round(pcm * 32767).astype(np.int16)) + encoder.finish()
    return ReferenceClip(pcm, flac, hashlib.sha256(flac).hexdigest(), hashlib.sha256(data).hexdigest())


def decode(data: bytes, max_seconds: float, longest: float | None = None) -> tuple[np.ndarray, int]:
    """(samples (N,) float32 mono, sample rate) of the first audio stream; decoding stops past
    ``max_seconds`` (the caller refuses the clip as too long). Refused before decoding: more than
    :data:`MAX_CHANNELS` channels or a rate over :data:`MAX_RATE`, and, with ``longest``, a file
    that declares a duration past it."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", options={"format_whitelist": FORMATS}) as container:
            if not container.streams.audio:
                raise InvalidAudio("the file holds no audio stream")
            stream = container.streams.audio[0]
            _check_layout(stream.codec_context.channels, stream.codec_context.sample_rate)
            declared = _declared_seconds(container, stream)
            if longest is not None and declared is not None and declared > longest + 1.0:
                raise InvalidAudio(f"the file declares {declared:.1f} s of audio; a reference clip must last at most "
                                   f"{longest:g} s (voices.max_seconds)")
            parts, total, rate = [], 0, None
            for frame in container.decode(stream):
                _check_layout(frame.layout.nb_channels, frame.sample_rate)
                x = frame.to_ndarray()  # (channels, n) planar, or (1, n * channels) packed
                if not frame.format.is_planar:
                    x = x.reshape(-1, frame.layout.nb_channels).T
                x = _as_float(x).mean(axis=0)  # downmix
                rate = rate or frame.sample_rate
                parts.append(x)
                total += x.size
                if total > max_seconds * rate:
                    break
    except InvalidAudio:
        raise
    except (av.error.FFmpegError, ValueError, EOFError) as e:
        raise InvalidAudio(f"the file could not be decoded as audio (wav, flac, mp3, ogg/opus, ...): {e}") from None
    if not parts or rate is None:
        raise InvalidAudio("the file holds no audio samples")
    return np.concatenate(parts).astype(np.float32), int(rate)


def _check_layout(channels: int, rate: int) -> None:
    if channels > MAX_CHANNELS:
        raise InvalidAudio(f"the audio has {channels} channels; at most {MAX_CHANNELS} (mono or stereo) are accepted")
    if rate > MAX_RATE:
        raise InvalidAudio(f"the audio's sample rate is {rate} Hz; at most {MAX_RATE} Hz is accepted")


def _declared_seconds(container, stream) -> float | None:
    """The duration the file's header gives (the stream's, else the container's), if any."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # (FFmpeg's AV_TIME_BASE: microseconds)
    return None


def _as_float(x: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    info = np.iinfo(x.dtype)
    if info.min == 0:  # unsigned 8-bit
        return (x.astype(np.float32) - (info.max + 1) / 2) / ((info.max + 1) / 2)
    return x.astype(np.float32) / (info.max + 1)


def to_24k(pcm: np.ndarray, rate: int) -> np.ndarray:
    if rate == RATE:
        return pcm
    import soxr

    return soxr.resample(pcm, rate, RATE).astype(np.float32)


def normalise(pcm: np.ndarray) -> np.ndarray:
    """To -20 LUFS integrated loudness, then scaled down if a peak would pass -1 dBFS."""
    import pyloudnorm

    loudness = pyloudnorm.Meter(RATE).integrated_loudness(pcm.astype(np.float64))
    if np.isfinite(loudness):
        pcm = pcm * np.float32(10 ** ((TARGET_LUFS - loudness) / 20))
    peak = float(np.max(np.abs(pcm)))
    if peak > PEAK_LIMIT:
        pcm = pcm * np.float32(PEAK_LIMIT / peak)
    return pcm.astype(np.float32)
