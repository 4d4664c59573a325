"""The ``lyre`` command (also ``python -m lyre``): one entry point for Lyre's tools.

    lyre serve        start the server (what production_server.py runs)
    lyre checkpoint   write the demo checkpoint, download the real one, show what would load
    lyre codec        prepare the streaming codec for its runtime
    lyre config       validate a config and print it resolved
    lyre audit        export or prune the audit trail
    lyre generate     run the token engine on a few prompts (debugging)

Each command's module is imported only when it runs, so ``lyre config`` does not load torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> (module with main(argv, prog), one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("lyre.server", "start the server: REST + WebSocket and gRPC over one engine"),
    "checkpoint": ("lyre.tools.checkpoint", "write the demo checkpoint, download the real one, show what would load"),
    "codec": ("lyre.tools.codec", "prepare the streaming codec for its runtime (export once, cached)"),
    "config": ("lyre.tools.config", "validate a config and print it with every override and default applied"),
    "audit": ("lyre.tools.audit", "export or prune the audit trail"),
    "generate": ("lyre.tools.generate", "run the token engine on a few prompts, for debugging and verification"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return ("usage: lyre <command> [options]   (lyre <command> --help for its options)\n\ncommands:\n"
            + "\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"lyre: unknown command {name!r}\n\n{usage()}", end="", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest, prog=f"lyre {name}")
