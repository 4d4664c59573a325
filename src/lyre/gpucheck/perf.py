"""Stage perf of the acceptance run: Lyre's pace on this GPU, in one run of a few minutes.

1. The engine against the reference step (``benchmark.py --mode engine --baseline reference``): the
   Orpheus-3B shape with random weights made on the GPU (a shape checkpoint: nothing large written,
   nothing downloaded), the engine's step p50 against the minimal static-KV step's at every level.
2. Real-time streams through the service (``TTSService``: scheduler, sampling, SNAC on the GPU,
   streaming to in-process listeners whose players start at the first chunk): streams started
   together at rising counts, then Poisson arrivals; TTFB p50/p95 and late chunks (underruns).
3. The same streams of Qwen3-TTS-1.7B's shape (random weights made on the GPU, bfloat16, the released
   12 Hz decoder's size), against its own goal (first audio p95 <= 80 ms).

The goals (issue 46) are checked and said met or missed; a missed goal does not fail the stage (it
measured what it set out to), an error does. On a CPU (the test suite) the same code runs a tiny
plan.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lyre.benchmarks import engine as engine_bench
from lyre.benchmarks import service as service_bench
from lyre.config import LyreConfig, load_config
from lyre.family.qwen3tts import demo as qwen_demo
from lyre.gpucheck.context import Context
from lyre.gpucheck.report import git_commit
from lyre.model import demo
from lyre.service.tts import TTSService

ENGINE_VS_REFERENCE = 1.15  # the engine's step over the reference step, at most, at every level
TTFB_P95_MS = 100.0  # what a stream counts as held at: TTFB p95 at most this, no late chunk
STREAMS_GOAL = {"H200": 200, "H100": 150}  # real-time Orpheus-3B streams by card
QWEN_FIRST_AUDIO_P95_MS, QWEN_STREAMS_GOAL = 80.0, 200  # real-time Qwen3-TTS-1.7B streams, any of those cards


@dataclass(frozen=True)
class Plan:
    shape: str = "3b"
    dtype: str = "float16"
    levels: tuple[int, ...] = (1, 16, 64, 128, 256)  # engine against reference
    engine_tokens: int = 128
    max_seq_len: int = 512  # the longest prompt (~40) and stream: ~380 positions; 256 slots of 3B K/V: 14 GiB
    prefill_tokens: int = 2048  # a step's prompt tokens (scheduler.max_prefill_tokens): 64 prompts a step
    stream_levels: tuple[int, ...] = (64, 128, 192, 256)  # started together
    stream_tokens: int = 343  # 49 frames: 4.2 s of audio each
    poisson_rate: float = 40.0  # arrivals a second: ~170 open at once at 4.2 s a stream
    poisson_seconds: float = 8.0
    cuda_graphs: bool = True
    qwen_shape: str = "1.7b"  # Qwen3-TTS-1.7B's shape (random weights made on the GPU), bfloat16
    qwen_frames: int = 52  # 4.2 s of audio a stream
    qwen_max_seq_len: int = 256  # prompt rows (~40) and frames

    @classmethod
    def for_device(cls, device: str) -> Plan:
        if device == "cuda":
            return cls()
        # a CPU (the test suite): the same code on the tiny demo, briefly
        return cls(shape="tiny", dtype="float32", levels=(1, 2), engine_tokens=14, max_seq_len=256,
                   prefill_tokens=512, stream_levels=(1, 2), stream_tokens=14, poisson_rate=4.0, poisson_seconds=0.5,
                   qwen_shape="tiny", qwen_frames=6, qwen_max_seq_len=128)


@dataclass
class Goal:
    what: str
    goal: str
    measured: str
    met: bool


@dataclass
class PerfResult:
    plan: dict[str, Any]
    machine: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)
    streams: list[dict[str, Any]] = field(default_factory=list)
    poisson: dict[str, Any] = field(default_factory=dict)
    qwen: dict[str, Any] = field(default_factory=dict)  # {"streams": [...], "poisson": {...}}: Qwen3-TTS's
    goals: list[Goal] = field(default_factory=list)


def machine(ctx: Context) -> dict[str, Any]:
    gpu = ctx.kit.gpu() if ctx.kit.device == "cuda" else None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit(Path(__file__).resolve().parents[3]), "host": platform.node(),
            "gpu": gpu, "driver": _driver(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version()}


def _driver() -> str | None:
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def perf_config(ctx: Context, plan: Plan, llama_dir: Path, sessions: int) -> LyreConfig:
    snac = ctx.checkpoint("tiny") / "snac"  # (the demo's SNAC: the real 24 kHz architecture, random weights)
    return load_config(None, {
        "model.path": str(llama_dir), "codec.path": str(snac), "model.backend": "torch",
        "model.device": ctx.kit.device, "codec.device": ctx.kit.device, "model.dtype": plan.dtype,
        "kv_cache.dtype": plan.dtype, "kv_cache.max_seq_len": plan.max_seq_len,
        "scheduler.max_prefill_tokens": plan.prefill_tokens,
        "engine.cuda_graphs": plan.cuda_graphs, "scheduler.max_concurrent_sessions": sessions,
        "scheduler.max_batch_size": sessions, "scheduler.max_pending": 4 * sessions,
        "sampling.max_tokens": plan.stream_tokens, "sampling.min_tokens": plan.stream_tokens,
        "data_dir": str(ctx.work / "perf-data")})


def stage_perf(ctx: Context) -> tuple[str, list[str], dict[str, Any]]:
    plan = Plan.for_device(ctx.kit.device)
    result = PerfResult(asdict(plan), machine(ctx))

    def saved(phase: str) -> None:  # (every phase's figures kept as soon as measured: a later crash loses none)
        result.goals = goals(result)
        (ctx.out / "perf.json").write_text(json.dumps(asdict(result), indent=2, default=str) + "\n")
        _say(f"perf: {phase} measured ({ctx.out / 'perf.json'})")

    llama_dir = demo.write_shape_checkpoint(ctx.work / f"shape-{plan.shape}", plan.shape)
    cfg = perf_config(ctx, plan, llama_dir, max(plan.levels))
    result.engine = engine_bench.run(cfg, llama_dir, list(plan.levels), plan.engine_tokens, 0, progress=_say,
                                     baseline="reference")
    _free()
    saved("the engine against the reference step")
    _say(f"perf: Orpheus-{plan.shape} streams through the service ...")
    result.streams, result.poisson = asyncio.run(_streams(perf_config(ctx, plan, llama_dir, max(plan.stream_levels)),
                                                          plan, plan.stream_tokens))
    _free()
    saved("Orpheus streams")
    _say(f"perf: Qwen3-TTS-{plan.qwen_shape} streams through the service ...")
    try:
        qwen_dir = qwen_demo.write_shape_checkpoint(ctx.work / f"qwen-{plan.qwen_shape}", plan.qwen_shape)
        streams, poisson = asyncio.run(_streams(qwen_config(ctx, plan, qwen_dir, max(plan.stream_levels)), plan,
                                                plan.qwen_frames))
        result.qwen = {"streams": streams, "poisson": poisson}
    except Exception as e:
        result.qwen = {"error": f"{type(e).__name__}: {e}"}
        saved("Orpheus only (Qwen3-TTS failed)")
        raise
    finally:
        _free()
    saved("Qwen3-TTS streams")
    met = sum(g.met for g in result.goals)
    summary = (f"{met} of {len(result.goals)} goals met; real-time streams held: Orpheus-{plan.shape} "
               f"{held(result.streams, TTFB_P95_MS)} (TTFB p95 <= {TTFB_P95_MS:.0f} ms), Qwen3-TTS-{plan.qwen_shape} "
               f"{held(result.qwen['streams'], QWEN_FIRST_AUDIO_P95_MS)} (<= {QWEN_FIRST_AUDIO_P95_MS:.0f} ms)")
    return summary, table(result), {"perf_json": str(ctx.out / "perf.json")}


async def _streams(cfg: LyreConfig, plan: Plan, tokens: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Streams of ``tokens`` (Qwen3-TTS: frames) through a service of ``cfg``: started together at each
    of the plan's levels, then Poisson arrivals."""
    async with TTSService(cfg) as tts:
        await tts.synthesize("warm up", seed=0)
        levels = [await service_bench._level(tts, n, tokens) for n in plan.stream_levels]
        return levels, await service_bench.poisson_level(tts, plan.poisson_rate, plan.poisson_seconds, tokens)


def qwen_config(ctx: Context, plan: Plan, model_dir: Path, sessions: int) -> LyreConfig:
    """Qwen3-TTS's service: its checkpoint's own codec, bfloat16 on a GPU (the family's default)."""
    return load_config(None, {
        "model.path": str(model_dir), "codec.path": None, "model.backend": "torch", "model.device": ctx.kit.device,
        "codec.device": ctx.kit.device, "kv_cache.max_seq_len": plan.qwen_max_seq_len,
        "scheduler.max_prefill_tokens": plan.prefill_tokens,
        "engine.cuda_graphs": plan.cuda_graphs, "scheduler.max_concurrent_sessions": sessions,
        "scheduler.max_batch_size": sessions, "scheduler.max_pending": 4 * sessions,
        "sampling.max_tokens": plan.qwen_frames, "data_dir": str(ctx.work / "perf-data-qwen")})


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def held(levels: list[dict[str, Any]], ttfb_p95_ms: float) -> int:
    """The most streams started together (of ``levels``) that all stayed real time with TTFB p95 within
    ``ttfb_p95_ms``."""
    ok = [lv["concurrency"] for lv in levels
          if lv["real_time_streams"] == lv["concurrency"] and (lv["ttfb_ms_p95"] or 1e9) <= ttfb_p95_ms]
    return max(ok, default=0)


def goals(result: PerfResult) -> list[Goal]:
    levels = result.engine.get("engine", [])
    worst = max((lv["vs_reference"] for lv in levels), default=float("inf"))
    gpu = (result.machine.get("gpu") or {}).get("name", "")
    card = next((c for c in STREAMS_GOAL if c in gpu), None)
    want = STREAMS_GOAL.get(card or "H100", 150)
    orpheus, qwen = held(result.streams, TTFB_P95_MS), held(result.qwen.get("streams", []), QWEN_FIRST_AUDIO_P95_MS)
    return [
        Goal("engine step / reference step, every level", f"<= {ENGINE_VS_REFERENCE}", f"{worst:.2f} at worst",
             worst <= ENGINE_VS_REFERENCE),
        Goal(f"real-time Orpheus streams started together ({card or 'this card'})",
             f">= {want} at TTFB p95 <= {TTFB_P95_MS:.0f} ms, 0 underruns", str(orpheus), orpheus >= want),
        _poisson_goal("Orpheus Poisson arrivals", result.poisson, TTFB_P95_MS),
        Goal("real-time Qwen3-TTS streams started together", f">= {QWEN_STREAMS_GOAL} at first audio p95 <= "
             f"{QWEN_FIRST_AUDIO_P95_MS:.0f} ms, 0 underruns", str(qwen), qwen >= QWEN_STREAMS_GOAL),
        _poisson_goal("Qwen3-TTS Poisson arrivals", result.qwen.get("poisson", {}), QWEN_FIRST_AUDIO_P95_MS),
    ]


def _poisson_goal(what: str, p: dict[str, Any], ttfb_p95_ms: float) -> Goal:
    return Goal(what, f"first audio p95 <= {ttfb_p95_ms:.0f} ms, 0 underruns",
                f"{p.get('arrivals', 0)} arrivals, ~{p.get('mean_concurrency', 0):.0f} open: p95 "
                f"{_ms(p.get('ttfb_ms_p95'))} ms, {p.get('late_chunks', 0)} late chunks",
                p.get("late_chunks", 1) == 0 and (p.get("ttfb_ms_p95") or 1e9) <= ttfb_p95_ms)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def table(result: PerfResult) -> list[str]:
    m, plan = result.machine, result.plan
    gpu = m.get("gpu") or {}
    ref = result.engine.get("reference", {})
    lines = [f"{gpu.get('name', 'no GPU')}, driver {m.get('driver') or '-'}, torch {m['torch']} (CUDA {m['cuda']}), "
             f"commit {m['commit']}, {m['date']}; Orpheus-{plan['shape']} shape, random weights, {plan['dtype']}; "
             "figures in perf.json", "",
             "| goal | wanted | measured | met |", "| --- | --- | --- | --- |"]
    lines += [f"| {g.what} | {g.goal} | {g.measured} | {'yes' if g.met else 'NO'} |" for g in result.goals]
    lines += ["", f"Engine against the reference step ({plan['engine_tokens']} tokens a request; reference: "
              f"{ref.get('context')}-token static cache at position {ref.get('position')}):", "",
              "| sequences | engine step p50 ms | reference step ms | ratio | engine tokens/s |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {lv['concurrency']} | {lv['step_ms_p50']:.2f} | {lv['reference_step_ms']:.2f} | "
              f"{lv['vs_reference']:.2f} | {lv['tokens_per_s']:.0f} |" for lv in result.engine.get("engine", [])]
    lines += _streams_table(f"Orpheus-{plan['shape']} streams through the service ({plan['stream_tokens']} tokens, "
                            f"{plan['stream_tokens'] / 82.03:.1f} s of audio each)", result.streams, result.poisson)
    if "error" in result.qwen:
        lines += ["", f"Qwen3-TTS-{plan.get('qwen_shape')} streams: not measured ({result.qwen['error']})"]
    lines += _streams_table(f"Qwen3-TTS-{plan.get('qwen_shape')} streams through the service, bfloat16 "
                            f"({plan.get('qwen_frames')} frames, {(plan.get('qwen_frames') or 0) * 0.08:.1f} s of audio "
                            "each)", result.qwen.get("streams", []), result.qwen.get("poisson", {}))
    return lines


def _streams_table(title: str, levels: list[dict[str, Any]], poisson: dict[str, Any]) -> list[str]:
    lines = ["", f"{title}:", "",
             "| streams | first audio p50 ms | first audio p95 ms | real time | late chunks | audio s / wall s |",
             "| --- | --- | --- | --- | --- | --- |"]
    rows = [(str(lv["concurrency"]), lv) for lv in levels]
    if poisson:
        p = poisson
        rows.append((f"Poisson {p['rate']:g}/s x {p['seconds']:g} s ({p['arrivals']}, ~{p['mean_concurrency']:.0f} "
                     "open)", p))
    return lines + [f"| {name} | {_ms(lv['ttfb_ms_p50'])} | {_ms(lv['ttfb_ms_p95'])} | {lv['real_time_streams']} | "
                    f"{lv['late_chunks']} | {lv['audio_s_per_wall_s']:.1f} |" for name, lv in rows]


def from_json(path: Path) -> PerfResult:
    """A perf.json back as the result it was written from."""
    data = json.loads(Path(path).read_text())
    out = PerfResult(data["plan"], data["machine"], data.get("engine", {}), data.get("streams", []),
                     data.get("poisson", {}), data.get("qwen", {}))
    out.goals = [Goal(**g) for g in data.get("goals", [])]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m lyre.gpucheck.perf --markdown perf.json``: the tables docs/gpu.md shows, from the JSON."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lyre.gpucheck.perf", description=main.__doc__)
    p.add_argument("--markdown", type=Path, required=True, help="a perf.json the perf stage wrote")
    args = p.parse_args(argv)
    print("\n".join(table(from_json(args.markdown))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
