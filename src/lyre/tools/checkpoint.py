"""``lyre checkpoint {demo,download,resolve}``: write the demo checkpoint, download the configured
model and codec into the Hugging Face cache, or show (and prepare) the checkpoint the server would load."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from lyre.config import ConfigError, add_config_arguments, config_from_args
from lyre.model import checkpoint, demo


def main(argv: Sequence[str] | None = None, prog: str = "lyre checkpoint") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p_demo = sub.add_parser("demo", help="write the demo checkpoint (random weights; its audio is noise)")
    p_demo.add_argument("dir", type=Path, help="output directory (gets llama/ and snac/)")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--shape", default="tiny", help="tiny (default: hidden 192, 4 layers; a token costs almost "
                        "nothing), small (hidden 768, 12 layers, 12 query / 4 KV heads: a real model's cost per "
                        "token on a CPU, in proportion), or a config.json whose shape it takes; serve it with "
                        "--set model.path=DIR/llama")
    p_demo.add_argument("--force", action="store_true", help="rewrite even when an up-to-date demo is there")
    p_demo.add_argument("--variant", choices=("custom_voice", "voice_design", "base"), default="custom_voice",
                        help="with --family qwen3-tts: a CustomVoice checkpoint (built-in speakers; default), a "
                             "VoiceDesign one (its voice described by each request's instructions) or a Base one "
                             "(cloned voices only: its speaker encoder and the 12 Hz tokenizer's encoder)")
    p_demo.add_argument("--family", choices=("orpheus", "qwen3-tts"), default="orpheus",
                        help="orpheus (default: DIR gets llama/ and snac/) or qwen3-tts (DIR is a Qwen3-TTS "
                        "checkpoint of --variant, speech_tokenizer/ inside; --shape tiny or small: the real code "
                        "predictor's depth at half width, a third of the talker); serve it with --set model.path=DIR")

    p_dl = sub.add_parser("download", help="download the configured model and codec into the Hugging Face cache")
    add_config_arguments(p_dl)
    p_dl.add_argument("--model-id", help="model repository (default: model.hf_id)")
    p_dl.add_argument("--family", choices=("orpheus", "qwen3-tts"), help="what the repository holds (default: "
                      "model.family; auto is orpheus): qwen3-tts fetches a whole Qwen3-TTS checkpoint, e.g. "
                      "--model-id Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, its codec inside")
    p_dl.add_argument("--codec-id", help="SNAC repository (default: codec.hf_id)")

    p_res = sub.add_parser("resolve", help="show (and prepare) the checkpoint the server would load")
    add_config_arguments(p_res)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "demo" and args.family == "qwen3-tts":
            from lyre.family.qwen3tts import demo as qwen_demo

            if args.shape not in qwen_demo.SHAPES:
                print(f"error: --family qwen3-tts takes --shape {' or '.join(qwen_demo.SHAPES)}", file=sys.stderr)
                return 2
            if args.force or not qwen_demo.demo_is_current(args.dir, args.seed, args.shape, args.variant):
                qwen_demo.write_demo(args.dir, args.seed, args.shape, args.variant)
                print(f"wrote the Qwen3-TTS demo checkpoint ({args.shape}) to {args.dir} (random weights: noise); "
                      f"serve it with --set model.path={args.dir}")
            else:
                print(f"the Qwen3-TTS demo checkpoint at {args.dir} is up to date")
            return 0
        if args.command == "demo":
            try:
                demo.demo_config(args.shape)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            if args.force or not demo.demo_is_current(args.dir, args.seed, args.shape):
                demo.write_demo(args.dir, args.seed, args.shape)
                print(f"wrote the demo checkpoint ({args.shape}) to {args.dir} (random weights: its audio is noise); "
                      f"serve it with --set model.path={args.dir / 'llama'}")
            else:
                print(f"the demo checkpoint at {args.dir} is up to date")
            return 0
        cfg = config_from_args(args)
        if args.command == "download" and (args.family or cfg.model.family) == "qwen3-tts":
            path = checkpoint.download(args.model_id or cfg.model.hf_id, "qwen3-tts", cfg.model.revision)
            print(f"model: {path}\ncodec: {path / 'speech_tokenizer'}")
            return 0
        if args.command == "download":
            llama = checkpoint.download(args.model_id or cfg.model.hf_id, "llama", cfg.model.revision)
            snac = checkpoint.download(args.codec_id or cfg.codec.hf_id, "snac", cfg.codec.revision)
            print(f"model: {llama}\ncodec: {snac}")
            return 0
        resolved = checkpoint.resolve_model(cfg.model, cfg.codec)
        print(f"model: {resolved.llama_dir}\ncodec: {resolved.snac_dir}\nsource: {resolved.source}"
              f"{'  (DEMO: noise)' if resolved.is_demo else ''}")
        return 0
    except (checkpoint.CheckpointError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
