#!/usr/bin/env python
"""Lyre benchmarks.

  python benchmark.py --mode engine  [--concurrency 1,4,16] [--max-tokens 256] [--output FILE]
  python benchmark.py --mode service [--concurrency 1,8,16] [--policies fair,deadline] [--output FILE]

--mode engine: tokens/s of the PyTorch token engine at each concurrency, and of transformers'
generate run sequentially on the same weights and prompts, in one run.
--mode service: concurrent streams through the library API (TTSService): TTFB p50/p95, streams
that stayed real time (no underrun of a player starting at the first chunk), per policy.
The load-scaling modes of seed 004 (scaling, all, tuning) arrive with the production server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from lyre import checkpoint
from lyre.benchmarks import engine as engine_bench
from lyre.benchmarks import service as service_bench
from lyre.config import ConfigError, add_config_arguments, config_from_args


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["engine", "service"], required=True)
    add_config_arguments(p)
    p.add_argument("--checkpoint", type=Path, help="Llama checkpoint directory (default: the configured model)")
    p.add_argument("--concurrency", type=_int_list, default=None,
                   help="levels (default: 1,4,16 for engine, 1,8,16 for service)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens generated per request (default 256)")
    p.add_argument("--policies", default="fair,deadline", help="service mode: scheduler policies to compare")
    p.add_argument("--baseline-requests", type=int, default=2,
                   help="requests transformers generates one after another (default 2)")
    p.add_argument("--output", type=Path, help="write the figures as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        say = lambda m: print(m, file=sys.stderr)  # noqa: E731
        if args.mode == "engine":
            model_dir = args.checkpoint or checkpoint.resolve_model(cfg.model, cfg.codec).llama_dir
            result = engine_bench.run(cfg, model_dir, args.concurrency or [1, 4, 16], args.max_tokens,
                                      args.baseline_requests, progress=say)
            text = engine_bench.table(result)
        else:
            policies = [p.strip() for p in args.policies.split(",") if p.strip()]
            if not policies or set(policies) - {"fair", "deadline"}:
                p.error("--policies takes fair and/or deadline")
            result = service_bench.run(cfg, args.concurrency or [1, 8, 16], policies, args.max_tokens, progress=say)
            text = service_bench.table(result)
    except (ConfigError, checkpoint.CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(text)
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
