"""Faults stay with their request: a fault that hits one session — the engine refusing it, its
sampling, its prefill, its decode step, routing its tokens, planning or running its codec decode,
delivery to its consumer — ends that session alone. Through the real TorchEngine and codec on the demo checkpoint;
the fault is injected by wrapping the real method so it raises only for the poisoned session ("s1"),
which shares its steps (and codec rounds) with the two others."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lyre.codec.stream import ExactStream
from lyre.errors import SynthesisFailed
from lyre.model import orpheus
from tests.support.engines import poison
from tests.support.services import F, engine_state, run, service

SETTINGS = {"codec.overlap": "off", "codec.warmup_frames": 1}  # the first chunk: one frame
CALLERS = [{"text": "The first caller.", "seed": 1}, {"text": "The poisoned caller.", "seed": 2},
           {"text": "The third caller.", "seed": 3}]  # sessions s0, s1, s2
POISONED = "s1"
REASONS = {  # the poisoned session's failure, stage by stage
    "add": "the engine could not take the request: RuntimeError: simulated add fault",
    "sampling": "engine error: RuntimeError: simulated sampling fault",
    "prefill": "engine error: RuntimeError: simulated prefill fault",
    "decode": "engine error: RuntimeError: simulated decode fault",
    "route": "its tokens could not be decoded: RuntimeError: simulated route fault",
    "codec": "audio decode failed: RuntimeError: simulated codec fault",
    "plan": "audio planning failed: RuntimeError: simulated plan fault",
}


def inject(tts, stage: str, monkeypatch) -> None:
    engine, codec = tts.scheduler.engine, tts.scheduler.audio.codec
    fault = RuntimeError(f"simulated {stage} fault")

    def poisoned_session():
        return tts.scheduler.active.get(POISONED)

    if stage == "add":
        add = engine.add

        def refusing_add(request):
            if request.request_id.startswith(POISONED + "#"):
                raise fault
            return add(request)

        monkeypatch.setattr(engine, "add", refusing_add)
    elif stage in ("sampling", "prefill", "decode"):
        poison(monkeypatch, engine, stage, f"{POISONED}#0", after=14)
    elif stage == "route":
        feed = orpheus.AudioTokenParser.feed

        def failing_feed(parser, ids):
            s = poisoned_session()
            if s is not None and parser is s.segments[0].parser and s.tokens >= 14:
                raise fault
            return feed(parser, ids)

        monkeypatch.setattr(orpheus.AudioTokenParser, "feed", failing_feed)
    elif stage == "codec":
        results = codec._results  # (after the call: a failing call is retried stream by stream)

        def failing_decode(group, rows, *args):
            s = poisoned_session()
            if s is not None and any(group[r].stream is s.segments[0].decoder for r in rows):
                raise fault
            return results(group, rows, *args)

        monkeypatch.setattr(codec, "_results", failing_decode)
    elif stage == "plan":
        original = ExactStream.plan

        def failing_plan(stream, *args):
            s = poisoned_session()
            if s is not None and stream is s.segments[0].decoder and s.audio_samples > 0:
                raise fault
            return original(stream, *args)

        monkeypatch.setattr(ExactStream, "plan", failing_plan)


async def audio_of(stream) -> np.ndarray | str:
    """The stream's whole audio, or why it failed."""
    try:
        return np.concatenate([c.pcm async for c in stream])
    except SynthesisFailed as e:
        return str(e)


async def closed_loop_stream(tts, **request):
    """A stream whose caller's event loop has closed: delivering to it raises RuntimeError."""
    def open_in_another_loop():
        async def make():
            return tts.stream(**request)

        return asyncio.run(make())  # the loop closes here, the session lives on

    return await asyncio.to_thread(open_in_another_loop)


@pytest.fixture(scope="module")
def clean() -> list[np.ndarray]:
    """Every caller's audio without a fault."""
    async def go():
        async with service(**SETTINGS) as tts:
            return await asyncio.gather(*(audio_of(tts.stream(**c)) for c in CALLERS))

    return run(go())


def assert_same_audio(audio, reference: np.ndarray) -> None:
    """Every sample (6 frames: the whole utterance), and the same audio: only the first chunk, whose
    provisional audio depends on when it was cut, and int16 rounding of batched decodes may differ."""
    assert isinstance(audio, np.ndarray), audio
    assert len(audio) == len(reference) == 6 * F
    join = F + 256  # the first chunk and its crossfade
    assert np.abs(audio[join:].astype(np.int32) - reference[join:]).max() <= 4


@pytest.mark.parametrize("stage", [*REASONS, "sink"])
def test_a_fault_in_one_session_fails_it_alone(stage, clean, monkeypatch):
    async def go():
        async with service(**SETTINGS) as tts:
            inject(tts, stage, monkeypatch)
            streams = [tts.stream(**CALLERS[0]),
                       await closed_loop_stream(tts, **CALLERS[1]) if stage == "sink" else tts.stream(**CALLERS[1]),
                       tts.stream(**CALLERS[2])]
            read = [0, 2] if stage == "sink" else [0, 1, 2]  # nobody reads a stream whose caller is gone
            results = dict(zip(read, await asyncio.gather(*(audio_of(streams[i]) for i in read)), strict=True))
            monkeypatch.undo()
            after = await audio_of(tts.stream("A caller after the fault.", seed=4))
            exposition = tts.metrics.exposition().decode()
            return results, after, await engine_state(tts), tts._loop.alive, exposition

    results, after, state, alive, exposition = run(go())
    for i in (0, 2):  # the others: all of their audio, as without the fault
        assert_same_audio(results[i], clean[i])
    if stage == "sink":
        assert 'lyre_sessions_total{outcome="delivery_failed"} 1.0' in exposition
    else:
        assert results[1] == REASONS[stage]
    assert alive and isinstance(after, np.ndarray) and len(after) == 6 * F  # the loop serves on
    assert state == {"active": 0, "pending": 0, "requests": 0, "engine_active": 0, "engine_ids": 0,
                     "free_slots": 8, "gate": 0, "codec_states": 0}


def test_a_caller_cancelled_while_its_call_runs_on_the_engine_thread_gets_no_late_answer(caplog):
    """The answer of a call whose caller was cancelled meanwhile is dropped quietly (setting it on the
    cancelled future raised InvalidStateError inside the event loop), and the loop goes on."""
    import threading

    async def go():
        async with service(**SETTINGS) as tts:
            inside, release = threading.Event(), threading.Event()

            def slow():
                inside.set()
                assert release.wait(30)
                return "late"

            caller = asyncio.ensure_future(tts._loop.call(slow))
            assert await asyncio.to_thread(inside.wait, 30)
            caller.cancel()
            release.set()
            after = await tts._loop.call(lambda: "next")  # (answered after the late one was handed over)
            await asyncio.sleep(0)
            return caller.cancelled(), after

    assert run(go()) == (True, "next")
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]


def test_a_message_that_raises_does_not_stop_the_engine_loop():
    async def go():
        async with service(**SETTINGS) as tts:
            assert tts._loop.post(lambda: 1 / 0)  # e.g. an answer to a caller whose event loop has closed
            return await audio_of(tts.stream(**CALLERS[0])), tts._loop.alive

    audio, alive = run(go())
    assert alive and isinstance(audio, np.ndarray) and len(audio) == 6 * F
