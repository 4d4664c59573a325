"""``python -m lyre.gpucheck``, the acceptance run for a GPU machine: on this CPU machine it stops at
the environment stage saying so; its stages run against FAKES of what needs a GPU (the executor
bindings, whose logits come from the checkpoint through transformers, and the LLM API's build)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lyre.engine.backend import Environment
from lyre.gpucheck import stages
from lyre.gpucheck.context import Kit
from lyre.gpucheck.environment import pin_violations
from lyre.gpucheck.prereqs import Check
from lyre.gpucheck.run import make_context, run
from tests.support import fake_llmapi
from tests.support import fake_trtllm as tle
from tests.support.model_executor import ModelExecutor, bindings
from tests.support.paths import REPO_ROOT

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


def context(tmp_path, kit, backend="trtllm"):
    return make_context(tmp_path / "report", backend, kit, work=tmp_path / "work", shapes=("tiny",),
                        calibration_samples=2, levels="1,2", timeout_s=600)


def test_on_a_machine_without_a_gpu_it_stops_at_the_environment_stage_saying_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lyre.gpucheck", "--out", str(tmp_path / "r")], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    report = (tmp_path / "r" / "REPORT.md").read_text()
    assert report.startswith("# Lyre GPU acceptance run: FAILED at stage 1 (environment)")
    assert "this machine has no NVIDIA GPU" in report and "| 2 | build | not run |" in report
    assert json.loads((tmp_path / "r" / "report.json").read_text())["passed"] is False
    assert "the report is" in out.stdout


def test_every_stage_passes_against_engines_that_compute_what_the_checkpoint_does(tmp_path):
    calls: list = []
    report = run(context(tmp_path, fake_kit(calls=calls)), "python -m lyre.gpucheck", say=lambda _: None)
    assert [s.status for s in report.stages] == ["pass"] * 6, [(s.name, s.summary) for s in report.stages]
    text = (tmp_path / "report" / "REPORT.md").read_text()
    assert text.startswith("# Lyre GPU acceptance run: PASSED")
    by = {s.name: s for s in report.stages}
    assert by["build"].data["tiny-fp8"]["quantization"] == "fp8" and by["build"].data["tiny-fp16"]["dtype"] == "float16"
    assert by["build"].data["tiny-fp8"]["dtype"] == "bfloat16"  # the demo checkpoint's: calibrated as served
    assert by["constraint"].data["tokens"] == 168
    assert by["parity"].data == {"identical": 4, "requests": 4}, by["parity"].details
    assert by["cloned"].data == {"identical": 2, "requests": 2} and "windowed penalty" in by["cloned"].summary
    argv = calls[0]
    assert argv[1:5] == ["benchmark.py", "--mode", "scaling", "--levels"] and "model.backend=trtllm" in argv
    assert f"build.engine_dir={tmp_path / 'work' / 'engines' / 'tiny-fp8'}" in argv
    assert (tmp_path / "report" / "scaling.png").is_file()


def test_the_parity_stage_fails_naming_the_first_token_where_the_engines_part(tmp_path):
    """The plain fake executor samples from seeded random logits, not the checkpoint's: the greedy
    tokens part at once, far from a near-tie, and the run stops there."""
    report = run(context(tmp_path, fake_kit(executor=tle.Executor)), "python -m lyre.gpucheck", say=lambda _: None)
    assert [s.status for s in report.stages] == ["pass", "pass", "pass", "FAIL", "not run", "not run"]
    parity = report.stages[3]
    assert parity.summary.startswith("4 of 4 requests differ") and "token 0 is" in parity.summary
    assert "more than a 16-bit near-tie" in parity.summary
    assert "FAILED at stage 4 (parity)" in (tmp_path / "report" / "REPORT.md").read_text()


def test_the_torch_backend_runs_its_stages_on_the_pytorch_engine(tmp_path):
    calls: list = []
    report = run(context(tmp_path, fake_kit(calls=calls), backend="torch"), "cmd", say=lambda _: None)
    assert [(s.name, s.status) for s in report.stages] == [("environment", "pass"), ("constraint", "pass"),
                                                         ("scaling", "pass")]
    assert "model.backend=torch" in calls[0] and not any(a.startswith("build.engine_dir") for a in calls[0])


def test_environment_problems_are_all_named_and_stop_the_run(tmp_path):
    kit = fake_kit()
    kit.machine_checks = lambda: [READY[0], Check("driver", False, "driver 550.54, supports CUDA 12.4",
                                                  "TensorRT-LLM 1.2.1 needs CUDA 13"), *READY[2:]]
    kit.probe = lambda: Environment(H100.gpu_name, (9, 0), None, None, "import tensorrt_llm failed: OSError: libmpi")
    kit.installed = {"numpy": "2.1.0", "transformers": "4.57.3"}.get
    report = run(context(tmp_path, kit), "cmd", say=lambda _: None)
    env = report.stages[0]
    assert env.status == "FAIL" and report.stages[1].status == "not run"
    problems = env.data["problems"]
    assert any("needs CUDA 13" in p for p in problems) and any("libmpi" in p for p in problems)
    assert "package versions: numpy 2.1.0 is installed; the requirement is numpy<2" in problems
    assert not any("transformers" in p for p in problems)


def test_pin_violations_read_markers_and_ignore_what_is_not_installed():
    found = {"numpy": "1.26.4", "setuptools": "80.1", "h5py": "3.12.1"}.get
    assert pin_violations(["numpy<2", "setuptools<80", "h5py==3.12.1", "absent==1.0",
                           "nvidia-cutlass-dsl==4.3.4; python_version < '3.0'"], found) == [
        "setuptools 80.1 is installed; the requirement is setuptools<80"]


@pytest.mark.parametrize("torch_tokens, tested_tokens, expected", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 2, 4], 2), ([1, 2], [1, 2, 3], 2), ([5], [6], 0)])
def test_first_difference(torch_tokens, tested_tokens, expected):
    assert stages.first_difference(torch_tokens, tested_tokens) == expected


def test_a_command_past_its_time_limit_is_stopped_with_every_process_it_started(tmp_path):
    """The scaling benchmark starts servers: past --scaling-timeout the whole process group goes."""
    from lyre.gpucheck.context import TIMED_OUT, run_logged

    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    assert run_logged(["bash", "-c", script], tmp_path / "log", tmp_path, timeout_s=3) == TIMED_OUT
    child = int(pidfile.read_text())
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split(")")[1].split()[0] == "Z"  # gone, or dead and unreaped
    assert run_logged(["bash", "-c", "echo hi; exit 3"], tmp_path / "log2", tmp_path, timeout_s=60) == 3
    assert (tmp_path / "log2").read_text() == "hi\n"
