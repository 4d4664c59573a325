#!/usr/bin/env python
"""Build the Orpheus decoder into an FP8 TensorRT-LLM engine (or prepare the PyTorch backend's checkpoint).

    python build_engine.py --config config/model_config.yaml             # build engines/<name>/ + manifest
    python build_engine.py --config config/model_config.yaml --dry-run   # print the plan, anywhere
    python build_engine.py --config config/model_config.yaml --backend torch   # CPU-only users

The engine is specific to this GPU model and the installed TensorRT-LLM/TensorRT versions; the
server refuses it elsewhere. The TensorRT-LLM build has NOT YET BEEN RUN ON A GPU by this project
(see README, "GPU quick start"). Exit status: 0 done, 1 error, 2 a real build cannot run on this
machine (the message says what is missing).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from lyre.config import ConfigError, add_config_arguments, config_from_args
from lyre.engine.backend import probe_environment
from lyre.model.checkpoint import CheckpointError
from lyre.tools.build import BuildError, build_trtllm_engine, format_plan, plan_build, prepare_torch

TORCH_HINT = (
    "To serve without TensorRT-LLM, use the PyTorch backend:\n"
    "  python build_engine.py --config {config} --backend torch     # download + verify the checkpoint\n"
    "  python production_server.py --config {config} --set model.backend=torch"
)


def parse_gpu(text: str) -> tuple[str, tuple[int, int]]:
    name, sep, cc = text.rpartition("=")
    try:
        major, minor = (int(x) for x in cc.split("."))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MAJOR.MINOR, e.g. 'Tesla T4=7.5'") from None
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MAJOR.MINOR, e.g. 'Tesla T4=7.5'")
    return name, (major, minor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build_engine.py",
        description="Build the Orpheus decoder into an FP8 TensorRT-LLM engine with a manifest "
                    "(settings: the config's build section), or with --backend torch download and verify the "
                    "checkpoint for the PyTorch backend.",
        epilog="The TensorRT-LLM build has not yet been run on a GPU by this project (README: GPU quick start). "
               "Exit status: 0 done, 1 error, 2 a real build cannot run on this machine.",
    )
    add_config_arguments(parser)
    parser.add_argument("--backend", choices=("trtllm", "torch"), default="trtllm",
                        help="trtllm (default): build the engine; torch: download and verify the checkpoint for the "
                             "PyTorch backend instead (no GPU needed)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the full build plan and what would stop a build here; change nothing")
    parser.add_argument("--target-gpu", type=parse_gpu, metavar="NAME=MAJOR.MINOR",
                        help="with --dry-run: plan for another GPU, e.g. 'Tesla T4=7.5' (FP8 needs >= 8.9)")
    parser.add_argument("--force", action="store_true", help="replace an existing engine in build.engine_dir")
    args = parser.parse_args(argv)
    if args.target_gpu and not args.dry_run:
        parser.error("--target-gpu only plans (use it with --dry-run): an engine is built on the GPU that serves it")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config_name = args.config or "config/model_config.yaml"
    try:
        cfg = config_from_args(args)
        if args.backend == "torch":
            if args.dry_run:
                print("PyTorch backend: would download (if not cached) and verify the model "
                      f"({cfg.model.path or cfg.model.hf_id + '@' + cfg.model.revision}) and the codec "
                      f"({cfg.codec.path or cfg.codec.hf_id + '@' + cfg.codec.revision})")
                return 0
            prepare_torch(cfg)
            print(f"ready for the PyTorch backend: python production_server.py --config {config_name} "
                  "--set model.backend=torch")
            return 0
        env = probe_environment()
        if args.target_gpu:
            name, cc = args.target_gpu
            env = replace(env, gpu_name=name, compute_capability=cc)
        plan = plan_build(cfg, env, force=args.force)
        print(format_plan(plan))
        if args.dry_run:
            return 0
        if plan.blockers:
            print("\nerror: cannot build here: " + "; ".join(plan.blockers), file=sys.stderr)
            print(TORCH_HINT.format(config=config_name), file=sys.stderr)
            return 2
        manifest = build_trtllm_engine(cfg, plan)
        print(f"built {manifest.quantization.upper()} engine in {plan.engine_dir} for {manifest.gpu_name}; serve it: "
              f"python production_server.py --config {config_name}")
        return 0
    except (ConfigError, CheckpointError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
