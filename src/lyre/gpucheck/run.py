"""The acceptance run: the stages in order, each timed, stopping at the first failure, and the report.

Stages (``--backend trtllm``, the default):
1. environment: driver, CUDA toolkit, MPI, the GPU, package versions against TensorRT-LLM's pins
2. build: FP8 engines of the demo (tiny and small shapes) and an FP16 one for the parity stages
3. constraint: one request through the Executor; every generated token a legal code of its frame slot
4. parity: the same prompts through the PyTorch and TensorRT-LLM engines (FP16), the same tokens
   under greedy decoding
5. cloned: a cloned voice's prompt (reference codes in it) with the repetition penalty, the same again
6. scaling: ``benchmark.py --mode scaling`` on the TensorRT-LLM backend, JSON and a plot
7. perf: the PyTorch engine's pace on this GPU (Orpheus-3B shape): its step against the reference
   step at 1-256 sequences, real-time streams through the service, goals met or missed
   (:mod:`lyre.gpucheck.perf`)
8. qwen3-tts: the Qwen3-TTS engine's CUDA graphs (talker decode step, code predictor frame) make
   the frames the same code makes eagerly

``--backend torch`` (a GPU machine without TensorRT-LLM): environment, constraint, perf, scaling and
qwen3-tts, on the PyTorch engine on the GPU. ``--stage NAME`` runs that stage alone.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from lyre.gpucheck import stages
from lyre.gpucheck.context import Context, Kit
from lyre.gpucheck.environment import stage_environment
from lyre.gpucheck.perf import stage_perf
from lyre.gpucheck.qwen import stage_qwen
from lyre.gpucheck.report import FAIL, PASS, Report, StageFailed, StageResult

log = logging.getLogger("lyre.gpucheck")


def _environment(ctx: Context) -> stages.Result:
    result = stage_environment(ctx.kit, ctx.backend)
    ctx.env = ctx.kit.probe() if ctx.backend == "trtllm" else None
    return result


STAGES: dict[str, tuple[str, Callable[[Context], stages.Result]]] = {
    "environment": ("the driver, CUDA toolkit, MPI and packages are the ones Lyre's GPU path is built and pinned "
                    "for, and torch sees the GPU", _environment),
    "build": ("build_engine.py's path (checkpoint, FP8 calibration on served prompts, TensorRT-LLM build, "
              "manifest) produces engines on this GPU", stages.stage_build),
    "constraint": ("a request streams through the engine and the frame-slot constraint holds on the GPU: every "
                   "token is a code of its slot", stages.stage_constraint),
    "parity": ("the TensorRT-LLM engine computes what the PyTorch engine computes: same prompts, same greedy tokens",
               stages.stage_parity),
    "cloned": ("the repetition penalty on the GPU covers only recent generated tokens, not a cloned voice's "
               "reference codes in the prompt", stages.stage_cloned),
    "perf": ("the PyTorch engine runs at this GPU's pace: its decode step against the minimal static-KV step, and "
             "real-time Orpheus-3B streams through the service (figures and goals in perf.json)", stage_perf),
    "scaling": ("the server on this backend holds concurrent real-time streams: the scaling benchmark's figures "
                "and plot", stages.stage_scaling),
    "qwen3-tts": ("Qwen3-TTS's CUDA graphs (the talker's decode step, the code predictor's frame) compute what "
                  "the same code computes eagerly: the same greedy frames", stage_qwen),
}
BACKEND_STAGES = {"trtllm": tuple(STAGES), "torch": ("environment", "constraint", "perf", "scaling", "qwen3-tts")}


def run(ctx: Context, command: str, say: Callable[[str], None] = print, only: str | None = None) -> Report:
    """Every stage of ``ctx.backend`` (or ``only`` that one) in order until one fails; the report, written."""
    report = Report(ctx.out, command, ctx.backend)
    names = (only,) if only else BACKEND_STAGES[ctx.backend]
    results = [StageResult(name, STAGES[name][0]) for name in names]
    report.stages = results
    for i, result in enumerate(results, 1):
        say(f"[{i}/{len(results)}] {result.name}: {result.proves}")
        started = time.monotonic()
        try:
            result.summary, result.details, result.data = STAGES[result.name][1](ctx)
            result.status = PASS
        except StageFailed as e:
            result.status, result.summary, result.details, result.data = FAIL, e.summary, e.details, e.data
        except Exception as e:  # a stage's crash is its failure, with the traceback in the report
            result.status, result.summary = FAIL, f"{type(e).__name__}: {e}"
            result.details = ["```", *traceback.format_exc().splitlines()[-30:], "```"]
        result.seconds = time.monotonic() - started
        say(f"      {result.status} in {result.seconds:.1f} s: {result.summary}")
        report.write()
        if result.status != PASS:
            break
    report.write()
    return report


def make_context(out: Path, backend: str, kit: Kit | None = None, **options) -> Context:
    out.mkdir(parents=True, exist_ok=True)
    return Context(out=out, work=options.pop("work", None) or out / "work", backend=backend, kit=kit or Kit(),
                   **options)
