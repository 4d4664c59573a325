"""``benchmark.py --mode engine``: generated tokens per second of the token engine at several
concurrencies, and of ``transformers``' ``generate`` run one request at a time on the same weights
and prompts, in one run.

Both sides sample with the configured parameters and ignore stop tokens so every request produces
exactly ``max_tokens`` tokens. The engine runs with as many slots and as large a batch as the
highest concurrency, so each level runs all its requests together.

``slot_order="shuffled"`` hands ``step()`` the live requests in a new random order every step, as
the deadline scheduler does (its order follows playback slack, not slots): attention then sees
its sequences' slots in any order.
"""

from __future__ import annotations

import platform
import random
import statistics
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lyre.config import LyreConfig
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.model import checkpoint, orpheus
from lyre.model.sample_texts import TEXT_SETS

TEXTS = TEXT_SETS["conversational"]


def _prompts(model_dir: Path, cfg: LyreConfig, n: int) -> list[list[int]]:
    tokenizer = checkpoint.load_tokenizer(model_dir)
    voices = cfg.model.voices
    return [orpheus.build_prompt_ids(tokenizer, TEXTS[i % len(TEXTS)], voices[i % len(voices)]) for i in range(n)]


SLOT_ORDERS = ("admission", "shuffled")


def run_engine_level(engine: TorchEngine, prompts: list[list[int]], params: SamplingParams, tag: str,
                     slot_order: str = "admission") -> dict[str, float]:
    """Run all ``prompts`` together to completion (those beyond the free slots as slots come free);
    tokens/s and per-step times. ``slot_order``: see the module doc."""
    waiting = deque(GenerationRequest(f"{tag}-{i}", p, replace(params, seed=i)) for i, p in enumerate(prompts))
    live: list[str] = []
    shuffle = random.Random(0).shuffle
    tokens, step_s = 0, []
    t0 = time.perf_counter()
    while waiting or engine.has_work():
        while waiting and engine.add(waiting[0]):
            live.append(waiting.popleft().request_id)
        order = None
        if slot_order == "shuffled":
            shuffle(live)
            order = live
        s0 = time.perf_counter()
        deltas = engine.step(order)
        step_s.append(time.perf_counter() - s0)
        tokens += sum(len(d.token_ids) for d in deltas)
        ended = {d.request_id for d in deltas if d.finished}
        live = [rid for rid in live if rid not in ended]
    elapsed = time.perf_counter() - t0
    return {
        "concurrency": len(prompts),
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "step_ms_p50": 1000 * statistics.median(step_s),
    }


def run_transformers_sequential(model_dir: Path, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = 0
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        torch.manual_seed(i)
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=params.max_tokens,
                min_new_tokens=params.max_tokens,
                do_sample=params.temperature > 0,
                temperature=params.temperature or None,
                top_p=params.top_p,
                top_k=params.top_k or None,
                repetition_penalty=params.repetition_penalty,
                pad_token_id=orpheus.PAD,
            )
        tokens += out.shape[1] - len(p)
    elapsed = time.perf_counter() - t0
    return {"requests": len(prompts), "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}


def run(
    cfg: LyreConfig,
    model_dir: Path,
    concurrency: list[int],
    max_tokens: int,
    baseline_requests: int,
    progress=print,
    slot_order: str = "admission",
) -> dict[str, Any]:
    top = max(concurrency)
    engine_cfg = replace(TorchEngineConfig.from_config(cfg), slots=top, max_batch_size=top)
    engine = TorchEngine.from_checkpoint(model_dir, engine_cfg)
    params = SamplingParams.from_config(cfg.sampling, max_tokens=max_tokens, stop_ids=())
    prompts = _prompts(model_dir, cfg, top)
    run_engine_level(engine, prompts[:1], replace(params, max_tokens=8), "warmup")
    levels = []
    for c in concurrency:
        progress(f"engine: {c} concurrent x {max_tokens} tokens ...")
        levels.append(run_engine_level(engine, prompts[:c], params, f"c{c}", slot_order))
    progress(f"transformers generate: {baseline_requests} requests one at a time x {max_tokens} tokens ...")
    baseline = run_transformers_sequential(model_dir, prompts[:baseline_requests], params)
    return {
        "engine": levels,
        "transformers_sequential": baseline,
        "settings": {
            "checkpoint": str(model_dir),
            "max_tokens": max_tokens,
            "slot_order": slot_order,
            "sampling": {k: v for k, v in params.__dict__.items() if k != "stop_ids"},
            "device": engine_cfg.device,
            "dtype": str(engine_cfg.dtype),
            "kv_dtype": str(engine_cfg.kv_dtype),
        },
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
    }


def table(result: dict[str, Any]) -> str:
    base = result["transformers_sequential"]["tokens_per_s"]
    one = next((lv["tokens_per_s"] for lv in result["engine"] if lv["concurrency"] == 1), None)
    lines = [f"{'':<26}{'tokens/s':>10}{'step p50 ms':>13}{'vs 1 concurrent':>17}{'vs transformers':>17}"]
    for lv in result["engine"]:
        vs_one = f"{lv['tokens_per_s'] / one:.1f}x" if one else "-"
        vs_base = f"{lv['tokens_per_s'] / base:.1f}x" if base else "-"  # (--baseline-requests 0: no peer run)
        lines.append(
            f"{'engine, ' + str(lv['concurrency']) + ' concurrent':<26}{lv['tokens_per_s']:>10.0f}"
            f"{lv['step_ms_p50']:>13.2f}{vs_one:>17}{vs_base:>17}"
        )
    lines.append(f"{'transformers, sequential':<26}{base:>10.0f}{'':>13}{'':>17}{1.0:>16.1f}x")
    return "\n".join(lines)
