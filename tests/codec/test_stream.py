"""codec.mode stream: chunk planning, warm-up and batching around the exact streaming decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lyre.codec import StreamSettings, configure_noise
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac
from lyre.model import checkpoint
from tests.support.codec import F, feed, offline, random_frames


@pytest.fixture(scope="module")
def codec(quiet_snac):
    return StreamCodec(StreamingSnac(quiet_snac).eval())


def exact_after_join(audio, ref, stream) -> float:
    """Largest error relative to the peak after the warm-up region (provisional audio + crossfade)."""
    join = stream.provisional_end + stream.settings.holdback if stream.provisional_end else 0
    return np.abs(audio[join:] - ref[join : len(audio)]).max() / np.abs(ref).max() if join < len(audio) else 0.0


@pytest.mark.parametrize("warmup", [1, 4])
def test_streamed_audio_equals_one_offline_decode_after_the_warmup(quiet_snac, codec, warmup):
    frames = random_frames(26, seed=warmup)
    ref = offline(quiet_snac, frames)
    chunks, stream = feed(codec, frames, StreamSettings(warmup_frames=warmup), [1] * 26)
    audio = np.concatenate(chunks)
    assert len(audio) == 26 * F  # every frame, exactly once
    assert len(chunks[0]) == F - 256  # the first chunk comes after one frame (provisional)
    assert 0 < stream.provisional_end <= warmup * F
    assert exact_after_join(audio, ref, stream) <= 1e-5
    join = stream.provisional_end + 256
    inside = audio[:join] - ref[:join]
    assert np.sqrt(np.mean(inside**2)) < 0.25 * np.sqrt(np.mean(ref[:join] ** 2))  # close inside the warm-up
    assert np.abs(np.diff(audio)).max() <= np.abs(np.diff(ref)).max() * 1.05 + 1e-6  # no click at any join
    assert stream.closed and stream not in codec.live  # its state is freed at the end


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 16), data=st.data())
def test_any_arrival_pattern_and_chunk_size_gives_every_frame_once(quiet_snac, codec, n, data):
    frames = random_frames(n, seed=n)
    arrivals = data.draw(st.lists(st.integers(0, 5), max_size=n))
    cfg = StreamSettings(warmup_frames=data.draw(st.integers(1, 4)), max_chunk_frames=data.draw(st.integers(1, 8)))
    chunks, stream = feed(codec, frames, cfg, arrivals, chunk_frames=data.draw(st.integers(1, 8)))
    audio = np.concatenate(chunks)
    assert len(audio) == n * F and stream.emitted == n * F
    assert exact_after_join(audio, offline(quiet_snac, frames), stream) <= 1e-5


def test_each_frame_is_decoded_once_in_the_steady_state(codec):
    stream = codec.new_stream(StreamSettings(warmup_frames=4))
    frames = random_frames(60, seed=7)
    before = None
    for i, frame in enumerate(frames):
        stream.push([frame])
        if i == 12:  # well past the warm-up
            before = (codec.counters.frames_decoded, codec.counters.samples_emitted)
        while (job := stream.plan(2, need_audio=stream.emitted == 0)) is not None:  # (the first chunk at once)
            stream.complete(job, codec.decode([job])[0])
    decoded = codec.counters.frames_decoded - before[0]
    emitted = (codec.counters.samples_emitted - before[1]) / F
    assert emitted >= 40 and decoded / emitted <= 1.1
    stream.close()


def test_a_backlog_is_decoded_in_chunks_of_at_most_max_chunk_frames(codec):
    stream = codec.new_stream(StreamSettings(max_chunk_frames=4))
    stream.push(random_frames(1, seed=5))
    first = stream.plan(1, need_audio=True)  # the first chunk: a warm-up decode; the state has taken nothing yet
    stream.complete(first, codec.decode([first])[0])
    stream.push(random_frames(10, seed=6))
    sizes = []
    while (job := stream.plan(1)) is not None:
        sizes.append(job.real)
        stream.complete(job, codec.decode([job])[0])
    assert sizes == [4, 4, 3] and stream.frames_received == 11
    stream.close()


def test_sessions_flushing_together_share_one_call_per_chunk_length(quiet_snac, codec):
    streams = [codec.new_stream(StreamSettings(warmup_frames=1)) for _ in range(6)]
    frames = [random_frames(12, seed=10 + i) for i in range(6)]
    out = [[] for _ in streams]
    calls, rounds = codec.counters.calls, 0
    for n in range(12):
        jobs = []
        for stream, f in zip(streams, frames, strict=True):
            stream.push(f[n : n + 1])
            if n == 11:
                stream.finish()
            if (job := stream.plan(2, need_audio=True)) is not None:
                jobs.append(job)
        if jobs:
            rounds += len({(j.prefix, len(j.frames)) for j in jobs})  # one call per kind and length
            for job, result in zip(jobs, codec.decode(jobs), strict=True):
                out[streams.index(job.stream)].append(job.stream.complete(job, result))
    assert codec.counters.calls - calls == rounds  # all six sessions in one call per round
    assert rounds < 12 + 3  # (a warm-up round decodes prefixes; the last one finishes)
    for chunks, f, stream in zip(out, frames, streams, strict=True):
        ref = offline(quiet_snac, f)
        audio = np.concatenate(chunks)
        assert len(audio) == 12 * F and exact_after_join(audio, ref, stream) <= 1e-5  # batched == alone


def test_many_cancelled_streams_free_every_state(codec):
    # 12 streams decoded in batched calls: more would only cost decoding time (~0.1 s of CPU a stream)
    streams = [codec.new_stream(StreamSettings()) for _ in range(12)]
    for need_audio in (True, False):  # the first chunks (warm-up decodes), then the states take the frames
        jobs = []
        for i, stream in enumerate(streams):
            stream.push(random_frames(2 + i % 3, seed=i))
            jobs.append(stream.plan(2, need_audio))
        for job, result in zip(jobs, codec.decode(jobs), strict=True):
            job.stream.complete(job, result)
    assert len(codec.live) == 12 and all(s.state is not None for s in streams)
    for stream in streams:
        stream.close()  # cancelled
    assert len(codec.live) == 0 and all(s.state is None for s in streams)
    assert all(s.plan(1) is None for s in streams)  # a closed stream plans nothing more


def test_decoder_noise_is_seedable(snac_dir):
    frames = random_frames(5, seed=4)

    def run(seed, noise=True):
        snac = configure_noise(checkpoint.load_snac(snac_dir), noise, seed)  # (the warm-up's offline decode)
        chunks, _ = feed(StreamCodec(StreamingSnac(snac), noise_seed=seed), frames, StreamSettings(), [1] * 5)
        return np.concatenate(chunks)

    a, b, c, quiet = run(3), run(3), run(4), run(None, noise=False)
    assert np.array_equal(a, b)  # the same seed gives the same audio
    assert np.abs(a - c).max() > 1e-4 and np.abs(a - quiet).max() > 1e-4  # another seed, or none, does not


def test_a_streams_state_holds_only_its_own_memory(codec):
    streams = [codec.new_stream(StreamSettings(max_chunk_frames=8)) for _ in range(4)]
    for need_audio in (True, False):  # a first chunk each, then 8 frames each into the states, in one call
        for stream in streams:
            stream.push(random_frames(4, seed=6))
        jobs = [stream.plan(8, need_audio) for stream in streams]
        for job, result in zip(jobs, codec.decode(jobs), strict=True):
            job.stream.complete(job, result)
    for stream in streams:  # not views of the batch's working buffers
        assert sum(t.untyped_storage().nbytes() for t in stream.state) == codec.model.state_bytes
        stream.close()


def test_warm_up_runs_every_chunk_shape_once_and_leaves_nothing_behind(quiet_snac):
    from lyre.codec import CodecError, warm_up

    codec = StreamCodec(StreamingSnac(quiet_snac).eval())
    calls = []
    runner = codec.runner
    codec.runner = lambda *args: calls.append(args[0].shape[1]) or runner(*args)
    warm_up(codec, StreamSettings(warmup_frames=2, max_chunk_frames=4))
    assert set(calls) >= {1, 2, 3, 4}  # every chunk size the first callers will use (and the closing one)
    assert codec.counters.frames_decoded == 0 and codec.counters.samples_emitted == 0 and not codec.live

    def broken(*args):
        raise RuntimeError("no such kernel")

    codec.runner = broken
    with pytest.raises(CodecError, match="warm-up.*no such kernel"):
        warm_up(codec, StreamSettings())


def test_a_stream_whose_state_is_broken_fails_alone_in_its_round(codec):
    """Three streams flush together; one's decoder state is corrupt (its inputs cannot be stacked
    with the others'): that job gets the error, the other two their audio."""
    streams = [codec.new_stream(StreamSettings(warmup_frames=0)) for _ in range(3)]
    for i, s in enumerate(streams):
        s.push(random_frames(6, seed=60 + i))
    first = [s.plan(2, need_audio=True) for s in streams]
    for s, job, result in zip(streams, first, codec.decode(first), strict=True):
        s.complete(job, result)
    streams[1].state = [torch.zeros(1, 1, 1) for _ in codec.model.new_state()]  # the wrong shape
    for s in streams:
        s.push(random_frames(2, seed=70))
    jobs = [s.plan(2) for s in streams]
    results = codec.decode(jobs)
    assert isinstance(results[1], Exception)
    assert not isinstance(results[0], Exception) and not isinstance(results[2], Exception)
