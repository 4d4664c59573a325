"""The 12 Hz decoder in the codec runtime (``lyre.codec.qwen12hz.runtime``): several streams whose
frames arrive in random pieces, planned with random chunk sizes and random listener needs, decoded
together in shared calls, each give exactly the full causal decode of their frames, every frame
decoded once; a stream whose decode fails fails alone."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lyre.codec.base import StreamSettings
from lyre.codec.qwen12hz import Decoder, DecoderConfig
from lyre.codec.qwen12hz.runtime import TwelveHzCodec
from lyre.codec.qwen12hz.warm import WarmUp
from tests.support.qwen_reference import tiny_decoder, tiny_decoder_config

SETTINGS = StreamSettings(first_flush_frames=1, every_flush_frames=2, max_chunk_frames=4)


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    ours = Decoder(DecoderConfig.from_dict(tiny_decoder_config())).eval()
    ours.load_state_dict(tiny_decoder(seed=5).state_dict())
    return ours


def frames(n: int, seed: int) -> list[tuple[int, ...]]:
    g = np.random.default_rng(seed)
    return [tuple(int(x) for x in row) for row in g.integers(0, 64, (n, 16))]


def run(codec: TwelveHzCodec, streams: dict[str, list[tuple[int, ...]]], seed: int,
        warm: dict[str, WarmUp] | None = None) -> dict[str, np.ndarray]:
    """Every stream to its end, the frames arriving in random pieces between rounds."""
    rng = random.Random(seed)
    open_ = {name: codec.new_stream(SETTINGS, warm=(warm or {}).get(name)) for name in streams}
    given = dict.fromkeys(streams, 0)
    audio: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    while any(not s.closed for s in open_.values()):
        for name, stream in open_.items():
            if given[name] < len(streams[name]):
                k = rng.randint(0, 3)
                stream.push(streams[name][given[name] : given[name] + k])
                given[name] += k
                if given[name] >= len(streams[name]):
                    stream.finish()
        jobs = [j for s in open_.values() if (j := s.plan(rng.randint(1, 4), rng.random() < 0.5)) is not None]
        if not jobs:
            codec.warm.settle()  # (a clone's clip being decoded on its own thread)
        for job, result in zip(jobs, codec.decode(jobs), strict=True):
            audio[next(n for n, s in open_.items() if s is job.stream)].append(job.stream.complete(job, result))
    return {name: np.concatenate(parts) for name, parts in audio.items()}


def test_streams_decoded_in_random_pieces_together_are_each_the_full_decode(decoder):
    codec = TwelveHzCodec(decoder)
    streams = {f"s{i}": frames(n, seed=i) for i, n in enumerate((23, 9, 31))}
    got = run(codec, streams, seed=1)
    worst = 0.0
    for name, fs in streams.items():
        with torch.no_grad():
            want = decoder.decode(torch.tensor(fs).T[None])[0, 0].numpy()
        assert got[name].shape == want.shape == (len(fs) * 1920,)
        worst = max(worst, float(np.abs(got[name] - want).max()))
    assert worst <= 1e-5, worst
    assert codec.counters.frames_decoded == sum(map(len, streams.values()))  # each frame once
    assert codec.counters.calls < codec.counters.frames_decoded  # (streams shared calls)
    assert not codec.live and codec.stats().open_states == 0


def test_a_segment_whose_end_comes_after_its_frames_ends_on_a_chunk_marked_last(decoder):
    """End of speech brings no frame: the newest frame waits (unless the listener needs it), so the
    end always has a frame to go out with, the one that ends the segment; a stream whose every frame
    went out before its end is closed at once."""
    codec = TwelveHzCodec(decoder)
    stream = codec.new_stream(SETTINGS)
    stream.push(frames(3, seed=7))
    first = stream.plan(2, need_audio=True)
    assert first.cost == 3
    stream.complete(first, codec.decode([first])[0])  # the first chunk: every frame so far
    stream.push(frames(3, seed=8))
    job = stream.plan(2)  # nobody waits: all but the newest
    assert job.cost == 2 and not job.finishing
    stream.complete(job, codec.decode([job])[0])
    assert stream.plan(2) is None  # the newest waits
    stream.finish()  # (the end, without a frame)
    last = stream.plan(2)
    assert last is not None and last.finishing and last.cost == 1
    stream.complete(last, codec.decode([last])[0])
    assert stream.closed and stream.all_out and stream.emitted == 6 * 1920 and not codec.live
    drained = codec.new_stream(SETTINGS)
    drained.push(frames(2, seed=9))
    job = drained.plan(2, need_audio=True)
    drained.complete(job, codec.decode([job])[0])
    drained.finish()
    assert drained.plan(2) is None and drained.closed and not codec.live  # nothing held: closed


def test_the_first_chunk_waits_for_the_listener_then_comes_at_once(decoder):
    codec = TwelveHzCodec(decoder)
    stream = codec.new_stream(SETTINGS)
    stream.push(frames(1, seed=3))
    assert stream.plan(2, need_audio=False) is None  # nobody waits for audio yet
    job = stream.plan(2, need_audio=True)
    assert job is not None and job.cost == 1  # first audio after the first frame
    pcm = stream.complete(job, codec.decode([job])[0])
    assert len(pcm) == 1920 and stream.all_out and stream.frames_to_exact() == 1


def test_a_stream_whose_decode_fails_fails_alone(decoder):
    codec = TwelveHzCodec(decoder)
    good, bad = codec.new_stream(SETTINGS), codec.new_stream(SETTINGS)
    good.push(frames(2, seed=4))
    bad.push([(10**6,) * 16, (0,) * 16])  # a code outside the codebook
    jobs = [good.plan(2, True), bad.plan(2, True)]
    results = codec.decode(jobs)
    assert isinstance(results[1], Exception) and not isinstance(results[0], Exception)
    assert len(good.complete(jobs[0], results[0])) == 2 * 1920


def test_a_clone_speaks_on_from_its_reference_clip_as_the_reference_decodes_it(decoder):
    """Reference-transcript mode: the audio is the full causal decode of the clip's frames and the
    generated ones as one sequence, the clip's part cut off (the reference's generate_voice_clone).
    The state after the clip is computed once per voice, off the codec's rounds (a stream waits for
    it, the others go on), for every stream of it; deleting the voice drops it, and a stream of the
    deleted voice still running finishes."""
    codec = TwelveHzCodec(decoder)
    clip = np.asarray(frames(11, seed=20))
    other = np.asarray(frames(11, seed=21))
    warm = {"a": WarmUp("v_a:1", clip), "b": WarmUp("v_a:1", clip), "c": WarmUp("v_c:1", other)}
    generated = {name: frames(n, seed=30 + i) for i, (name, n) in enumerate((("a", 14), ("b", 6), ("c", 9)))}

    waiting, plain = codec.new_stream(SETTINGS, warm=warm["a"]), codec.new_stream(SETTINGS)
    for s in (waiting, plain):
        s.push(generated["a"][:2])
    assert waiting.plan(2, need_audio=True) is None and plain.plan(2, need_audio=True) is not None
    codec.warm.settle()
    assert waiting.plan(2, need_audio=True) is not None
    for s in (waiting, plain):
        s.close()

    got = run(codec, generated, seed=3, warm=warm)
    for name, fs in generated.items():
        whole = np.concatenate([warm[name].frames, np.asarray(fs)])
        with torch.no_grad():
            want = decoder.decode(torch.from_numpy(whole).T[None])[0, 0].numpy()[len(clip) * 1920:]
        assert got[name].shape == want.shape
        assert np.abs(got[name] - want).max() <= 1e-5
    with torch.no_grad():  # (the clip changes what follows it)
        cold = decoder.decode(torch.tensor(generated["a"]).T[None])[0, 0].numpy()
    assert np.abs(cold - got["a"]).max() > 1e-3
    assert codec.warm.frames == 2 * len(clip)  # each voice's clip once
    assert codec.counters.frames_decoded == sum(map(len, generated.values()))  # (the clips' audio is unheard)
    assert sorted(codec.warm.keys()) == ["v_a:1", "v_c:1"]

    codec.forget("v_a")
    assert codec.warm.keys() == ["v_c:1"]
    stream = codec.new_stream(SETTINGS, warm=warm["a"])  # (a synthesis of it admitted before the deletion)
    stream.push(generated["b"])
    stream.finish()
    job = stream.plan(4)
    again = stream.complete(job, codec.decode([job])[0])
    assert np.abs(again - got["b"][: len(again)]).max() <= 1e-5
    codec.warm.settle()
    assert codec.warm.keys() == ["v_c:1"]  # (not kept again)
