"""The acceptance run's Qwen3-TTS stage: on the GPU, the talker's decode step and the code
predictor's frame, captured as CUDA graphs (never run before this stage), compute what the same
code computes eagerly: the same greedy frames for requests of different lengths, one admitted
mid-run (its prefill between captured steps) and one held out of a few steps (its slot a gap row);
and the steps' time both ways. On the Qwen3-TTS demo checkpoint (tiny, random weights), bfloat16.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from lyre.engine.qwen3.engine import QwenEngine
from lyre.engine.qwen3.request import CodeSampling, FrameRequest, talker_sampling
from lyre.engine.torch.engine import TorchEngineConfig
from lyre.family.qwen3tts import QwenFamily
from lyre.family.qwen3tts.demo import ensure_demo
from lyre.family.qwen3tts.tokenizer import load_text_tokenizer
from lyre.gpucheck.context import Context
from lyre.gpucheck.report import StageFailed
from lyre.model.qwen3tts import read_qwen3tts_config

TEXTS = ("Hello, this is the first test of the engine.", "Please hold while I transfer your call.",
         "Your appointment is on Tuesday at three.", "Thank you for calling.", "One moment, please.",
         "The quick brown fox jumps over the lazy dog.")
SPEAKERS = ("vivian", "ryan", "aiden", "serena", "sohee", "dylan")
FRAMES = 40
LATE, HELD = 8, (14, 17)  # a request admitted at step 8; the first held out of steps 14-16


def _requests(family: QwenFamily, tokenizer: Any, names: list[str]) -> list[FrameRequest]:
    out = []
    for i, name in enumerate(names):
        prompt = family.prompt(tokenizer, TEXTS[i % len(TEXTS)], SPEAKERS[i % len(SPEAKERS)], "english")
        sampling = talker_sampling(family.cfg, temperature=0, repetition_penalty=1.0, min_tokens=FRAMES,
                                   max_tokens=FRAMES - 6 * (i % 3))
        out.append(FrameRequest(name, [], sampling, prompt=prompt, code_sampling=CodeSampling(temperature=0)))
    return out


def scenario(engine: QwenEngine, family: QwenFamily, tokenizer: Any) -> tuple[dict[str, list[int]], float, int]:
    """(each request's codes, seconds in steps, steps)."""
    *first, late = _requests(family, tokenizer, ["a", "b", "c", "d", "e", "f"])  # (f is admitted at step LATE)
    for r in first:
        if not engine.add(r):
            raise StageFailed(f"the engine refused request {r.request_id}")
    codes: dict[str, list[int]] = {}
    steps, seconds = 0, 0.0
    while engine.has_work():
        order = ["b", "c", "d", "e", "f"] if HELD[0] <= steps < HELD[1] else None
        started = time.perf_counter()
        deltas = engine.step(order)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - started
        for d in deltas:
            if d.error:
                raise StageFailed(f"request {d.request_id} failed: {d.error}")
            codes.setdefault(d.request_id, []).extend(d.token_ids)
        steps += 1
        if steps == LATE and not engine.add(late):
            raise StageFailed("the engine refused the late request")
    return codes, seconds, steps


def stage_qwen(ctx: Context) -> tuple[str, list[str], dict[str, Any]]:
    path = ensure_demo((ctx.checkpoints or ctx.work) / "qwen3-demo-tiny")
    on_gpu = ctx.kit.device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    config = TorchEngineConfig(slots=8, max_batch_size=8, max_seq_len=512, max_prefill_tokens=512,
                               device=ctx.kit.device, dtype=dtype, kv_dtype=dtype)
    family, tokenizer = QwenFamily(read_qwen3tts_config(path)), load_text_tokenizer(path)
    runs = {}
    for name, graphs in (("eager", False), ("graphs", on_gpu)):
        engine = QwenEngine.from_checkpoint(path, config, static_decode=True, graphs=graphs)
        runs[name] = (*scenario(engine, family, tokenizer), engine)
    (want, eager_s, n), (got, graph_s, _) = runs["eager"][:3], runs["graphs"][:3]
    engine = runs["graphs"][3]
    captured, cp = len(engine.static._captured), len(engine.sampler.loop._captured)  # (a failed capture raises)
    details = [f"{len(want)} requests, {sum(len(c) for c in want.values()) // 16} frames in {n} steps",
               f"eager static steps: {1000 * eager_s / n:.2f} ms a step; captured: {1000 * graph_s / n:.2f} ms a step",
               f"graphs captured: {captured} talker (slot x length buckets), {cp} code predictor (batch x width)"]
    bad = [k for k in want if got.get(k) != want[k]]
    if got.keys() != want.keys() or bad:
        first = bad[0] if bad else "?"
        raise StageFailed(f"the captured steps' frames differ from the eager ones (request {first})", details)
    speedup = eager_s / graph_s if graph_s else 0.0
    return (f"the captured steps make the eager steps' frames ({captured} + {cp} graphs; {speedup:.1f}x the eager "
            f"step's speed)", details, {"steps": n, "eager_ms_per_step": round(1000 * eager_s / n, 3),
                                        "graph_ms_per_step": round(1000 * graph_s / n, 3),
                                        "talker_graphs": captured, "code_predictor_graphs": cp})
