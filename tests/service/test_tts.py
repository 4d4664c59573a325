"""The library API end to end on the demo checkpoint: TTSService.stream / synthesize."""

from __future__ import annotations

import asyncio
import random
import threading

import numpy as np
import pytest
import torch

from lyre.codec import configure_noise
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.errors import (
    ControlTokenInText,
    InvalidRequest,
    LyreError,
    OutOfRange,
    OverloadedError,
    ServiceUnavailable,
    SynthesisCancelled,
    SynthesisFailed,
    TextTooLong,
    UnknownVoice,
)
from lyre.model import checkpoint, orpheus
from tests.support.services import F, engine_state, run, service


def test_stream_delivers_int16_chunks_back_to_back_with_metrics():
    async def go():
        async with service() as tts:
            stream = tts.stream("Hello world", voice="tara", seed=3)
            chunks = [c async for c in stream]
            await tts.on_engine_thread(lambda: None)  # barrier: the step that ended it has published
            return chunks, stream.metrics, tts.stats(), tts.metrics.exposition().decode()

    chunks, metrics, stats, exposition = run(go())
    assert all(c.pcm.dtype == np.int16 and c.sample_rate == 24000 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert [c.offset_samples for c in chunks] == list(np.cumsum([0] + [len(c.pcm) for c in chunks[:-1]]))
    total = sum(len(c.pcm) for c in chunks)
    assert total == 6 * F  # 42 tokens = 6 frames, every one delivered
    assert metrics.tokens == 42 and metrics.audio_seconds == total / 24000 and metrics.ttfb_ms > 0
    assert metrics.real_time_factor > 0 and metrics.chunks == len(chunks)
    assert stats.scheduler.total_sessions == 1 and stats.kv_cache.used_slots == 0
    assert stats.total_tokens == 42 and stats.scheduler.max_concurrent == 8
    assert stats.as_dict()["scheduler"]["total_sessions"] == 1  # seed 004's /v1/stats JSON
    assert "lyre_ttfb_seconds_count 1.0" in exposition and "lyre_tokens_total 42.0" in exposition


def test_streamed_audio_equals_an_offline_decode_of_the_same_tokens(demo_dir, snac_dir):
    text, seed = "Hello there, how are you?", 11

    async def go():
        async with service(**{"codec.warmup_frames": 1, "sampling.max_tokens": 84,
                              "watermark.enabled": False}) as tts:  # the codec's own output, unmarked
            return await tts.synthesize(text, voice="leo", seed=seed), tts.tokenizer

    audio, tokenizer = run(go())
    # The same request through the engine alone gives the same tokens (seeded sampling is batch-independent).
    engine = TorchEngine.from_checkpoint(demo_dir / "llama", TorchEngineConfig(slots=1, max_batch_size=1, max_seq_len=512))
    prompt = orpheus.build_prompt_ids(tokenizer, text, "leo")
    engine.add(GenerationRequest("x", prompt, SamplingParams(max_tokens=84, min_tokens=84, seed=seed)))
    tokens = []
    while engine.has_work():
        tokens += [t for d in engine.step() for t in d.token_ids]
    frames = orpheus.AudioTokenParser().feed(tokens)
    snac = configure_noise(checkpoint.load_snac(snac_dir), enabled=False)  # the service's: the narrow one
    with torch.inference_mode():
        ref = snac.decode([torch.from_numpy(c)[None] for c in orpheus.frames_to_codes(frames)])[0, 0].numpy()
    ref16 = (np.clip(ref, -1, 1) * 32767).round()
    assert len(audio.pcm) == len(frames) * F == len(ref)
    join = F + 256  # the first chunk and its crossfade
    assert np.abs(audio.pcm[join:].astype(np.float64) - ref16[join:]).max() <= 4  # int16 steps: 1e-4 of full scale
    assert audio.metrics.tokens == 84


def test_bad_requests_raise_typed_errors_at_once():
    async def go():
        async with service(**{"scheduler.max_concurrent_sessions": 1, "scheduler.max_batch_size": 1,
                              "scheduler.max_pending": 0}) as tts:
            with pytest.raises(UnknownVoice, match="unknown voice 'bob'; available voices: tara"):
                tts.stream("hi", voice="bob")
            with pytest.raises(InvalidRequest, match="empty"):
                tts.stream("  ")
            with pytest.raises(TextTooLong, match="300 characters; the 'conversational' profile accepts at most 250"):
                tts.stream("x" * 300)
            with pytest.raises(InvalidRequest, match="unknown option 'warmth'; allowed: temperature"):
                tts.stream("hi", warmth=3)
            with pytest.raises(ControlTokenInText, match=r"'<\|eot_id\|>' at characters 6-16, which the model reads as a "
                                                     "control token"):
                tts.stream("hello <|eot_id|> world")
            with pytest.raises(OutOfRange, match="'temperature' = -1 is out of range: must be >= 0.0 and <= 5.0"):
                tts.stream("hi", temperature=-1)
            # wrongly typed values never reach the engine thread (seed=1.5 used to kill it)
            for bad, message in [({"seed": 1.5}, "'seed' must be an integer, got 1.5"),
                                 ({"top_k": 1.5}, "'top_k' must be an integer"),
                                 ({"seed": 10**400}, "'seed' = 1000.* is out of range"),
                                 ({"temperature": float("nan")}, "'temperature' must be a finite number"),
                                 ({"top_p": float("inf")}, "'top_p' must be a finite number"),
                                 ({"max_tokens": True}, "'max_tokens' must be an integer, got True"),
                                 ({"voice": ["tara"]}, "'voice' must be a string"),
                                 # values the sampler cannot honour are refused before the engine sees them
                                 ({"top_p": 1e-45}, r"'top_p' = 1e-45 is out of range: must be >= 0.001"),
                                 ({"temperature": 1e-40}, r"0 \(greedy\) or at least 0.01"),
                                 ({"min_tokens": 50, "max_tokens": 10}, "'min_tokens' = 50 is more than 'max_tokens'"),
                                 ({"max_tokens": 100000}, r"'max_tokens' = 100000 is out of range \(the request's, or its text's cap\): with this prompt "
                                                          r"\(\d+ tokens\) a slot of kv_cache.max_seq_len \d+ tokens "
                                                          r"holds at most \d+")]:
                with pytest.raises(InvalidRequest, match=message):
                    tts.stream("hi", **bad)
            with pytest.raises(InvalidRequest, match="'text' is not valid Unicode"):
                tts.stream("hi \ud800")
            with pytest.raises(InvalidRequest, match="'text' must be a string"):
                tts.stream(b"hi")
            assert tts.gate.inside == 0
            first = tts.stream("hi", seed=1)
            with pytest.raises(OverloadedError) as info:
                tts.stream("hi again")
            assert info.value.retry_after_s > 0
            assert [c async for c in first]  # the admitted one still completes
            assert len([c async for c in tts.stream("now there is room")]) > 0
            return tts.metrics.exposition().decode()

    assert 'lyre_rejections_total{reason="overloaded"} 1.0' in run(go())


def test_long_text_is_split_into_segments_joined_without_gaps():
    text = ("Thanks for calling the support line, your call matters to us. " * 8).strip()  # ~500 chars

    async def go():
        async with service(**{"profile": "longform", "sampling.max_tokens": 21, "watermark.enabled": False}) as tts:
            stream = tts.stream(text, seed=2)
            chunks = [c async for c in stream]
            return chunks, stream.metrics

    chunks, metrics = run(go())
    assert metrics.segments == 2
    pcm = np.concatenate([c.pcm for c in chunks])
    assert len(pcm) == 2 * 3 * F  # each segment's frames, back to back
    assert [c.offset_samples for c in chunks] == list(np.cumsum([0] + [len(c.pcm) for c in chunks[:-1]]))
    join = 3 * F
    assert abs(int(pcm[join - 1])) < 300 and abs(int(pcm[join])) < 300  # faded to meet near zero: no click


def test_random_cancels_and_disconnects_leave_every_slot_free():
    threads_before = set(threading.enumerate())  # (a thread of an earlier test, e.g. tqdm's monitor, may end meanwhile)

    async def go():
        rng = random.Random(0)
        async with service(**{"sampling.max_tokens": 14, "scheduler.max_pending": 64}) as tts:
            async def client(i):
                stream = tts.stream(f"caller {i}", seed=i)
                mode = rng.choice(["read", "break", "cancel", "abandon"])
                try:
                    if mode == "cancel":
                        stream.cancel()
                        return "cancel"
                    async for _ in stream:
                        if mode == "break" or (mode == "abandon" and rng.random() < 0.5):
                            break  # the client goes away mid-stream
                    return mode
                finally:
                    await stream.aclose()

            modes = await asyncio.gather(*[client(i) for i in range(64)])  # 8 times the slots: queued ones too
            state = await engine_state(tts)
            return modes, state

    modes, state = run(go())
    assert {"read", "break", "cancel"} <= set(modes)
    assert state == {"active": 0, "pending": 0, "requests": 0, "engine_active": 0, "engine_ids": 0,
                     "free_slots": 8, "gate": 0, "codec_states": 0}  # every decoder state freed too
    left = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert left == []  # the engine thread is gone, nothing left behind


def test_a_transient_engine_fault_is_retried_request_by_request_and_fails_nobody():
    async def go():
        async with service(**{"sampling.max_tokens": 70}) as tts:
            engine = tts.scheduler.engine
            real = engine.model.forward
            calls = {"n": 0}

            def forward_failing_once(*a, **k):  # fault injection on the engine thread
                calls["n"] += 1
                if calls["n"] == 3:
                    raise RuntimeError("simulated device fault")
                return real(*a, **k)

            await tts.on_engine_thread(lambda: setattr(engine.model, "forward", forward_failing_once))
            victims = [tts.stream(f"victim {i}", seed=i) for i in range(2)]
            outcomes = []
            for v in victims:
                try:
                    async for _ in v:
                        pass
                    outcomes.append("ok")
                except SynthesisFailed as e:
                    outcomes.append(str(e))
            later = await tts.synthesize("after the fault", seed=9)
            return outcomes, later, await engine_state(tts)

    outcomes, later, state = run(go())
    assert outcomes == ["ok", "ok"]  # the failed step ran again one request at a time, and worked
    assert len(later.pcm) == 10 * F
    assert state["active"] == 0 and state["free_slots"] == 8


def test_if_the_engine_loop_dies_open_streams_fail_at_once_and_new_ones_are_refused():
    async def go():
        async with service(**{"sampling.max_tokens": 700, "sampling.min_tokens": 700,
                              "kv_cache.max_seq_len": 1024}) as tts:
            stream = tts.stream("keep talking", seed=1)
            await stream.__anext__()

            def broken_step():  # fault injection: a bug inside the scheduler's step
                raise RuntimeError("simulated scheduler bug")

            await tts.on_engine_thread(lambda: setattr(tts.scheduler, "step", broken_step))
            with pytest.raises(SynthesisFailed, match="engine loop stopped: RuntimeError: simulated scheduler bug"):
                async for _ in stream:
                    pass
            assert not tts.ready
            with pytest.raises(ServiceUnavailable):
                tts.stream("anyone there?")

    run(go())


def test_trtllm_backend_that_cannot_run_here_is_refused_naming_what_is_missing(tmp_path):
    async def go():
        async with service(**{"model.backend": "trtllm", "build.engine_dir": str(tmp_path / "none")}):
            pass

    with pytest.raises(LyreError) as err:
        run(go())
    message = str(err.value)
    assert "no CUDA GPU" in message and "tensorrt-llm" in message and "build_engine.py" in message
    assert "model.backend=torch" in message


def test_auto_backend_without_an_engine_serves_with_torch_and_says_why(tmp_path):
    async def go():
        async with service(**{"build.engine_dir": str(tmp_path / "none")}) as tts:
            await tts.synthesize("Hello there.")
            return tts.backend, tts.stats().as_dict()["engine"]

    choice, engine_stats = run(go())
    assert choice.name == "torch" and "no engine is built" in choice.reason
    assert engine_stats["backend"] == "torch"


def test_cancelled_stream_raises_for_a_consumer_still_reading():
    async def go():
        async with service(**{"sampling.max_tokens": 700, "kv_cache.max_seq_len": 1024}) as tts:
            stream = tts.stream("a long one", seed=1)
            first = await stream.__anext__()
            tts._cancel(stream.session_id)  # e.g. the server cancels it (barge-in on another socket)
            with pytest.raises(SynthesisCancelled):
                async for _ in stream:
                    pass
            return first, await engine_state(tts)

    first, state = run(go())
    assert len(first.pcm) > 0 and state["active"] == 0


def test_an_engine_built_for_another_gpu_or_model_is_refused_at_load(tmp_path):
    from lyre.engine.backend import BackendChoice, Environment, Manifest
    from lyre.service import runtime

    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    Manifest(model_source="canopylabs/orpheus-3b-0.1-ft@main", model_revision="abc", model_sha256="0" * 64,
             tensorrt_llm_version="1.2.1", tensorrt_version="10.13.2.6", gpu_name="NVIDIA H100 80GB HBM3",
             compute_capability=[9, 0], quantization="fp8", kv_cache_dtype="float16").write(engine_dir)
    cfg = service(**{"build.engine_dir": str(engine_dir)}).config
    model = checkpoint.resolve_model(cfg.model, cfg.codec)
    trtllm = BackendChoice("trtllm", "built")
    a10g = Environment("NVIDIA A10G", (8, 6), "1.2.1", "10.13.2.6")
    with pytest.raises(LyreError, match="GPU: built for NVIDIA H100.*this machine has NVIDIA A10G.*rebuild"):
        runtime.build_engine(cfg, trtllm, a10g, model)
    h100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.13.2.6")
    with pytest.raises(LyreError, match="resolve to the demo checkpoint: set model.path"):
        runtime.build_engine(cfg, trtllm, h100, model)  # the manifest matches, but the tokenizer would be the demo's


def test_one_accounts_many_streams_do_not_starve_anothers_few():
    """Six long streams of one account, read as fast as they come, and one short stream of another:
    the short one is spoken to its end while the long ones go on. (The batch's seats and the codec's
    round are shared by accounts: per session, the many streams, always short of audio, came first
    in the codec every round, and the other account's stream never got past its first chunk.)"""
    async def go():
        async with service(**{"server.api_keys": {"ka": "attacker", "kv": "victim"}, "sampling.max_tokens": 420,
                              "scheduler.max_concurrent_sessions": 8}) as tts:
            speaking = asyncio.Event()
            flood = [tts.stream("A long answer that goes on.", account="attacker") for _ in range(6)]
            readers = [asyncio.get_running_loop().create_task(_read_all(s, speaking)) for s in flood]
            await speaking.wait()  # the flood is speaking
            victim = [c async for c in tts.stream("Mine.", account="victim", max_tokens=42, min_tokens=42)]
            still = sum(not r.done() for r in readers)
            for s in flood:
                s.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            return victim, still

    victim, still = run(go())
    assert sum(len(c.pcm) for c in victim) == 6 * 2048  # all of it
    assert still == 6  # while every long stream was still going


async def _read_all(stream, speaking: asyncio.Event) -> None:
    async for _ in stream:
        speaking.set()
