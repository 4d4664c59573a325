"""``benchmark.py`` called in-process: its ``main(argv)`` with stdout and stderr captured (the script
itself runs as a process once, in tests/benchmarks/test_modes.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

from tests.support.paths import REPO_ROOT


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def _load_script():
    spec = importlib.util.spec_from_file_location("lyre_benchmark_script", REPO_ROOT / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def benchmark_script():
    return _load_script()


@pytest.fixture
def bench(benchmark_script, capsys):
    """``bench("--mode", "scaling", ...)`` -> Run: what ``python benchmark.py ...`` would exit with
    and print (argparse's refusals included: exit 2 with the usage on stderr)."""

    def run(*argv: str) -> Run:
        capsys.readouterr()  # only this run's output
        try:
            code = benchmark_script.main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run
