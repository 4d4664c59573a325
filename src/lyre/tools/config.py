"""``lyre config [--config FILE] [--set key=value ...]``: validate a config and print it resolved."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import yaml

from lyre.config import ConfigError, add_config_arguments, config_from_args, config_to_dict


def main(argv: Sequence[str] | None = None, prog: str = "lyre config") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Validate a Lyre config and print it with every override and default applied.",
    )
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
    return 0
