"""The watermark: seamless when applied chunk by chunk, found after the lossy paths Lyre's outputs
take (16-bit WAV, MP3 128 kbps, 8 kHz mu-law), not found in unmarked audio or under another key;
on every synthesis when enabled, on none when not."""

from __future__ import annotations

import numpy as np
import pytest

from lyre.audio.watermark import Watermark
from lyre.benchmarks.watermark import mp3_128k, mulaw_8k
from tests.support.audio_files import speechlike
from tests.support.services import run, service

MARK = Watermark("test-key")


def marked(x: np.ndarray, chunk: int = 2048) -> np.ndarray:
    m = MARK.marker()
    return np.concatenate([m(x[i:i + chunk]) for i in range(0, x.size, chunk)])


def int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1, 1) * 32767).round().astype(np.int16)


def test_marking_chunk_by_chunk_is_marking_the_whole_and_stays_24_db_under_the_speech():
    x = speechlike(4.0, 24000, seed=3)[0]
    whole = MARK.marker()(x)
    for chunk in (1, 777, 2048, 5000):
        assert np.array_equal(marked(x, chunk), whole)  # no seams, whatever the chunking
    snr = 10 * np.log10(np.mean(x**2) / np.mean((whole - x) ** 2))
    assert 22 < snr < 28
    silence = np.zeros(24000, np.float32)
    assert np.array_equal(MARK.marker()(silence), silence)  # nothing is added where nothing is said


@pytest.mark.parametrize("path", ["wav", "mp3", "mulaw"])
def test_the_mark_survives_the_formats_and_unmarked_audio_is_not_flagged(path):
    for seed in range(4):
        x = speechlike(3.0, 24000, seed=seed)[0]
        y = marked(x)
        for audio, want in ((y, True), (x, False)):
            if path == "wav":
                pcm, rate = int16(audio) / 32768, 24000
            else:
                pcm, rate = (mp3_128k if path == "mp3" else mulaw_8k)(audio)
            found = MARK.detect(pcm, rate)
            assert found.watermarked is want, (seed, path, want, found)
        assert not Watermark("another-key").detect(y).watermarked  # the key matters


def test_a_cut_and_delayed_excerpt_is_still_found():
    y = marked(speechlike(6.0, 24000, seed=9)[0])
    excerpt = np.concatenate([np.zeros(1234, np.float32), y[30_001:30_001 + 48_000]])  # 2 s from the middle
    assert MARK.detect(excerpt).watermarked


def test_every_synthesis_is_marked_when_enabled_and_none_when_not():
    async def go(enabled: bool):
        async with service(**{"watermark.enabled": enabled, "sampling.max_tokens": 280}) as tts:
            audio = await tts.synthesize("Mark my words.")
            utterance = tts.utterance()
            utterance.append("One sentence. Then another one.")
            utterance.end()
            pieces = np.concatenate([c.pcm async for c in utterance])
            return [tts.watermark.detect(a / 32768) for a in (audio.pcm, pieces)]

    assert [d.watermarked for d in run(go(True))] == [True, True]
    assert [d.watermarked for d in run(go(False))] == [False, False]
