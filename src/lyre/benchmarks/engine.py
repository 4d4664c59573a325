"""``benchmark.py --mode engine``: generated tokens per second of the token engine at several
concurrencies, and of ``transformers``' ``generate`` run one request at a time on the same weights
and prompts, in one run; with ``--baseline reference``, the engine's step against the minimal static-KV
step (:mod:`lyre.benchmarks.reference`) at each concurrency, with ``--baseline llamacpp`` against
llama.cpp's batched decoding.

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


def run_llamacpp_levels(cfg: LyreConfig, model_dir: Path, prompts: list[list[int]], params: SamplingParams,
                        concurrency: list[int], progress=print) -> dict[str, Any]:
    """The same prompts and sampling through llama.cpp's batched decoding (``--baseline llamacpp``):
    the checkpoint exported to GGUF (f32, or q8_0 with ``model.quantize: int8``), every level's
    requests decoded together as ``llama-server --parallel`` does, on as many threads as torch uses."""
    from lyre.benchmarks.peer.gguf_export import export_cached
    from lyre.benchmarks.peer.llamacpp import LlamaCpp, PeerSampling, PeerSequence, import_llama_cpp

    import_llama_cpp()  # (before the export: a missing extra is said at once)
    kind = {"none": "f32", "int8": "q8_0"}[cfg.model.quantize]
    progress(f"llama.cpp: exporting {model_dir} to GGUF {kind} (cached under {cfg.data_dir}/peer) ...")
    path = export_cached(model_dir, kind, Path(cfg.data_dir) / "peer")
    llama = LlamaCpp(path, max(concurrency), max(map(len, prompts)) + params.max_tokens + 8,
                     threads=torch.get_num_threads())

    def level(n: int, max_tokens: int) -> dict[str, float]:
        for i, p in enumerate(prompts[:n]):
            llama.admit(PeerSequence(p, PeerSampling(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                repetition_penalty=params.repetition_penalty, max_tokens=max_tokens, seed=i,
                constrain_audio=params.constrain_audio, stop_ids=())))
        tokens, step_s = 0, []
        t0 = time.perf_counter()
        while llama.running:
            s0 = time.perf_counter()
            tokens += llama.step()
            step_s.append(time.perf_counter() - s0)
        elapsed = time.perf_counter() - t0
        return {"concurrency": n, "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
                "step_ms_p50": 1000 * statistics.median(step_s)}

    try:
        level(1, 8)  # warm-up
        levels = []
        for c in concurrency:
            progress(f"llama.cpp: {c} concurrent x {params.max_tokens} tokens ...")
            levels.append(level(c, params.max_tokens))
    finally:
        llama.close()
    return {"gguf": str(path), "type": kind, "threads": llama.threads, "levels": levels}


def run_reference(engine: TorchEngine, engine_cfg: TorchEngineConfig, prompts: list[list[int]], concurrency: list[int],
                  max_tokens: int, levels: list[dict[str, float]], progress=print) -> dict[str, Any]:
    """The reference step (:mod:`lyre.benchmarks.reference`) on the engine's weights at each level, at
    the middle position of the engine's run in a static cache holding the whole run; each level gets
    ``reference_step_ms`` and ``vs_reference`` (the engine's step p50 over it: at most 1 beats it)."""
    from lyre.benchmarks.reference import reference_levels

    longest = max(map(len, prompts)) + max_tokens
    context = -(-longest // 64) * 64
    position = round(statistics.mean(map(len, prompts))) + max_tokens // 2
    steps = reference_levels(engine.model, concurrency, context, position, engine_cfg.kv_dtype, progress)
    for lv in levels:
        lv["reference_step_ms"] = steps[lv["concurrency"]]
        lv["vs_reference"] = lv["step_ms_p50"] / steps[lv["concurrency"]]
    return {"context": context, "position": position, "graphs": engine.model.norm.weight.is_cuda,
            "step_ms": {str(b): ms for b, ms in steps.items()}}


def run(
    cfg: LyreConfig,
    model_dir: Path,
    concurrency: list[int],
    max_tokens: int,
    baseline_requests: int,
    progress=print,
    slot_order: str = "admission",
    baseline: str | None = None,
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
    reference = None
    if baseline == "reference":
        reference = run_reference(engine, engine_cfg, prompts, concurrency, max_tokens, levels, progress)
    sequential = {"requests": 0, "tokens": 0, "seconds": 0.0, "tokens_per_s": 0.0, "skipped": True}
    if baseline_requests:
        progress(f"transformers generate: {baseline_requests} requests one at a time x {max_tokens} tokens ...")
        sequential = run_transformers_sequential(model_dir, prompts[:baseline_requests], params)
    peer = None
    if baseline == "llamacpp":
        peer = run_llamacpp_levels(cfg, model_dir, prompts, params, concurrency, progress)
        by_level = {lv["concurrency"]: lv["tokens_per_s"] for lv in peer["levels"]}
        for lv in levels:
            lv["vs_llamacpp"] = lv["tokens_per_s"] / by_level[lv["concurrency"]]
    return {
        "engine": levels,
        "transformers_sequential": sequential,
        **({"llamacpp": peer} if peer else {}),
        **({"reference": reference} if reference else {}),
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
    peer = {lv["concurrency"]: lv for lv in (result.get("llamacpp") or {}).get("levels", [])}
    one = next((lv["tokens_per_s"] for lv in result["engine"] if lv["concurrency"] == 1), None)
    head = f"{'':<26}{'tokens/s':>10}{'step p50 ms':>13}{'vs 1 concurrent':>17}{'vs transformers':>17}"
    ref = "reference" in result
    lines = [head + (f"{'llama.cpp tok/s':>17}{'vs llama.cpp':>14}" if peer else "")
             + (f"{'reference ms':>14}{'vs reference':>14}" if ref else "")]
    for lv in result["engine"]:
        vs_one = f"{lv['tokens_per_s'] / one:.1f}x" if one else "-"
        vs_base = f"{lv['tokens_per_s'] / base:.1f}x" if base else "-"  # (--baseline-requests 0: no peer run)
        row = (f"{'engine, ' + str(lv['concurrency']) + ' concurrent':<26}{lv['tokens_per_s']:>10.0f}"
               f"{lv['step_ms_p50']:>13.2f}{vs_one:>17}{vs_base:>17}")
        if peer:
            other = peer[lv["concurrency"]]
            row += f"{other['tokens_per_s']:>17.0f}{lv['tokens_per_s'] / other['tokens_per_s']:>13.2f}x"
        if ref:
            row += f"{lv['reference_step_ms']:>14.2f}{lv['vs_reference']:>13.2f}x"
        lines.append(row)
    if base:
        lines.append(f"{'transformers, sequential':<26}{base:>10.0f}{'':>13}{'':>17}{1.0:>16.1f}x")
    if ref:
        r = result["reference"]
        lines.append(f"(reference: the minimal static-KV step on the same weights, {r['context']}-token cache at position "
                     f"{r['position']}, {'one CUDA graph' if r['graphs'] else 'eager'}; vs reference = engine step p50 / "
                     "reference step: at most 1 beats it)")
    if peer:
        lines.append(f"(llama.cpp: {result['llamacpp']['type']} GGUF, {result['llamacpp']['threads']} threads, "
                     "batched decoding of all the level's sequences)")
    return "\n".join(lines)
