"""Stages 2-6 of the acceptance run: build the engines, one constrained request through the
Executor, the same prompts through both engines under greedy decoding (plain, then a cloned voice
with the repetition penalty), and the scaling benchmark on the GPU backend.

Each stage returns ``(summary, details, data)`` or raises :class:`StageFailed` with the evidence.
Checkpoints are the demo's random weights in two shapes (``tiny``, ``small``): Orpheus's vocabulary,
tokenizer and prompt layout at a size that builds in minutes, no download; what they prove is
that the path works, not how real Orpheus sounds.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from lyre.engine.base import GenerationRequest, SamplingParams, TokenEngine
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.engine.trtllm.config import TrtllmEngineConfig
from lyre.engine.trtllm.engine import TrtllmEngine
from lyre.engine.trtllm.requests import make_request
from lyre.gpucheck.context import TIMED_OUT, Context, Outcome, generate
from lyre.gpucheck.report import StageFailed
from lyre.model import checkpoint, orpheus
from lyre.tools.build import build_trtllm_engine, plan_build

TEXTS = ("Hello, this is the first test of the engine.", "The quick brown fox jumps over the lazy dog.",
         "Please hold while I transfer your call.", "Your appointment is on Tuesday at three.")
VOICES = ("tara", "leo", "mia", "zac")
PARITY_TOKENS = 7 * 12
# the scaling stage's tokens per request unless --max-tokens: 2 s of audio, so that 64 users' two rounds take
# seconds, not the minutes of the server's 1200 (the stage at 64 users once ran past its time limit)
SCALING_TOKENS = 168
# Two 16-bit implementations may order a pair of logits this close either way: an absolute floor
# plus fp16's relative precision of the larger one (the tiny demo's logits are ~0.3; Orpheus's ~20).
NEAR_TIE_ABS, NEAR_TIE_REL = 0.005, 0.002


Result = tuple[str, list[str], dict[str, Any]]


def builds(ctx: Context) -> list[tuple[str, str]]:
    """(shape, quantization) of each engine: FP8 in every shape, and FP16 of the tiny one for the
    parity stages (no FP8 error between the two engines there)."""
    return [(shape, "fp8") for shape in ctx.shapes] + [("tiny", "fp16")]


def stage_build(ctx: Context) -> Result:
    rows, data = ["| engine | weights | dtype | seconds | size | warnings |", "| --- | --- | --- | --- | --- | --- |"], {}
    for shape, quant in builds(ctx):
        cfg = ctx.config(shape, quant)
        plan = plan_build(cfg, ctx.env, force=True)
        if plan.blockers:
            raise StageFailed(f"{shape}-{quant}: " + "; ".join(plan.blockers), rows)
        started = time.monotonic()
        try:
            manifest = build_trtllm_engine(cfg, plan, progress=False, api=ctx.kit.llmapi(), device=ctx.kit.device)
        except Exception as e:
            raise StageFailed(f"building {shape}-{quant} failed: {type(e).__name__}: {e}", rows) from e
        seconds = time.monotonic() - started
        size = sum(f.stat().st_size for f in plan.engine_dir.rglob("*") if f.is_file())
        ctx.engines[f"{shape}-{quant}"] = (plan.engine_dir, manifest)
        rows.append(f"| {shape}-{quant} | {manifest.quantization} | {manifest.kv_cache_dtype} | {seconds:.0f} | "
                    f"{size / 2**20:.0f} MiB | {'; '.join(plan.warnings) or '-'} |")
        data[f"{shape}-{quant}"] = {"seconds": round(seconds, 1), "bytes": size, "quantization": manifest.quantization,
                                    "dtype": manifest.kv_cache_dtype, "calibration": manifest.calibration}
    return f"{len(builds(ctx))} engines built", rows, data


def _trt_config(ctx: Context, name: str) -> TrtllmEngineConfig:
    if name not in ctx.engines:
        raise StageFailed(f"no {name} engine: the build stage did not run")
    _, manifest = ctx.engines[name]
    return TrtllmEngineConfig.from_config(ctx.config(name.split("-")[0], manifest.quantization), manifest)


def _trt(ctx: Context, name: str) -> TrtllmEngine:
    return TrtllmEngine(_trt_config(ctx, name), bindings=ctx.kit.bindings())


class _ExecutorPenalty(TrtllmEngine):
    """The cloned stage's control: requests carry the executor's own repetition penalty (no window,
    the prompt included), which Lyre never sets."""

    PENALTY = 1.3

    def to_executor_request(self, request: GenerationRequest, client_id: int):
        return make_request(self.tle, request, client_id, self.cfg.max_seq_len, executor_penalty=self.PENALTY)


def _torch(ctx: Context, shape: str, slots: int) -> TorchEngine:
    dtype = torch.float16 if ctx.kit.device == "cuda" else torch.float32
    return TorchEngine.from_checkpoint(ctx.checkpoint(shape) / "llama", TorchEngineConfig(
        slots=slots, max_batch_size=slots, max_seq_len=2048, max_prefill_tokens=2048, device=ctx.kit.device,
        dtype=dtype, kv_dtype=dtype))


def _closing(engine: TokenEngine, requests: list[GenerationRequest], timeout_s: float) -> dict[str, Outcome]:
    try:
        return generate(engine, requests, timeout_s)
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _tokenizer(ctx: Context, shape: str = "tiny"):
    return checkpoint.load_tokenizer(ctx.checkpoint(shape) / "llama")


def illegal_codes(tokens: list[int]) -> list[str]:
    """Every token that is not a code of its frame slot (the prompt ends with start-of-speech)."""
    bad = []
    for k, t in enumerate(tokens):
        lo = orpheus.AUDIO_TOKEN_OFFSET + (k % orpheus.FRAME_TOKENS) * orpheus.CODEBOOK_SIZE
        if not lo <= t < lo + orpheus.CODEBOOK_SIZE:
            bad.append(f"token {k} is {t}, not a code of frame slot {k % 7} ({lo}..{lo + 4095})")
    return bad


def stage_constraint(ctx: Context) -> Result:
    n = 7 * 24
    prompt = orpheus.build_prompt_ids(_tokenizer(ctx), TEXTS[0], "tara")
    request = GenerationRequest("one", prompt, SamplingParams(max_tokens=n, min_tokens=n, seed=1))
    engine = _trt(ctx, "tiny-fp8") if ctx.backend == "trtllm" else _torch(ctx, "tiny", 1)
    started = time.monotonic()
    got = _closing(engine, [request], ctx.timeout_s)["one"]
    seconds = time.monotonic() - started
    details = [f"First frames: `{got.tokens[:14]}`", "", f"{len(got.tokens)} tokens in {seconds:.2f} s"]
    if got.error or got.finish != "length" or len(got.tokens) != n:
        raise StageFailed(f"the request ended {got.finish} after {len(got.tokens)} of {n} tokens: {got.error}", details)
    bad = illegal_codes(got.tokens)
    if bad:
        raise StageFailed(f"{len(bad)} of {n} tokens break the frame-slot constraint: {bad[0]}", details + bad[:10])
    return f"{n} tokens, every one a code of its frame slot", details, {"tokens": n, "seconds": round(seconds, 3)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def near_tie(logit: float) -> float:
    return NEAR_TIE_ABS + NEAR_TIE_REL * abs(logit)


def margin(ref: Outcome, k: int, other: int, penalty: float = 1.0, window: int = 64) -> tuple[float, float]:
    """(gap, tolerance): how far apart, in the reference (PyTorch) engine's logits at step ``k``, its
    choice and ``other`` were (after its repetition penalty; inf when ``other`` could not be sampled
    there), and the near-tie tolerance at that logit."""
    row, ids = ref.logits[k], ref.logits_ids[k]
    recent = set(ref.tokens[max(0, k - window) if window else 0:k]) if penalty != 1.0 else set()

    def value(token: int) -> float:
        at = (ids == token).nonzero()
        if len(at) == 0:
            return float("-inf")
        v = float(row[int(at[0])])
        return (v / penalty if v > 0 else v * penalty) if token in recent else v

    chosen = value(ref.tokens[k])
    return chosen - value(other), near_tie(chosen)


def compare(reference: dict[str, Outcome], tested: dict[str, Outcome], penalty: float = 1.0) -> tuple[list[str], list[str]]:
    """(Markdown rows, failures) comparing each request's tokens; a first difference at a near-tie
    (:func:`near_tie`) is reported, not failed."""
    rows, failures = ["| request | tokens | first difference | margin there |", "| --- | --- | --- | --- |"], []
    for rid, ref in reference.items():
        got = tested[rid]
        if got.error or ref.error:
            failures.append(f"{rid}: ended with an error (torch: {ref.error}; TensorRT-LLM: {got.error})")
            continue
        k = first_difference(ref.tokens, got.tokens)
        if k is None:
            rows.append(f"| {rid} | {len(ref.tokens)} | identical | - |")
            continue
        if k >= min(len(ref.tokens), len(got.tokens)):
            failures.append(f"{rid}: the same {k} tokens, then one engine stopped ({len(ref.tokens)} vs {len(got.tokens)})")
            continue
        m, tolerance = margin(ref, k, got.tokens[k], penalty)
        rows.append(f"| {rid} | {len(ref.tokens)} | token {k}: {ref.tokens[k]} vs {got.tokens[k]} | {m:.4f} |")
        if m > tolerance:
            failures.append(f"{rid}: token {k} is {got.tokens[k]} where the PyTorch engine chose {ref.tokens[k]}, "
                            f"{m:.4f} logits ahead (more than a 16-bit near-tie, {tolerance:.4f})")
    return rows, failures


def _both(ctx: Context, requests: list[GenerationRequest], penalty: float,
          reference: dict[str, Outcome] | None = None) -> Result:
    reference = reference or _closing(_torch(ctx, "tiny", len(requests)), requests, ctx.timeout_s)
    tested = _closing(_trt(ctx, "tiny-fp16"), [GenerationRequest(r.request_id, r.prompt_ids, r.sampling)
                                               for r in requests], ctx.timeout_s)
    rows, failures = compare(reference, tested, penalty)
    if failures:
        raise StageFailed(f"{len(failures)} of {len(requests)} requests differ: {failures[0]}", rows + ["", *failures])
    same = sum("identical" in r for r in rows[2:])
    return (f"{same} of {len(requests)} requests token for token the same"
            + (f", {len(requests) - same} apart only at a near-tie" if same < len(requests) else ""), rows,
            {"identical": same, "requests": len(requests)})


def stage_parity(ctx: Context) -> Result:
    tok = _tokenizer(ctx)
    sampling = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_tokens=PARITY_TOKENS,
                              min_tokens=PARITY_TOKENS)
    requests = [GenerationRequest(f"{v}-{i}", orpheus.build_prompt_ids(tok, t, v), sampling, record_logits=True)
                for i, (t, v) in enumerate(zip(TEXTS, VOICES, strict=True))]
    return _both(ctx, requests, 1.0)


def reference_codes(frames: int = 40, seed: int = 3) -> list[int]:
    """A cloned voice's reference recording as Orpheus codes (seeded; few values, so they repeat)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 16, (frames * orpheus.FRAME_TOKENS,), generator=g).tolist()
    return [orpheus.AUDIO_TOKEN_OFFSET + (k % 7) * orpheus.CODEBOOK_SIZE + v for k, v in enumerate(values)]


def stage_cloned(ctx: Context) -> Result:
    tok = _tokenizer(ctx)
    penalty = 1.3
    sampling = SamplingParams(temperature=0.0, repetition_penalty=penalty, repetition_window=64,
                              max_tokens=PARITY_TOKENS, min_tokens=PARITY_TOKENS)
    requests = [GenerationRequest(f"cloned-{i}", orpheus.build_clone_prompt_ids(
        tok, text, "This is my reference recording.", reference_codes()), sampling, record_logits=True)
        for i, text in enumerate(TEXTS[1:3])]
    reference = _closing(_torch(ctx, "tiny", len(requests)), requests, ctx.timeout_s)
    summary, rows, data = _both(ctx, requests, penalty, reference)
    # the control: the executor's own penalty (the prompt's reference codes included, no window) in
    # place of Lyre's must part from the PyTorch engine, or this stage could not tell them apart
    control = _closing(_ExecutorPenalty(_trt_config(ctx, "tiny-fp16"), bindings=ctx.kit.bindings()), [
        GenerationRequest(r.request_id, r.prompt_ids, replace(r.sampling, repetition_penalty=1.0)) for r in requests],
        ctx.timeout_s)
    control_rows, parted = compare(reference, control, penalty)
    rows += ["", "The PyTorch engine penalises only the last 64 generated tokens, never the prompt "
             "(tests/engine/test_logits_spec.py holds both engines to that); the executor's own penalty, "
             "which would also cover the reference codes in the prompt, is never set.", "",
             "Control: the executor's own penalty instead of Lyre's, the same requests:", "", *control_rows]
    if not parted:
        raise StageFailed("the control (the executor's own penalty, prompt included) gave the PyTorch engine's tokens "
                          "too: this stage cannot tell the two penalties apart on this checkpoint", rows, data)
    data["control_parted"] = len(parted)
    return summary + f" with the windowed penalty; the executor's own penalty parts in {len(parted)}", rows, data


def stage_scaling(ctx: Context) -> Result:
    repo = Path(__file__).resolve().parents[3]
    if not (repo / "benchmark.py").is_file():
        raise StageFailed(f"benchmark.py is not at {repo}: run the acceptance run from a Lyre checkout")
    shape = ctx.shapes[-1]
    root = ctx.checkpoint(shape)
    sets = [f"model.backend={ctx.backend}", f"model.path={root / 'llama'}", f"codec.path={root / 'snac'}",
            "scheduler.max_concurrent_sessions=64", "scheduler.max_batch_size=64", f"data_dir={ctx.work / 'data'}"]
    if ctx.backend == "trtllm":
        if f"{shape}-fp8" not in ctx.engines:
            raise StageFailed(f"no {shape}-fp8 engine: the build stage did not run")
        sets += [f"build.engine_dir={ctx.engines[f'{shape}-fp8'][0]}"]
    argv = [sys.executable, "benchmark.py", "--mode", "scaling", "--levels", ctx.levels,
            "--output", str(ctx.out / "scaling.json"), "--plot", str(ctx.out / "scaling.png")]
    argv += ["--max-tokens", str(ctx.max_tokens or SCALING_TOKENS)]
    for s in sets:
        argv += ["--set", s]
    log = ctx.out / "scaling.log"
    code = ctx.kit.run(argv, log, repo, ctx.scaling_timeout_s)
    details = [f"`{' '.join(argv[1:])}`", "", f"Output: scaling.json, scaling.png, scaling.log (in {ctx.out})"]
    if code == TIMED_OUT:
        tail = log.read_text().splitlines()[-15:] if log.is_file() else []
        raise StageFailed(f"benchmark.py --mode scaling did not finish in {ctx.scaling_timeout_s:.0f} s (stopped; "
                          f"fewer --levels or --max-tokens, or a longer --scaling-timeout)",
                          details + ["", "```", *tail, "```"])
    if code != 0:
        tail = log.read_text().splitlines()[-15:] if log.is_file() else []
        raise StageFailed(f"benchmark.py --mode scaling exited {code}", details + ["", "```", *tail, "```"])
    missing = [f for f in ("scaling.json", "scaling.png") if not (ctx.out / f).is_file()]
    if missing:
        raise StageFailed(f"benchmark.py --mode scaling wrote no {', '.join(missing)}", details)
    return f"levels {ctx.levels} measured on the {ctx.backend} backend ({shape} shape)", details, {"argv": argv}
