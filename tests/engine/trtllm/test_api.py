"""The fake of TensorRT-LLM's executor bindings held to the real API: a snapshot of the 1.2.1
nanobind signatures (``tests/support/trtllm_api/bindings-1.2.1.json``, read from the sources; the file
says which and how to regenerate it).

- every signature the fake offers is the real one (names, order, keyword-only, defaults), its
  enums have the real members and values, and it has no attribute the real classes lack;
- every call the backend makes, in a run that uses every option it passes, binds to the real
  signature (checked against the snapshot, not the fake), and it reads only real attributes.

Untested here, because it needs a GPU: the post-processor's CUDA branch (logits on the GPU, masks
queued on the executor's stream through ``torch.cuda.ExternalStream(stream_ptr)``).
"""

from __future__ import annotations

import enum
import inspect
import json
from types import SimpleNamespace

import pytest

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from tests.support import fake_trtllm as tle
from tests.support.paths import REPO_ROOT
from tests.support.trtllm import PROMPT, run

SNAPSHOT = json.loads((REPO_ROOT / "tests" / "support" / "trtllm_api" / "bindings-1.2.1.json").read_text())
CLASSES = SNAPSHOT["classes"]
KINDS = {"positional": inspect.Parameter.POSITIONAL_OR_KEYWORD, "keyword_only": inspect.Parameter.KEYWORD_ONLY}
ANY_DEFAULT = object()  # a default-constructed C++ object: the fake may stand for it with None


def real_signature(params: list[dict]) -> inspect.Signature:
    def default(p: dict):
        if p.get("required"):
            return inspect.Parameter.empty
        d = p.get("default")
        return ANY_DEFAULT if isinstance(d, str) and (d.startswith("<default") or "." in d) else d

    return inspect.Signature([inspect.Parameter(p["name"], KINDS[p["kind"]], default=default(p)) for p in params])


def overloads(spec) -> list[inspect.Signature]:
    """The real signature(s) of a callable: a list of parameters, or a list of such lists."""
    if spec and isinstance(spec[0], list):
        return [real_signature(o) for o in spec]
    return [real_signature(spec)]


def same(fake: inspect.Signature, real: inspect.Signature) -> bool:
    fp, rp = list(fake.parameters.values()), list(real.parameters.values())
    return len(fp) == len(rp) and all(
        f.name == r.name and f.kind == r.kind and (r.default is ANY_DEFAULT or f.default == r.default)
        for f, r in zip(fp, rp, strict=True))


def fake_signature(func) -> inspect.Signature:
    sig = inspect.signature(func)
    return sig.replace(parameters=[p for name, p in sig.parameters.items() if name != "self"])


def public_attributes(name: str) -> set[str]:
    return {a.split(" ")[0] for a in CLASSES[name].get("attributes", [])}


# --------------------------------------------------------------------------------------------
# the fake offers the real API


@pytest.mark.parametrize("name", sorted(c for c in CLASSES if CLASSES[c].get("init") and hasattr(tle, c)))
def test_every_constructor_the_fake_offers_has_the_real_signature(name):
    fake = fake_signature(getattr(tle, name).__init__)
    assert any(same(fake, real) for real in overloads(CLASSES[name]["init"])), f"{name}{fake}"


def test_every_executor_method_the_fake_offers_has_the_real_signature():
    methods = CLASSES["Executor"]["methods"]
    offered = [m for m, f in vars(tle.Executor).items() if callable(f) and not m.startswith("_")]
    hooks = {"error_request", "tick"}  # test hooks, documented as such in the fake
    for method in set(offered) - hooks:
        assert method in methods, f"Executor.{method} is not in TensorRT-LLM 1.2.1"
        fake = fake_signature(getattr(tle.Executor, method))
        assert any(same(fake, real) for real in overloads(methods[method])), f"Executor.{method}{fake}"
    assert {"enqueue_request", "await_responses", "cancel_request", "get_latest_iteration_stats",
            "shutdown"} <= set(offered)


def test_the_fake_enums_have_the_real_members():
    faked = [name for name in SNAPSHOT["enums"] if hasattr(tle, name)]
    assert {"ModelType", "CapacitySchedulerPolicy", "FinishReason", "BatchingType"} <= set(faked)
    for name in faked:
        assert {m.name: m.value for m in getattr(tle, name)} == SNAPSHOT["enums"][name], name


def test_the_fake_has_no_attribute_the_real_classes_lack():
    for name in ("Request", "SamplingConfig", "OutputConfig", "SchedulerConfig", "KvCacheConfig",
                 "LogitsPostProcessorConfig", "ExecutorConfig", "Response", "Result"):
        obj = {"Request": lambda: tle.Request([1, 2], 3), "Response": lambda: tle.Response(1, tle.Result()),
               "Result": tle.Result}.get(name, getattr(tle, name))()
        extra = {a for a in vars(obj) if not a.startswith("_")} - public_attributes(name)
        assert not extra, f"fake {name} has {extra}, the real one does not"
    assert not hasattr(tle.Request([1, 2], 3), "priority")  # write-only in the real bindings
    stats = tle.IterationStats()
    for field in ("kv_cache_stats", "inflight_batching_stats"):
        assert SNAPSHOT["stats"]["IterationStats"][field].startswith("optional")
        assert field in vars(stats)
    assert set(vars(tle.KvCacheStats())) <= set(SNAPSHOT["stats"]["KvCacheStats"])
    assert set(vars(tle.InflightBatchingStats())) <= set(SNAPSHOT["stats"]["InflightBatchingStats"])
    assert tle.Request.BATCHED_POST_PROCESSOR_NAME == CLASSES["Request"]["constants"]["BATCHED_POST_PROCESSOR_NAME"]
    assert SNAPSHOT["logits_post_processor_batched"]["args"] == ["req_ids", "logits", "beam_tokens", "stream_ptr",
                                                                 "client_ids"]


# --------------------------------------------------------------------------------------------
# every call the backend makes is a real one


class Recorder:
    """Bindings that check each call against the snapshot's signature before the fake runs it."""

    def __init__(self):
        self.calls: list[str] = []
        self.module = SimpleNamespace(**{n: getattr(tle, n) for n in tle.__all__})
        for name in tle.__all__:
            cls = getattr(tle, name)
            if name in CLASSES and not issubclass(cls, enum.Enum) and CLASSES[name].get("init"):
                setattr(self.module, name, self._checked_class(name, cls))

    def check(self, label: str, spec, args, kwargs) -> None:
        for sig in overloads(spec):
            try:
                sig.bind(*args, **kwargs)
            except TypeError:
                continue
            self.calls.append(label)
            return
        raise AssertionError(f"{label}(*{args}, **{sorted(kwargs)}) matches no TensorRT-LLM 1.2.1 signature")

    def _checked_class(self, name: str, cls: type) -> type:
        recorder = self

        class Checked(cls):
            def __init__(self, *args, **kwargs):
                recorder.check(name, CLASSES[name]["init"], args, kwargs)
                super().__init__(*args, **kwargs)

        Checked.__name__ = name
        if name == "Executor":
            for method, spec in CLASSES["Executor"]["methods"].items():
                if hasattr(cls, method) and not method.startswith("_"):
                    setattr(Checked, method, self._checked_method(method, spec, getattr(cls, method)))
        return Checked

    def _checked_method(self, method: str, spec, func):
        recorder = self

        def checked(executor, *args, **kwargs):
            recorder.check(f"Executor.{method}", spec, args, kwargs)
            return func(executor, *args, **kwargs)

        return checked


def test_every_call_the_backend_makes_binds_to_the_real_signature(tmp_path):
    recorder = Recorder()
    engine = tle.lockstep(TrtllmEngine(TrtllmEngineConfig(str(tmp_path), max_batch_size=4, max_seq_len=128,
                                                          max_input_len=64), bindings=recorder.module))
    try:
        options = [dict(temperature=0.0), dict(temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.2,
                                               min_tokens=7, seed=11),
                   dict(constrain_audio=False, stop_ids=(128258, 128262)), dict(seed=None)]
        for i, sampling in enumerate(options):
            engine.add(GenerationRequest(f"r{i}", list(PROMPT), SamplingParams(max_tokens=14, **sampling), priority=i))
        engine.step()
        engine.cancel("r3")
        run(engine)
        engine.stats()
    finally:
        engine.close()
    used = set(recorder.calls)
    assert {"ExecutorConfig", "SchedulerConfig", "KvCacheConfig", "LogitsPostProcessorConfig", "Executor",
            "SamplingConfig", "OutputConfig", "Request", "Executor.enqueue_request", "Executor.await_responses",
            "Executor.cancel_request", "Executor.get_latest_iteration_stats", "Executor.shutdown"} <= used
