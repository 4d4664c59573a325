"""Reference clips from uploads: every common format, rate and channel count in; a normalised
24 kHz mono FLAC out; every unusable upload refused with a clear 4xx error."""

from __future__ import annotations

import io
import re

import numpy as np
import pyloudnorm
import pytest
import soundfile as sf

from lyre.audio.clip import prepare_clip
from lyre.config import VoicesConfig
from lyre.errors import InvalidAudio, UploadTooLarge
from tests.support.audio_files import audio_file, speechlike

LIMITS = VoicesConfig()


@pytest.mark.parametrize("fmt, rate, channels", [("wav", 44100, 2), ("wav8", 16000, 1), ("flac", 48000, 1),
                                                  ("mp3", 44100, 2), ("ogg", 48000, 1), ("wav", 24000, 1)])
def test_any_format_rate_and_channels_become_a_normalised_24k_mono_flac(fmt, rate, channels):
    data = audio_file(speechlike(5.0, rate, channels, level=0.05), rate, fmt)
    clip = prepare_clip(data, LIMITS)
    assert abs(clip.seconds - 5.0) < 0.03
    assert abs(pyloudnorm.Meter(24000).integrated_loudness(clip.pcm.astype(np.float64)) + 20) < 0.5  # -20 LUFS
    assert np.max(np.abs(clip.pcm)) <= 10 ** (-1 / 20) + 1e-6  # peaks under -1 dBFS
    stored, stored_rate = sf.read(io.BytesIO(clip.flac), dtype="int16")
    assert stored_rate == 24000 and stored.ndim == 1 and len(stored) == clip.pcm.size
    assert np.abs(stored / 32767 - clip.pcm).max() < 1e-4  # the FLAC holds the normalised clip
    assert len(clip.upload_sha256) == len(clip.flac_sha256) == 64


@pytest.mark.parametrize("data, error, message", [
    (b"", InvalidAudio, "empty"),
    (b"this is not audio at all" * 40, InvalidAudio, "could not be decoded as audio"),
    (audio_file(speechlike(2.0), 44100, "wav"), InvalidAudio, "2.0 s long; a reference clip must last 3 to 30 s"),
    (audio_file(speechlike(31.0, 16000), 16000, "flac"), InvalidAudio, "must last 3 to 30 s"),
    (audio_file(np.zeros((1, 5 * 16000), np.float32), 16000, "wav"), InvalidAudio, "silent"),
    (audio_file(np.sign(speechlike(5.0, 16000)) * 1.0, 16000, "wav"), InvalidAudio, "clipping"),
])
def test_unusable_uploads_are_refused_clearly(data, error, message):
    with pytest.raises(error, match=message):
        prepare_clip(data, LIMITS)


def wav(pcm: np.ndarray, rate: int) -> bytes:
    """(n, channels) float samples as 16-bit WAV, any channel count (libsndfile)."""
    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.mark.parametrize("data, message, from_header", [
    (wav(np.tile(speechlike(5.0, 16000).T, (1, 8)), 16000), "8 channels; at most 2 (mono or stereo)", True),
    (wav(speechlike(5.0, 96000).T, 96000), "sample rate is 96000 Hz; at most 48000 Hz", True),
    (wav(speechlike(60.0, 8000).T, 8000), "declares 60.0 s of audio; a reference clip must last at most 30 s", False),
])
def test_what_an_upload_declares_is_refused_before_its_samples_are_decoded(data, message, from_header):
    """Channels and rate are read from the header: a file cut off after it (its samples never
    decoded) gets the same refusal. (A cut WAV's duration is what its bytes hold: FFmpeg measures it.)"""
    for upload in (data, data[:4096]) if from_header else (data,):
        with pytest.raises(InvalidAudio, match=re.escape(message)):
            prepare_clip(upload, LIMITS)


def test_an_upload_over_the_byte_limit_is_refused_before_decoding():
    with pytest.raises(UploadTooLarge, match="at most 1024 are accepted"):
        prepare_clip(b"\0" * 2000, VoicesConfig(max_upload_bytes=1024))


def test_a_video_file_with_an_audio_track_is_read_for_its_audio():
    """A container whose first stream is not audio (here: an Ogg with only audio is the common
    case; a file with no audio stream at all is refused)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 40, np.uint8), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with pytest.raises(InvalidAudio, match="no audio stream"):
        prepare_clip(buf.getvalue(), LIMITS)
