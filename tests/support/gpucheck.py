"""The acceptance run's (``lyre.gpucheck``) stand-ins for what needs a GPU: FAKES of the executor
bindings (whose logits come from the checkpoint through transformers), of the LLM API's build and of
a scaling benchmark on the GPU backend, and a ready machine's checks."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from lyre.engine.backend import Environment
from lyre.gpucheck.context import Kit
from lyre.gpucheck.prereqs import Check
from lyre.gpucheck.run import make_context
from tests.support import fake_llmapi
from tests.support.model_executor import ModelExecutor, bindings

H100 = Environment("NVIDIA H100 80GB HBM3", (9, 0), "1.2.1", "10.14.1.48")
READY = [Check("NVIDIA GPU", True, "0: NVIDIA H100 80GB HBM3"), Check("driver", True, "driver 580.65, CUDA 13.0"),
         Check("CUDA toolkit", True, "CUDA 13.0 at /usr/local/cuda-13.0"), Check("MPI", True, "found"),
         Check("Python", True, "3.12")]


def fake_benchmark(calls: list):
    """Stands in for benchmark.py --mode scaling (a server on the GPU backend): writes what it would."""
    def run_benchmark(argv, log, cwd, timeout_s):
        calls.append(argv)
        Path(argv[argv.index("--output") + 1]).write_text("{}")
        Path(argv[argv.index("--plot") + 1]).write_bytes(b"PNG")
        log.write_text("fake benchmark\n")
        return 0
    return run_benchmark


def fake_kit(executor=ModelExecutor, calls=None) -> Kit:
    return Kit(machine_checks=lambda: READY, probe=lambda: H100, bindings=lambda: bindings(executor),
               llmapi=fake_llmapi.api, gpu=lambda: {"name": H100.gpu_name, "capability": [9, 0], "memory_gib": 79.2},
               installed=lambda name: None, device="cpu", run=fake_benchmark(calls if calls is not None else []))


# the demo checkpoints every test's run reads, written once per test process (each run's engines,
# reports and data stay in its own tmp_path)
CHECKPOINTS = Path(tempfile.gettempdir()) / f"lyre-gpucheck-checkpoints-{os.getpid()}"
atexit.register(shutil.rmtree, CHECKPOINTS, ignore_errors=True)


def context(tmp_path, kit, backend="trtllm"):
    ctx = make_context(tmp_path / "report", backend, kit, work=tmp_path / "work", shapes=("tiny",),
                       calibration_samples=2, levels="1,2", timeout_s=600)
    ctx.checkpoints = CHECKPOINTS
    return ctx
