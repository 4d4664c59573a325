"""Regenerate ``src/lyre/gpucheck/tensorrt-llm-<version>-requires.json``: the requirements TensorRT-LLM
publishes on PyPI (``python -m lyre.gpucheck`` checks an install against them).

    python tests/support/trtllm_api/snapshot_requirements.py [--version 1.2.1]

Reads ``https://pypi.org/pypi/tensorrt-llm/<version>/json`` (or the project's JSON, when its
latest release is that version; some mirrors serve only that) and writes the ``requires_dist`` and
``requires_python`` of that release. ``tests/deploy/test_install.py`` checks pyproject.toml's ranges for
the GPU install against the snapshot, offline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
INDEX = "https://pypi.org/pypi/tensorrt-llm"


def fetch(version: str) -> tuple[str, dict]:
    for url in (f"{INDEX}/{version}/json", f"{INDEX}/json"):
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                info = json.load(r)["info"]
        except urllib.error.HTTPError:
            continue
        if info["version"] == version:
            return url, info
    raise SystemExit(f"PyPI has no metadata for tensorrt-llm {version} (tried {INDEX}/{version}/json and {INDEX}/json)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", default="1.2.1")
    args = p.parse_args(argv)
    url, info = fetch(args.version)
    out = HERE.parents[2] / "src" / "lyre" / "gpucheck" / f"tensorrt-llm-{args.version}-requires.json"
    out.write_text(json.dumps({
        "package": "tensorrt-llm",
        "version": args.version,
        "source": url,
        "regenerate": "python tests/support/trtllm_api/snapshot_requirements.py --version " + args.version,
        "fetched": datetime.date.today().isoformat(),
        "requires_python": info["requires_python"],
        "requires_dist": info["requires_dist"],
    }, indent=1) + "\n")
    print(f"wrote {out} ({len(info['requires_dist'])} requirements)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
