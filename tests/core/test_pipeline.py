"""The audio half of a step: least slack first within the round's budget, chunks that grow with
slack, decode faults contained to the stream that causes them — over the real streaming codec (demo SNAC, noise off)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lyre.codec import StreamSettings, configure_noise
from lyre.codec.stream import StreamCodec
from lyre.codec.streaming import StreamingSnac
from lyre.core.pipeline import AudioPipeline
from lyre.core.session import ACTIVE, ChunkEvent, Segment, Session
from lyre.engine.base import SamplingParams
from lyre.model import checkpoint, orpheus
from tests.support.codec import random_frames

F = orpheus.SAMPLES_PER_FRAME
FRAME_S = F / orpheus.SAMPLE_RATE


@pytest.fixture(scope="module")
def model(snac_dir):
    return StreamingSnac(configure_noise(checkpoint.load_snac(snac_dir), False)).eval()


def session(name: str, pipeline: AudioPipeline, events: list) -> Session:
    s = Session(name, [Segment([1])], SamplingParams(), events.append, created=0.0, status=ACTIVE)
    pipeline.open(s.segments[0])
    return s


def past_warmup(pipeline: AudioPipeline, s: Session, frames: int = 6) -> None:
    """Push and decode ``frames`` frames so that the stream emits exact audio; the listener has played
    what it got."""
    s.segments[0].decoder.push(random_frames(frames, seed=hash(s.session_id) % 1000))
    while pipeline.finish([s], now=1.0).busy:
        pass
    s.played_s = s.audio_seconds


def test_when_a_round_is_full_the_sessions_with_least_slack_are_decoded_first(model):
    settings = StreamSettings(every_flush_frames=1, max_chunk_frames=1, warmup_frames=1)
    pipeline = AudioPipeline(StreamCodec(model), settings, max_round_frames=1)
    events = {name: [] for name in ("far", "near", "mid", "new")}
    sessions = {name: session(name, pipeline, ev) for name, ev in events.items()}
    for name in ("far", "near", "mid"):
        past_warmup(pipeline, sessions[name])
    for name, slack in (("far", 1.5), ("near", 0.2), ("mid", 0.8)):
        sessions[name].played_s = sessions[name].audio_seconds - slack
    for ev in events.values():
        ev.clear()
    for s in sessions.values():
        s.segments[0].decoder.push(random_frames(1, seed=99))
    served = []
    for _ in range(5):  # one frame per round (the new session's state also takes its frame after its warm-up decode)
        pipeline.finish(list(sessions.values()), now=2.0)
        served += [name for name, ev in events.items() if any(isinstance(e, ChunkEvent) for e in ev) and name not in served]
    assert served == ["new", "near", "mid", "far"]  # waiting for its first audio, then least slack; nothing dropped


@pytest.mark.parametrize("slack_s,frames", [(None, 2), (0.0, 2), (0.35, 2), (0.7, 4), (1.4, 8), (30.0, 8)])
def test_chunks_grow_with_the_audio_the_listener_holds(model, slack_s, frames):
    pipeline = AudioPipeline(StreamCodec(model), StreamSettings(every_flush_frames=2, max_chunk_frames=8))
    s = session("s", pipeline, [])
    if slack_s is not None:
        s.start_clock(0.0)
        s.audio_samples = int(slack_s * orpheus.SAMPLE_RATE)
    assert pipeline.chunk_frames(s, now=0.0) == frames


class Poisoned:
    """Fault injection around the real runner: a call that holds the poisoned frames raises."""

    def __init__(self, model, frames):
        self.model = model
        self.poison = torch.from_numpy(orpheus.frames_to_codes(frames)[0])  # its coarse codes (c,)
        self.armed = False

    def __call__(self, c0, *rest):
        if self.armed and any(torch.equal(row, self.poison) for row in c0):
            raise RuntimeError("simulated codec fault")
        return self.model(c0, *rest)


def test_a_decode_fault_fails_only_the_stream_that_causes_it(model):
    poison = random_frames(4, seed=1)
    runner = Poisoned(model, poison)
    pipeline = AudioPipeline(StreamCodec(model, runner), StreamSettings(warmup_frames=1), max_round_frames=64)
    a, b, c, d = (session(n, pipeline, []) for n in "abcd")
    for s in (a, b, c):
        past_warmup(pipeline, s)
    a.segments[0].decoder.push(poison)  # a and b decode in one batched call: a's frames make it fail
    b.segments[0].decoder.push(random_frames(4, seed=2))
    d.segments[0].decoder.push(random_frames(1, seed=3))  # its first chunk: a warm-up decode, another call
    runner.armed = True
    chunks = {s.session_id: s.chunks for s in (b, c, d)}
    out = pipeline.finish([a, b, c, d], now=1.0)
    assert [(s.session_id, "simulated codec fault" in why) for s, why in out.failed] == [("a", True)]
    assert b.chunks == chunks["b"] + 1 and d.chunks == chunks["d"] + 1  # the call was retried without a
    c.segments[0].decoder.push(random_frames(4, seed=4))  # c was not in that round: it decodes as usual
    out = pipeline.finish([c], now=1.0)
    assert not out.failed and c.chunks == chunks["c"] + 1


def test_a_session_whose_frames_wait_for_the_codec_is_backlogged(model):
    pipeline = AudioPipeline(StreamCodec(model), StreamSettings(max_chunk_frames=2), max_round_frames=64)
    s = session("s", pipeline, [])
    s.segments[0].decoder.push(random_frames(7, seed=4))
    assert not pipeline.backlogged(s)  # 7 frames: within two chunks and the decoder's lookahead
    s.segments[0].decoder.push(random_frames(1, seed=5))
    assert pipeline.backlogged(s)  # its tokens can wait: the scheduler leaves it out of the next step
    while pipeline.finish([s], now=1.0).busy and pipeline.backlogged(s):
        pass
    assert not pipeline.backlogged(s)


def test_with_overlap_the_codec_decodes_on_its_own_thread_and_delivers_every_frame(model, snac_dir):
    from lyre.codec import configure_noise
    from tests.support.codec import offline

    pipeline = AudioPipeline(StreamCodec(model), StreamSettings(warmup_frames=1), overlap=True)
    events: list = []
    s = session("s", pipeline, events)
    frames = random_frames(10, seed=8)
    finished = []
    for i, frame in enumerate(frames):
        s.segments[0].decoder.push([frame])
        if i == len(frames) - 1:
            s.segments[0].decoder.finish()
        finished += pipeline.finish([s], now=1.0 + i).finished  # delivers the last round's, hands over the next
        pipeline.wait()
    for _ in range(4):
        finished += pipeline.finish([s], now=20.0).finished
        pipeline.wait()
    pipeline.shutdown()
    audio = np.concatenate([e.pcm for e in events if isinstance(e, ChunkEvent)])
    assert len(audio) == 10 * F and s in finished
    ref = offline(configure_noise(checkpoint.load_snac(snac_dir), False), frames)
    join = s.segments[0].decoder.provisional_end + 256
    assert np.abs(audio[join:] - ref[join:]).max() <= 1e-5 * np.abs(ref).max()


def test_ended_sessions_free_their_decoder_state(model):
    codec = StreamCodec(model)
    pipeline = AudioPipeline(codec, StreamSettings(), max_round_frames=64)
    sessions = [session(f"s{i}", pipeline, []) for i in range(20)]
    for s in sessions:
        s.segments[0].decoder.push(random_frames(2, seed=3))
    pipeline.finish(sessions, now=1.0)
    assert len(codec.live) == 20
    for s in sessions:
        pipeline.close(s)
    assert len(codec.live) == 0


@pytest.mark.parametrize("first_chunk,frame_s,first_at", [
    ("eager", 0.200, 1),  # at flush_first_n_tokens, whatever the pace
    ("bridge", 0.005, 1),  # a fast stream: the first frame's audio lasts until exact audio follows
    ("bridge", 0.040, 2),  # ~2x real time: wait for a second frame
    ("bridge", 0.200, 4),  # slower than real time: no first chunk would last; at most warmup_frames
])
def test_the_first_chunk_waits_until_it_can_last_when_asked_to_bridge(model, first_chunk, frame_s, first_at):
    settings = StreamSettings(first_flush_frames=1, every_flush_frames=2, warmup_frames=4)
    pipeline = AudioPipeline(StreamCodec(model), settings, max_round_frames=64, first_chunk=first_chunk)
    s = session("s", pipeline, [])
    for n in range(1, 6):
        s.segments[0].decoder.push(random_frames(1, seed=n))
        s.tokens, s.first_token_at, s.last_token_at = 7 * n, 0.0, frame_s * (7 * n - 1) / 7  # its pace so far
        pipeline.finish([s], now=frame_s * n)
        if s.chunks:
            break
    assert s.chunks == 1 and s.segments[0].decoder.frames_received == first_at
    assert s.audio_samples == first_at * F - settings.holdback  # one chunk: all the frames so far


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_lone_streams_first_chunk_waits_for_the_codecs_pace_however_many_lanes_it_has(model, parallel):
    """The codec decodes ~2 frames while a frame's audio plays (40 ms a frame); generation is fast.
    A lone stream's call is never split, so 2 lanes do not make its frames come faster: the first
    chunk waits for a second frame either way."""
    settings = StreamSettings(first_flush_frames=1, every_flush_frames=2, warmup_frames=4)
    codec = StreamCodec(model, parallel=parallel)
    pipeline = AudioPipeline(codec, settings, max_round_frames=64)
    s = session("s", pipeline, [])
    for n in range(1, 6):
        s.segments[0].decoder.push(random_frames(1, seed=n))
        s.tokens, s.first_token_at, s.last_token_at = 7 * n, 0.0, 0.005 * (7 * n - 1) / 7
        pipeline.frame_cost_s = 0.040  # (the codec's recent pace, as measured: held here)
        pipeline.finish([s], now=0.005 * n)
        if s.chunks:
            break
    codec.close()
    assert s.chunks == 1 and s.segments[0].decoder.frames_received == 2


def test_what_batch_rounds_cost_does_not_hold_a_live_first_chunk_back(model):
    """Batch rounds (many frames, beside the batch lane's long steps) cost more a frame than a live
    round: a live session's first chunk is planned from what live rounds cost."""
    settings = StreamSettings(first_flush_frames=1, every_flush_frames=2, warmup_frames=4)
    pipeline = AudioPipeline(StreamCodec(model), settings, max_round_frames=64)
    s = session("s", pipeline, [])
    for n in range(1, 6):
        s.segments[0].decoder.push(random_frames(1, seed=n))
        s.tokens, s.first_token_at, s.last_token_at = 7 * n, 0.0, 0.005 * (7 * n - 1) / 7
        pipeline.frame_cost_s, pipeline.live_frame_cost_s = 0.040, 0.005  # (the recent paces, as measured: held)
        pipeline.finish([s], now=0.005 * n)
        if s.chunks:
            break
    assert s.chunks == 1 and s.segments[0].decoder.frames_received == 1  # as fast as a live round decodes
