"""``lyre codec prepare [--config FILE] [--set key=value ...]``: export (or find cached) the
codec graphs the configuration's runtime needs, so that the first server start does not wait for it."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from lyre.codec import CodecError, build_codec, configure_noise
from lyre.config import ConfigError, add_config_arguments, config_from_args
from lyre.model import checkpoint


def main(argv: list[str] | None = None, prog: str = "lyre codec") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare"])
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = config_from_args(args)
        model = checkpoint.resolve_model(cfg.model, cfg.codec)
        if cfg.codec.mode != "stream":
            print(f"codec.mode is {cfg.codec.mode}: nothing to prepare")
            return 0
        device = "cpu" if cfg.codec.device == "auto" else cfg.codec.device
        snac = configure_noise(checkpoint.load_snac(model.snac_dir, device), cfg.codec.noise, cfg.codec.noise_seed)
        t0 = time.perf_counter()
        codec = build_codec(cfg.codec, snac, device, snac.quantizer.quantizers[0].codebook.weight.dtype)
    except (ConfigError, checkpoint.CheckpointError, CodecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"codec ready: stream mode, {codec.runtime} ({time.perf_counter() - t0:.1f} s)")
    return 0

