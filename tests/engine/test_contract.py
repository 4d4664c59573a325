"""The ``TokenEngine`` contract, run against every backend.

- ``torch``: the PyTorch engine on the demo checkpoint; ``torch-on-device``: the same with its audio rows
  decoded and sampled by the on-device step (which a GPU captures as CUDA graphs), run here eagerly;
- ``trtllm-fake-bindings``: the TensorRT-LLM engine over ``tests/support/fake_trtllm.py`` (a FAKE of the
  executor bindings: what the adapter does with them, not what a GPU does);
- ``trtllm``: the TensorRT-LLM engine over the real library. It needs a CUDA GPU, TensorRT-LLM and
  a built engine (``LYRE_TEST_ENGINE_DIR``, default ``build.engine_dir``); without them it is
  skipped and the skip reason says which are missing (pytest -ra prints it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lyre.config import load_config
from lyre.engine.backend import BackendError, check_manifest, probe_environment, select_backend
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.model import orpheus
from tests.support import fake_trtllm
from tests.support.engines import make_engine

CAPACITY = 4
PROMPT = [orpheus.START_OF_HUMAN, 400, 25, 376, *orpheus.PROMPT_SUFFIX]


def real_trtllm_engine():
    cfg = load_config(None)
    engine_dir = Path(os.environ.get("LYRE_TEST_ENGINE_DIR", cfg.build.engine_dir))
    env = probe_environment()
    try:
        select_backend("trtllm", engine_dir, env)
        manifest = check_manifest(engine_dir, env)
    except BackendError as e:
        pytest.skip(f"TensorRT-LLM backend not testable here: {str(e).split('. Use ')[0]}")
    return TrtllmEngine(TrtllmEngineConfig.from_config(cfg, manifest))


@pytest.fixture(params=["torch", "torch-on-device", "trtllm-fake-bindings", "trtllm"])
def engine(request, demo_dir, tmp_path):
    if request.param.startswith("torch"):
        e = make_engine(demo_dir / "llama", slots=CAPACITY, max_batch_size=CAPACITY, max_seq_len=128,
                        static_decode=request.param == "torch-on-device")
    elif request.param == "trtllm-fake-bindings":
        e = fake_trtllm.lockstep(TrtllmEngine(TrtllmEngineConfig(str(tmp_path), max_batch_size=CAPACITY,
                                                                  max_seq_len=128), bindings=fake_trtllm))
    else:
        e = real_trtllm_engine()
    yield e
    if hasattr(e, "close"):
        e.close()


def drain(engine, max_steps=5000, on_step=None, order=None) -> dict[str, list]:
    out: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        deltas = engine.step(order)
        if on_step:
            on_step(deltas)
        for d in deltas:
            out.setdefault(d.request_id, []).append(d)
    raise AssertionError("the engine did not finish")


def tokens(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def request(rid: str, n: int, seed: int | None = None, **kw) -> GenerationRequest:
    return GenerationRequest(rid, list(PROMPT), SamplingParams(max_tokens=n, min_tokens=n, seed=seed, **kw))


def test_a_request_streams_exactly_max_tokens_and_finishes_once(engine):
    engine.add(request("a", 21, seed=1))
    out = drain(engine)["a"]
    assert len(tokens(out)) == 21
    assert [d.finished for d in out].count(True) == 1 and out[-1].finished and out[-1].finish_reason == "length"
    s = engine.stats()
    assert (s.active, s.waiting) == (0, 0) and s.total_tokens >= 21 and not engine.has_work()


def test_more_requests_than_capacity_all_finish_without_exceeding_it(engine):
    waiting = [request(f"r{i}", 14, seed=i) for i in range(CAPACITY * 2 + 1)]
    assert [engine.add(r) for r in waiting] == [True] * CAPACITY + [False] * (CAPACITY + 1)
    del waiting[:CAPACITY]
    assert engine.stats().capacity == CAPACITY
    out: dict[str, list] = {}
    peaks = []
    while waiting or engine.has_work():
        assert len(peaks) < 5000, "the engine did not finish"
        while waiting and engine.add(waiting[0]):  # the caller keeps what was refused and retries
            waiting.pop(0)
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
        peaks.append(engine.stats().active)
    assert max(peaks) <= CAPACITY
    assert all(len(tokens(out[f"r{i}"])) == 14 for i in range(CAPACITY * 2 + 1))


def test_add_returns_false_when_every_slot_is_held_and_queues_nothing(engine):
    for i in range(CAPACITY):
        assert engine.add(request(f"r{i}", 7, seed=i)) is True
    assert engine.add(request("extra", 7, seed=9)) is False
    s = engine.stats()
    assert (s.active, s.waiting, s.total_requests) == (CAPACITY, 0, CAPACITY)
    out = drain(engine)
    assert "extra" not in out and sorted(out) == [f"r{i}" for i in range(CAPACITY)]
    assert engine.add(request("extra", 7, seed=9)) is True  # the same id: nothing of it was kept
    assert len(tokens(drain(engine)["extra"])) == 7


def test_a_freed_slot_is_taken_by_the_next_add(engine):
    engine.add(request("short", 3, seed=1))
    for i in range(1, CAPACITY):
        engine.add(request(f"long{i}", 60, seed=i))
    assert not engine.add(request("next", 7, seed=5))
    for _ in range(200):
        if any(d.request_id == "short" and d.finished for d in engine.step()):
            break
    assert engine.add(request("next", 7, seed=5)) is True
    assert engine.add(request("one-too-many", 7, seed=6)) is False
    for i in range(1, CAPACITY):
        engine.cancel(f"long{i}")
    out = drain(engine)
    assert len(tokens(out["next"])) == 7 and "one-too-many" not in out


def test_step_accepts_an_order_and_ignores_unknown_ids(engine):
    engine.add(request("a", 14, seed=1))
    engine.add(request("b", 21, seed=2))
    out = drain(engine, order=["b", "no-such-request", "a"])
    assert len(tokens(out["a"])) == 14 and len(tokens(out["b"])) == 21


def test_cancel_ends_a_request_with_nothing_after_it(engine):
    engine.add(request("keep", 28, seed=1))
    engine.add(request("drop", 100, seed=2))
    early = [d for _ in range(3) for d in engine.step()]
    engine.cancel("drop")
    out = drain(engine)
    for d in reversed(early):
        out.setdefault(d.request_id, []).insert(0, d)
    assert out["drop"][-1].finished and out["drop"][-1].finish_reason == "cancelled"
    assert len(tokens(out["drop"])) < 100
    assert len(tokens(out["keep"])) == 28 and engine.stats().active == 0


def test_invalid_requests_are_refused_and_leave_no_trace(engine):
    for bad in (GenerationRequest("empty", []), GenerationRequest("vocab", [10**9]),
                GenerationRequest("params", list(PROMPT), SamplingParams(temperature=-1))):
        with pytest.raises(ValueError):
            engine.add(bad)
    assert not engine.has_work() and engine.stats().active == 0


def test_a_seeded_request_repeats_its_tokens(engine):
    engine.add(request("x", 14, seed=42))
    first = tokens(drain(engine)["x"])
    engine.add(request("y", 14, seed=42))
    assert tokens(drain(engine)["y"]) == first


def test_constrained_tokens_are_codes_of_their_frame_slot(engine):
    engine.add(request("c", 28, seed=7))
    c = tokens(drain(engine)["c"])
    assert all(orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * 4096 <= t < orpheus.AUDIO_TOKEN_OFFSET + (k % 7 + 1) * 4096
               for k, t in enumerate(c))
