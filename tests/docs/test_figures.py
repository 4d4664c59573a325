"""Figures in the docs come from committed results files: the GPU table of docs/gpu.md is what
``python -m lyre.gpucheck.perf --markdown`` renders from benchmarks/results/gpu-perf.json, or, while no
GPU run is committed, the docs say there are none."""

from __future__ import annotations

from lyre.gpucheck.perf import from_json, table
from tests.support.paths import REPO_ROOT

RESULTS = REPO_ROOT / "benchmarks" / "results" / "gpu-perf.json"


def test_the_gpu_table_is_the_committed_perf_json():
    docs = (REPO_ROOT / "docs" / "gpu.md").read_text()
    section = docs.split("### Figures on a GPU", 1)[1].split("\n## ", 1)[0]
    if not RESULTS.is_file():
        assert "None yet" in section and "| goal | wanted | measured | met |" not in section
        return
    rendered = "\n".join(table(from_json(RESULTS)))
    assert rendered in section, "docs/gpu.md's GPU table is not the one benchmarks/results/gpu-perf.json renders"
