"""The TensorRT-LLM backend inside a service: what starts first, and the executor shut down on every
exit path. Over ``tests/support/fake_trtllm.py`` (a FAKE of the executor bindings: no GPU here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

import lyre.engine.trtllm.engine as trtllm_engine
from lyre.engine.backend import Environment, Manifest
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.errors import LyreError
from lyre.service import gpu_memory, runtime
from tests.support import fake_trtllm as tle
from tests.support.model_executor import bindings
from tests.support.paths import REPO_ROOT
from tests.support.services import F, run, service
from tests.support.trtllm import PROMPT

H100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.13.2.6")


@pytest.fixture
def trtllm_service(tmp_path, monkeypatch, demo_dir):
    """A service on the TensorRT-LLM backend over the fake executor (codec on the CPU); ``events``
    records the order in which the codec and the executor start, ``executors`` the executors made."""
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    Manifest(model_source=str(demo_dir / "llama"), model_revision="local", model_sha256="0" * 64,
             tensorrt_llm_version=H100.tensorrt_llm_version, tensorrt_version=H100.tensorrt_version,
             gpu_name=H100.gpu_name, compute_capability=list(H100.compute_capability), quantization="fp8",
             kv_cache_dtype="float16", build={"max_batch_size": 8, "max_seq_len": 512, "max_input_len": 400}
             ).write(engine_dir)
    events: list[str] = []
    executors: list[tle.Executor] = []

    class RecordedExecutor(tle.Executor):
        def __init__(self, *args):
            super().__init__(*args)
            events.append("executor")
            executors.append(self)

    codec = runtime._codec

    def recorded_codec(*args):
        out = codec(*args)
        events.append("codec")
        return out

    fake = bindings(RecordedExecutor)
    monkeypatch.setattr(trtllm_engine, "load_bindings", lambda: fake)
    monkeypatch.setattr(runtime, "probe_environment", lambda: H100)
    monkeypatch.setattr(runtime, "_codec", recorded_codec)
    tts = service(**{"model.backend": "trtllm", "build.engine_dir": str(engine_dir), "codec.device": "cpu"})
    return tts, events, executors


def test_the_codec_is_loaded_and_warmed_up_before_the_executor_takes_its_kv_cache(trtllm_service):
    tts, events, executors = trtllm_service

    async def go():
        async with tts:
            return await tts.synthesize("Hello there", voice="tara", seed=2)

    audio = run(go())
    assert events == ["codec", "executor"]  # the executor sizes its KV cache from what the codec left free
    assert len(audio.pcm) == 6 * F
    kv = executors[0].config.kv_cache_config
    assert kv.max_tokens == 8 * 512  # every slot full (the manifest's max_batch_size x max_seq_len), no more
    assert executors[0]._shut  # closed with the service


def test_an_engine_built_for_another_gpu_is_refused_before_the_codec_loads(trtllm_service, monkeypatch):
    tts, events, _ = trtllm_service
    monkeypatch.setattr(runtime, "probe_environment", lambda: Environment("NVIDIA L4", (8, 9), "1.2.1", "10.14.1.48"))

    async def go():
        async with tts:
            pass

    with pytest.raises(LyreError, match="does not match this machine"):
        run(go())
    assert events == []  # nothing loaded for an engine that cannot run


def test_close_from_two_threads_at_once_shuts_the_executor_down_once_and_ends_what_was_running(tmp_path):
    engine = TrtllmEngine(TrtllmEngineConfig(str(tmp_path)), bindings=tle)
    shutdowns = []
    gate = threading.Barrier(2)
    shutdown = engine.executor.shutdown

    def counted():
        shutdowns.append(threading.current_thread().name)
        shutdown()

    engine.executor.shutdown = counted
    assert engine.add(GenerationRequest("live", PROMPT, SamplingParams(max_tokens=500, min_tokens=500)))
    closers = [threading.Thread(target=lambda: (gate.wait(), engine.close())) for _ in range(2)]
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    assert len(shutdowns) == 1
    ended = engine.step()  # the engine thread's next step after a close under it (at interpreter exit)
    assert [(d.request_id, d.finished, d.finish_reason) for d in ended] == [("live", True, "error")]
    assert "closed" in ended[0].error and not engine.has_work()
    with pytest.raises(ValueError, match="closed"):
        engine.add(GenerationRequest("late", PROMPT))


def test_a_start_that_fails_after_the_engine_is_built_shuts_the_executor_down(trtllm_service, monkeypatch):
    tts, events, executors = trtllm_service

    def broken(*args, **kwargs):
        raise LyreError("simulated failure after the engine was built")

    monkeypatch.setattr(runtime, "Scheduler", broken)

    async def go():
        async with tts:
            pass

    with pytest.raises(LyreError, match="simulated failure"):
        run(go())
    assert events == ["codec", "executor"] and executors[0]._shut


def test_a_shutdown_whose_drain_fails_still_shuts_the_executor_down(trtllm_service):
    tts, _, executors = trtllm_service

    async def go():
        async with tts:
            stream = tts.stream("A sentence long enough to be still speaking at shutdown.", voice="tara", seed=4,
                                max_tokens=420)
            await stream.__anext__()
            engine = tts.scheduler.engine

            def failing_step(order=None):
                raise RuntimeError("simulated executor fault while draining")

            engine.step = failing_step
            await tts.aclose()

    run(go())
    assert executors[0]._shut


def test_an_engine_nobody_closed_is_shut_down_at_interpreter_exit(tmp_path):
    script = textwrap.dedent(f"""
        from lyre.engine.trtllm.config import TrtllmEngineConfig
        from lyre.engine.trtllm.engine import TrtllmEngine
        from tests.support import fake_trtllm as tle

        tle.Executor.shutdown = lambda self: print("executor shut down", flush=True)
        engine = TrtllmEngine(TrtllmEngineConfig({str(tmp_path)!r}), bindings=tle)
        print("leaving without close()", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["leaving without close()", "executor shut down"]


def test_the_gpu_memory_split_is_reported_part_by_part(monkeypatch):
    gib = 1 << 30
    free = iter([70 * gib, 69 * gib, 9 * gib])  # at start, after the codec, after the engine
    monkeypatch.setattr(gpu_memory.torch.cuda, "is_available", lambda: True)  # (no GPU here: its readings)
    monkeypatch.setattr(gpu_memory.torch.cuda, "mem_get_info", lambda: (next(free), 80 * gib))
    memory = gpu_memory.GpuMemory.now()
    memory.mark("the codec")
    memory.mark("the TensorRT-LLM engine")
    assert memory.describe() == ("GPU memory: 70.00 of 80.00 GiB free at start; the codec 1.00 GiB; "
                                 "the TensorRT-LLM engine 60.00 GiB; 9.00 GiB left free")
