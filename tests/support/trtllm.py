"""The TensorRT-LLM engine over the fake executor, and a loop that runs it."""

from __future__ import annotations

from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.model import orpheus
from tests.support import fake_trtllm as tle

PROMPT = [orpheus.START_OF_HUMAN, 400, 25, 376, *orpheus.PROMPT_SUFFIX]  # ends with start-of-speech


def make(tmp_path, **config) -> TrtllmEngine:
    """An engine over the fake bindings, one fake executor iteration per step()."""
    return tle.lockstep(TrtllmEngine(TrtllmEngineConfig(str(tmp_path), **config), bindings=tle))


def run(engine, max_steps=2000) -> dict[str, list]:
    out: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
    raise AssertionError("the engine did not finish")


def tokens(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def req(rid, max_tokens=14, prompt=PROMPT, priority=0, **sampling) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens, **sampling), priority=priority)
