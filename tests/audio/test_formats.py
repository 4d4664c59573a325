"""AudioEncoder on its own: what a client decoding its bytes gets (issue 14, OpenAI-compatible clients)."""

from __future__ import annotations

import io
import math
import threading

import av
import numpy as np
import pytest
import soundfile

from lyre.audio.formats import FORMATS, AudioEncoder, AudioFormatError

RATE = 24_000
CHUNK = 2048  # what the pipeline hands the encoder: ~85 ms


def sine(seconds: float, hz: float = 440.0, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def speech_like(seconds: float) -> np.ndarray:
    """A tone under a slow swell: no two stretches alike, so alignment has one answer."""
    t = np.arange(round(seconds * RATE)) / RATE
    return (9000 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 1.3 * t)).astype(np.int16)


def encode(encoder: AudioEncoder, pcm: np.ndarray) -> list[bytes]:
    """What encode() gives for each chunk, then finish()."""
    return [encoder.encode(pcm[i:i + CHUNK]) for i in range(0, len(pcm), CHUNK)] + [encoder.finish()]


def ffmpeg_decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono samples as FFmpeg (PyAV) decodes them, gapless info honoured, and their rate."""
    with av.open(io.BytesIO(data)) as f:
        frames = [frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)]
        return np.concatenate(frames), f.streams.audio[0].codec_context.sample_rate


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(len(pcm))))
    return float(np.argmax(spectrum)) * rate / len(pcm)


def unserialized(data: bytes) -> bytes:
    """Ogg pages with their stream serial number (random per stream) and checksum zeroed."""
    out, pos = bytearray(data), 0
    while pos < len(out):
        out[pos + 14:pos + 18] = out[pos + 22:pos + 26] = bytes(4)
        segments = out[pos + 26]
        pos += 27 + segments + sum(out[pos + 27:pos + 27 + segments])
    return bytes(out)


def ogg_pages(data: bytes) -> list[tuple[int, bytes]]:
    """(granule position, first packet's first 12 bytes) of each Ogg page."""
    pages, pos = [], 0
    while pos < len(data):
        assert data[pos:pos + 4] == b"OggS"
        granule = int.from_bytes(data[pos + 6:pos + 14], "little", signed=True)
        segments = data[pos + 26]
        start = pos + 27 + segments
        pages.append((granule, data[start:start + 12]))
        pos = start + sum(data[pos + 27:start])
    return pages


# FLAC


def test_a_streamed_flac_comes_out_as_audio_arrives_and_decodes_losslessly():
    pcm = (np.random.default_rng(0).standard_normal(3 * RATE) * 3000).astype(np.int16)
    parts = encode(AudioEncoder("flac"), pcm)
    assert sum(map(len, parts[:-1])) > 0.9 * sum(map(len, parts))  # not held back for finish()
    decoded, rate = ffmpeg_decode(b"".join(parts))
    assert rate == RATE and np.array_equal(decoded, pcm)


@pytest.mark.parametrize("rate", [RATE, 22050])
def test_a_whole_flac_file_reads_with_soundfile_sample_for_sample(rate):
    pcm = (np.random.default_rng(1).standard_normal(RATE) * 3000).astype(np.int16)
    encoder = AudioEncoder("flac", rate, stream=False)
    data = b"".join(encode(encoder, pcm))
    samples, read_rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert read_rate == rate
    if rate == RATE:
        assert np.array_equal(samples, pcm)  # lossless
    else:  # the resampled stream, exactly: what pcm at that rate gives
        assert np.array_equal(samples, np.frombuffer(b"".join(encode(AudioEncoder("pcm", rate), pcm)), "<i2"))


# Opus


def test_opus_sends_a_page_of_audio_for_every_chunk_without_a_second_of_buffering():
    pcm = sine(2.0)
    encoder = AudioEncoder("opus")
    sent, delivered = b"", 0
    for i in range(0, len(pcm) - CHUNK + 1, CHUNK):
        out = encoder.encode(pcm[i:i + CHUNK])
        delivered += CHUNK
        assert out, f"nothing sent after chunk {i // CHUNK}"
        sent += out
        pages = ogg_pages(sent)
        assert pages[0][1].startswith(b"OpusHead") and pages[1][1].startswith(b"OpusTags")
        pre_skip = int.from_bytes(pages[0][1][10:12], "little")
        audio = pages[-1][0] - pre_skip  # 48 kHz samples in the pages sent
        # the muxer keeps one 20 ms page back and the encoder a part-filled 20 ms frame: < 50 ms
        assert delivered / RATE - audio / 48_000 < 0.050
    data = sent + encoder.encode(pcm[delivered:]) + encoder.finish()
    assert ogg_pages(data)[-1][0] == 2 * len(pcm) + pre_skip  # the end, exactly
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")  # libsndfile's Ogg Opus reader
    assert rate == RATE and len(samples) == len(pcm)
    decoded, rate = ffmpeg_decode(data)
    assert rate == 48_000 and len(decoded) == 2 * len(pcm)
    assert abs(dominant_hz(decoded, rate) - 440) < 2


# MP3


def lame_delay(data: bytes) -> int | None:
    """The encoder delay in the first MPEG frame's LAME tag (after any ID3v2 tag), or None."""
    if data[:3] == b"ID3":
        size = data[6:10]
        data = data[10 + (size[0] << 21 | size[1] << 14 | size[2] << 7 | size[3]):]
    header = int.from_bytes(data[:4], "big")
    assert header >> 21 == 0x7FF, "not an MPEG audio frame"
    version, mono = (header >> 19) & 3, (header >> 6) & 3 == 3
    tag = 4 + ((17 if mono else 32) if version == 3 else (9 if mono else 17))
    if data[tag:tag + 4] not in (b"Info", b"Xing"):
        return None
    flags, pos = int.from_bytes(data[tag + 4:tag + 8], "big"), tag + 8
    pos += 4 * bool(flags & 1) + 4 * bool(flags & 2) + 100 * bool(flags & 4) + 4 * bool(flags & 8)
    assert data[pos:pos + 4] in (b"LAME", b"Lavf", b"Lavc")
    return int.from_bytes(data[pos + 21:pos + 24], "big") >> 12


def lag(decoded: np.ndarray, reference: np.ndarray) -> int:
    """Where ``reference`` best lines up in ``decoded`` (samples late)."""
    span = len(reference) - 2000
    scores = [np.dot(decoded[shift:shift + span], reference[:span]) for shift in range(0, 1500)]
    return int(np.argmax(scores))


def test_a_streamed_mp3_carries_the_encoder_delay_so_decoders_start_on_time():
    pcm = speech_like(2.0)
    parts = encode(AudioEncoder("mp3"), pcm)
    assert parts[0] and lame_delay(parts[0]) == 576  # in the first bytes sent, before any audio frame
    decoded, rate = ffmpeg_decode(b"".join(parts))
    assert rate == RATE
    assert lag(decoded, pcm / 32768) == 0  # 1105 samples late without the delay (576 + 529 decoder)
    # the end padding can't be sent ahead (no frame count while streaming): up to two 576-sample frames
    assert len(pcm) <= len(decoded) < len(pcm) + 2 * 576


def test_a_whole_mp3_file_is_gapless_for_ffmpeg_and_libsndfile():
    pcm = speech_like(2.0)
    data = b"".join(encode(AudioEncoder("mp3", stream=False), pcm))
    assert lame_delay(data) == 576
    decoded, _ = ffmpeg_decode(data)
    assert len(decoded) == len(pcm) and lag(decoded, pcm / 32768) == 0
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")  # libsndfile's mpg123 reader
    assert rate == RATE and len(samples) == len(pcm)


# speed


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_speed_changes_the_duration_and_keeps_the_pitch(speed):
    pcm = sine(2.0)
    encoder = AudioEncoder("pcm", speed=speed)
    assert not encoder.cheap  # a filter runs: off the event loop
    parts = encode(encoder, pcm)
    assert sum(map(len, parts[:-1])) > 0.5 * sum(map(len, parts))  # streamed, not all at finish()
    out = np.frombuffer(b"".join(parts), dtype="<i2")
    assert len(out) == round(len(pcm) / speed)  # padded through the filter, cut to length: exact
    assert abs(dominant_hz(out, RATE) - 440) < 3


@pytest.mark.parametrize("speed", [0.5, 0.75, 1.5, 2.0, 3.0])
def test_a_first_chunk_comes_out_stretched_at_once(speed):
    """The server's first chunk (3840 samples, 160 ms) gives audio at once, not with the next chunk:
    speed != 1 starts as soon as speed 1 (the filter holds at most ~65 ms of input back)."""
    encoder = AudioEncoder("pcm", speed=speed)
    first = np.frombuffer(encoder.encode(speech_like(0.16)[:3840]), dtype="<i2")
    assert len(first) >= (3840 - 0.065 * RATE * max(1.0, speed / 2)) / speed


def test_speed_runs_before_resampling_and_encoding():
    pcm = sine(2.0)
    data = b"".join(encode(AudioEncoder("opus", 16000, speed=2.0), pcm))
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == 16000 and abs(len(samples) - 16000) <= 1  # 2 s at 2x
    assert abs(dominant_hz(samples, rate) - 440) < 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_speed_one_is_the_plain_path(fmt):
    pcm = speech_like(1.0)
    plain, at_one = AudioEncoder(fmt), AudioEncoder(fmt, speed=1.0)
    assert at_one._stretch is None and at_one.cheap == plain.cheap
    same, plain_parts = encode(at_one, pcm), encode(plain, pcm)
    if fmt == "opus":  # each Ogg stream draws its serial number
        same, plain_parts = [unserialized(p) for p in same], [unserialized(p) for p in plain_parts]
    assert same == plain_parts


@pytest.mark.parametrize("speed", [0.2, 4.5, math.nan, True, "fast"])
def test_a_speed_out_of_range_is_refused(speed):
    with pytest.raises(AudioFormatError, match="speed"):
        AudioEncoder("mp3", speed=speed)


def test_closing_while_a_worker_thread_encodes_waits_for_it_to_return():
    """The server closes an encoder when its caller goes away, maybe while a worker thread is inside
    encode(): the codec is released after that call returns, never under it (a PyAV container
    closed under an encode is a use-after-free); calls after the close encode nothing."""
    entered, go = threading.Event(), threading.Event()

    def gate(pcm: np.ndarray) -> np.ndarray:  # runs inside encode(), between the stretch and the codec
        entered.set()
        assert go.wait(30)
        return pcm

    pcm = speech_like(1.0)
    expected = AudioEncoder("mp3", speed=1.5, mark=lambda x: x).encode(pcm)
    encoder, got = AudioEncoder("mp3", speed=1.5, mark=gate), []
    worker = threading.Thread(target=lambda: got.append(encoder.encode(pcm)))
    worker.start()
    assert entered.wait(30)
    encoder.close()  # (the caller was cancelled: it does not wait for the worker)
    go.set()
    worker.join(30)
    assert got == [expected] and len(expected) > 1000  # the call in progress encoded its chunk whole
    assert encoder.encode(pcm) == b"" and encoder.finish() == b""
    encoder.close()


# WAV


def test_a_whole_wav_file_has_its_sizes():
    pcm = sine(0.5)
    parts = encode(AudioEncoder("wav", stream=False), pcm)
    data = b"".join(parts)
    assert int.from_bytes(data[40:44], "little") == 2 * len(pcm)
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    assert rate == RATE and np.array_equal(samples, pcm)
