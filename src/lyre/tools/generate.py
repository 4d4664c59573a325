"""``lyre generate``: run the token engine on a few prompts, for debugging and verification.

Request i takes the i-th prompt (text prompts first, then ``--prompt-ids``), cycling, and joins the
engine at step i x ``--stagger``. With ``--seed S`` request i samples with seed S + i. ``--json``
prints one object per request: request_id, prompt_ids, token_ids, finish_reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lyre.config import ConfigError, add_config_arguments, config_from_args
from lyre.engine.base import GenerationRequest, SamplingParams
from lyre.engine.torch.engine import TorchEngine, TorchEngineConfig
from lyre.model import checkpoint, orpheus


def _id_list(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids needs at least one id")
    return ids


def build_parser(prog: str = "lyre generate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_config_arguments(p)
    p.add_argument("--checkpoint", type=Path, help="Llama checkpoint directory (default: the configured model)")
    p.add_argument("--text", action="append", default=[], help="text to speak (repeatable)")
    p.add_argument("--voice", action="append", default=[], help="voice for the text prompts, cycling (repeatable)")
    p.add_argument("--prompt-ids", action="append", default=[], type=_id_list, metavar="1,2,3",
                   help="a raw prompt as token ids (repeatable)")
    p.add_argument("--requests", type=int, default=None, help="number of requests (default: one per prompt)")
    p.add_argument("--stagger", type=int, default=0, metavar="K", help="request i joins at step i*K (default 0)")
    p.add_argument("--max-tokens", type=int, help="tokens per request (default: sampling.max_tokens)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: sampling.temperature)")
    p.add_argument("--top-p", type=float, help="default: sampling.top_p")
    p.add_argument("--top-k", type=int, help="default: sampling.top_k")
    p.add_argument("--repetition-penalty", type=float, help="default: sampling.repetition_penalty")
    p.add_argument("--seed", type=int, help="request i uses seed+i (default: sampling.seed, else random)")
    p.add_argument("--no-constrain", action="store_true", help="sample from the whole vocabulary")
    p.add_argument("--json", action="store_true", help="one JSON object per request on stdout")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "lyre generate") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.json else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = config_from_args(args)
        if args.checkpoint is not None:
            model_dir = args.checkpoint
        else:
            model_dir = checkpoint.resolve_model(cfg.model, cfg.codec).llama_dir
        prompts = list(args.prompt_ids)
        if args.text or not prompts:
            tokenizer = checkpoint.load_tokenizer(model_dir)
            voices = args.voice or [cfg.model.default_voice]
            texts = args.text or ["Hello world"]
            prompts = [orpheus.build_prompt_ids(tokenizer, t, voices[i % len(voices)]) for i, t in enumerate(texts)] + prompts
        n = args.requests if args.requests is not None else len(prompts)
        if n < 1:
            parser.error("--requests must be >= 1")
        overrides = {
            k: v
            for k, v in {
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
                "top_p": args.top_p,
                "top_k": args.top_k,
                "repetition_penalty": args.repetition_penalty,
            }.items()
            if v is not None
        }
        if args.no_constrain:
            overrides["constrain_audio"] = False
        base = SamplingParams.from_config(cfg.sampling, **overrides)
        base.validate()
        seed = args.seed if args.seed is not None else cfg.sampling.seed
        engine_cfg = TorchEngineConfig.from_config(cfg)
        engine = TorchEngine.from_checkpoint(model_dir, engine_cfg)
    except (ConfigError, checkpoint.CheckpointError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    requests = [
        GenerationRequest(f"r{i}", prompts[i % len(prompts)],
                          SamplingParams(**{**base.__dict__, "seed": None if seed is None else seed + i}))
        for i in range(n)
    ]
    results = {r.request_id: {"tokens": [], "finish_reason": None} for r in requests}
    step = 0
    t0 = time.perf_counter()
    pending = list(enumerate(requests))
    try:
        while pending or engine.has_work():
            # a request joins at its step, or later when every slot is held then
            while pending and pending[0][0] * args.stagger <= step and engine.add(pending[0][1]):
                pending.pop(0)
            for delta in engine.step():
                results[delta.request_id]["tokens"] += delta.token_ids
                if delta.finished:
                    results[delta.request_id]["finish_reason"] = delta.finish_reason
            step += 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - t0

    total = 0
    for r in requests:
        res = results[r.request_id]
        total += len(res["tokens"])
        if args.json:
            print(json.dumps({"request_id": r.request_id, "prompt_ids": r.prompt_ids, "token_ids": res["tokens"],
                              "finish_reason": res["finish_reason"]}))
        else:
            parser_ = orpheus.AudioTokenParser()
            frames = len(parser_.feed(res["tokens"]))
            print(f"{r.request_id}: {len(r.prompt_ids)} prompt tokens -> {len(res['tokens'])} tokens, "
                  f"{frames} audio frames ({frames * orpheus.SAMPLES_PER_FRAME / orpheus.SAMPLE_RATE:.2f} s), "
                  f"finish={res['finish_reason']}")
    if not args.json:
        print(f"{total} tokens in {elapsed:.2f} s ({total / max(elapsed, 1e-9):.0f} tokens/s) over {step} steps")
    return 0

