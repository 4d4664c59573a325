"""``python -m lyre.gpucheck``: the acceptance run for a new GPU machine (see :mod:`lyre.gpucheck.run`)."""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

from lyre.gpucheck.run import BACKEND_STAGES, STAGES, make_context, run


def parser() -> argparse.ArgumentParser:
    stage_list = "\n".join(f"  {i}. {name}: {STAGES[name][0]}" for i, name in enumerate(STAGES, 1))
    p = argparse.ArgumentParser(
        prog="python -m lyre.gpucheck", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The acceptance run for a machine with a GPU: stage by stage, each timed and reported pass/fail "
                    "with the reason, stopping at the first failure. Writes REPORT.md (attach it to an issue), "
                    "report.json and the scaling benchmark's JSON and plot.",
        epilog=f"stages (--backend trtllm):\n{stage_list}\n\n--backend torch runs "
               f"{', '.join(BACKEND_STAGES['torch'])} on the PyTorch engine on the GPU.\n"
               "Exit status: 0 every stage passed, 1 a stage failed.")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for the report (default: gpucheck-<UTC date and time>)")
    p.add_argument("--work", type=Path, default=None, help="checkpoints and engines (default: <out>/work)")
    p.add_argument("--backend", choices=sorted(BACKEND_STAGES), default="trtllm")
    p.add_argument("--stage", choices=list(STAGES), help="run this stage alone (e.g. perf: the GPU pace, a few "
                                                          "minutes; build first for the TensorRT-LLM stages)")
    p.add_argument("--levels", default="1,8,32,64", help="the scaling stage's concurrency levels (default 1,8,32,64)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="the scaling stage's tokens per request (default 168: 2 s of audio)")
    p.add_argument("--calibration-samples", type=int, default=32,
                   help="FP8 calibration prompts per build (default 32; build_engine.py's default is 256)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a stage's requests may take (default 600)")
    p.add_argument("--scaling-timeout", type=float, default=3600.0,
                   help="seconds the scaling benchmark may take before it is stopped, servers too (default 3600)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.calibration_samples < 1 or args.timeout <= 0 or args.scaling_timeout <= 0 or (args.max_tokens is not None and args.max_tokens < 7):
        parser().error("--calibration-samples, --timeout and --scaling-timeout must be positive, --max-tokens at least 7")
    out = args.out or Path(f"gpucheck-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}")
    ctx = make_context(out, args.backend, work=args.work, levels=args.levels, max_tokens=args.max_tokens,
                       calibration_samples=args.calibration_samples, timeout_s=args.timeout,
                       scaling_timeout_s=args.scaling_timeout)
    command = "python -m lyre.gpucheck " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    report = run(ctx, command.strip(), only=args.stage)
    print(f"{'PASSED' if report.passed else 'FAILED'}: the report is {out / 'REPORT.md'}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
