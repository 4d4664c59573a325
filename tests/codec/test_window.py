"""codec.mode window: chunks decoded in windows of context, against one offline decode (noise off)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lyre.codec import StreamSettings, configure_noise
from lyre.codec.window import WindowCodec
from lyre.model import orpheus
from tests.support.codec import feed, offline, random_frames

F = orpheus.SAMPLES_PER_FRAME


@pytest.mark.parametrize("warmup", [1, 4])
def test_streamed_audio_equals_one_offline_decode_outside_the_warmup_join(quiet_snac, warmup):
    frames = random_frames(26, seed=warmup)
    ref = offline(quiet_snac, frames)
    chunks, sd = feed(WindowCodec(quiet_snac), frames, StreamSettings(warmup_frames=warmup), [1] * 26)
    audio = np.concatenate(chunks)
    assert len(audio) == 26 * F  # every frame, exactly
    assert len(chunks[0]) == F - 256  # the first chunk comes after one frame
    join = sd.provisional_end + 256
    assert join <= warmup * F + 256
    assert np.abs(audio[join:] - ref[join:]).max() < 1e-4
    inside = audio[:join] - ref[:join]
    assert np.sqrt(np.mean(inside**2)) < 0.25 * np.sqrt(np.mean(ref[:join] ** 2))  # close inside the join
    # no click: no step between neighbouring samples larger than the offline audio has anywhere
    assert np.abs(np.diff(audio)).max() <= np.abs(np.diff(ref)).max() * 1.05 + 1e-6


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 14), data=st.data())
def test_any_arrival_pattern_gives_every_frame_exactly_once(quiet_snac, n, data):
    frames = random_frames(n, seed=n)
    sizes = data.draw(st.lists(st.integers(0, 3), max_size=n))
    settings_ = StreamSettings(warmup_frames=data.draw(st.integers(1, 4)))
    chunks, sd = feed(WindowCodec(quiet_snac), frames, settings_, sizes)
    audio = np.concatenate(chunks) if chunks else np.zeros(0)
    assert len(audio) == n * F and sd.emitted == n * F
    ref = offline(quiet_snac, frames)
    join = sd.provisional_end + 256 if sd.provisional_end else 0
    if join < len(audio):
        assert np.abs(audio[join:] - ref[join:]).max() < 1e-4


def test_flush_sizes_follow_the_settings():
    sd = WindowCodec(None).new_stream(StreamSettings(first_flush_frames=1, every_flush_frames=2, warmup_frames=1))
    plans = []
    for _ in range(9):
        sd.push(random_frames(1, 0))
        job = sd.plan(2)
        plans.append(None if job is None else (job.start, job.end, job.provisional))
        if job is not None:
            sd.complete(job, np.zeros((len(job.frames)) * F, dtype=np.float32))
    assert plans[0] == (0, F - 256, True)  # first chunk after 7 tokens
    assert plans[1] is None and plans[2] is None  # n=3: no frame has 3 frames of right context yet
    assert plans[4] == (F - 256, 2 * F, False)  # n=5: frames 0-1 are final
    assert plans[6] == (2 * F, 4 * F, False)  # every 14 tokens after


def test_sessions_flushing_together_share_one_batched_snac_call(quiet_snac):
    dec = WindowCodec(quiet_snac)
    streams = [dec.new_stream(StreamSettings(warmup_frames=1)) for _ in range(6)]
    frames = [random_frames(9, seed=i) for i in range(6)]
    refs = [offline(quiet_snac, f) for f in frames]
    out = [[] for _ in streams]
    rounds = 0
    for n in range(9):
        jobs = []
        for sd, f in zip(streams, frames, strict=True):
            sd.push(f[n : n + 1])
            if (job := sd.plan(2)) is not None:
                jobs.append((sd, job))
        if jobs:
            rounds += 1
            audio = dec.decode([j for _, j in jobs])
            for (sd, job), a in zip(jobs, audio, strict=True):
                out[streams.index(sd)].append(sd.complete(job, a))
    assert dec.counters.calls == rounds  # one SNAC call per round for all six sessions (equal windows)
    for chunks, ref in zip(out, refs, strict=True):
        audio = np.concatenate(chunks)
        assert np.abs(audio[F:] - ref[F : len(audio)]).max() < 1e-4  # batched == alone


def test_noise_can_be_seeded_or_switched_off(snac_dir):
    from lyre.model import checkpoint

    frames = random_frames(3, seed=9)
    noisy = checkpoint.load_snac(snac_dir)
    a, b = offline(noisy, frames), offline(noisy, frames)
    assert np.abs(a - b).max() > 1e-3  # SNAC draws fresh noise on every decode
    seeded1 = offline(configure_noise(checkpoint.load_snac(snac_dir), True, seed=5), frames)
    seeded2 = offline(configure_noise(checkpoint.load_snac(snac_dir), True, seed=5), frames)
    assert np.array_equal(seeded1, seeded2)
    off = configure_noise(checkpoint.load_snac(snac_dir), False)
    assert np.array_equal(offline(off, frames), offline(off, frames))
