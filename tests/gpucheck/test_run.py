"""``python -m lyre.gpucheck``, the acceptance run for a GPU machine: on this CPU machine it stops at
the environment stage saying so; the whole run against FAKES of what needs a GPU
(``tests/support/gpucheck.py``), its environment checks, its time limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lyre.engine.backend import Environment
from lyre.gpucheck import stages
from lyre.gpucheck.environment import pin_violations
from lyre.gpucheck.prereqs import Check
from lyre.gpucheck.report import StageFailed
from lyre.gpucheck.run import run
from tests.support.gpucheck import H100, READY, context, fake_kit
from tests.support.paths import REPO_ROOT
from tests.support.waiting import until


def test_on_a_machine_without_a_gpu_it_stops_at_the_environment_stage_saying_so(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lyre.gpucheck", "--out", str(tmp_path / "r")], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    report = (tmp_path / "r" / "REPORT.md").read_text()
    assert report.startswith("# Lyre GPU acceptance run: FAILED at stage 1 (environment)")
    assert "this machine has no NVIDIA GPU" in report and "| 2 | build | not run |" in report
    assert json.loads((tmp_path / "r" / "report.json").read_text())["passed"] is False
    assert "the report is" in out.stdout


@pytest.mark.slow  # (every stage end to end, ~30 s: each stage has its own tests in test_stages.py)
def test_every_stage_passes_against_engines_that_compute_what_the_checkpoint_does(tmp_path):
    calls: list = []
    report = run(context(tmp_path, fake_kit(calls=calls)), "python -m lyre.gpucheck", say=lambda _: None)
    assert [s.status for s in report.stages] == ["pass"] * 7, [(s.name, s.summary) for s in report.stages]
    text = (tmp_path / "report" / "REPORT.md").read_text()
    assert text.startswith("# Lyre GPU acceptance run: PASSED")
    by = {s.name: s for s in report.stages}
    assert by["cloned"].data["control_parted"] >= 1  # the executor's own penalty parts from Lyre's
    assert by["build"].data["tiny-fp8"]["quantization"] == "fp8" and by["build"].data["tiny-fp16"]["dtype"] == "float16"
    assert by["build"].data["tiny-fp8"]["dtype"] == "bfloat16"  # the demo checkpoint's: calibrated as served
    saved = json.loads((tmp_path / "work" / "engines" / "tiny-fp8" / "tokenizer.json").read_text())
    assert saved["post_processor"] is not None  # beside the engine: the checkpoint's tokenizer, not the staged one
    assert by["constraint"].data["tokens"] == 168
    assert by["parity"].data == {"identical": 4, "requests": 4}, by["parity"].details
    assert (by["cloned"].data["identical"], by["cloned"].data["requests"]) == (2, 2)
    assert "windowed penalty" in by["cloned"].summary
    argv = calls[0]
    assert argv[1:5] == ["benchmark.py", "--mode", "scaling", "--levels"] and "model.backend=trtllm" in argv
    assert f"build.engine_dir={tmp_path / 'work' / 'engines' / 'tiny-fp8'}" in argv
    assert (tmp_path / "report" / "scaling.png").is_file()
    # (on this CPU the stage holds the eager static steps to themselves: its graphs need the GPU)
    assert by["qwen3-tts"].data["steps"] > 20 and by["qwen3-tts"].data["talker_graphs"] == 0


def test_the_torch_backend_runs_its_stages_on_the_pytorch_engine(tmp_path):
    calls: list = []
    report = run(context(tmp_path, fake_kit(calls=calls), backend="torch"), "cmd", say=lambda _: None)
    assert [(s.name, s.status) for s in report.stages] == [("environment", "pass"), ("constraint", "pass"),
                                                         ("perf", "pass"), ("scaling", "pass"), ("qwen3-tts", "pass")]
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

    def dead() -> bool:  # gone, or dead and unreaped (a SIGKILL takes effect when the child is next scheduled)
        try:
            return stat.read_text().split(")")[1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    until(dead, 30, f"process {child} (its group was killed) to die")
    assert run_logged(["bash", "-c", "echo hi; exit 3"], tmp_path / "log2", tmp_path, timeout_s=60) == 3
    assert (tmp_path / "log2").read_text() == "hi\n"


def test_processes_a_command_leaves_behind_are_stopped_however_it_ends(tmp_path):
    """A benchmark that exits (or is stopped) while its server still drains: the server goes too, with
    SIGKILL when it does not end on SIGTERM within the grace."""
    from lyre.gpucheck.context import TIMED_OUT, run_logged

    for i, (script, timeout, status) in enumerate((("trap '' TERM; sleep 300 & echo $! > {pid}; exit 0", 60, 0),
                                                   ("(trap '' TERM; sleep 300) & echo $! > {pid}; wait", 3,
                                                    TIMED_OUT))):
        pidfile = tmp_path / f"child{i}.pid"
        assert run_logged(["bash", "-c", script.format(pid=pidfile)], tmp_path / f"log{i}", tmp_path,
                          timeout_s=timeout, grace_s=1) == status
        stat = Path(f"/proc/{int(pidfile.read_text())}/stat")

        def dead(stat: Path = stat) -> bool:  # gone, or dead and unreaped
            try:
                return stat.read_text().split(")")[1].split()[0] == "Z"
            except FileNotFoundError:
                return True

        until(dead, 30, f"the left-behind process of script {i} to die")


def test_mpi_is_found_through_ld_library_path_as_nvidias_containers_have_it(tmp_path, monkeypatch):
    from lyre.gpucheck import prereqs

    lib, bin_dir = tmp_path / "hpcx" / "lib", tmp_path / "bin"
    lib.mkdir(parents=True)
    bin_dir.mkdir()
    (lib / "libmpi.so.40").write_bytes(b"")
    (bin_dir / "mpirun").write_text("#!/bin/sh\n")
    (bin_dir / "mpirun").chmod(0o755)
    monkeypatch.setattr(prereqs, "_run", lambda argv: "")  # an ld cache without MPI
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{lib}")
    assert prereqs.check_mpi().ok
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    missing = prereqs.check_mpi()
    assert not missing.ok and "apt-get install -y libopenmpi-dev (then again)" in missing.fix


def test_the_qwen_stage_fails_when_the_captured_steps_make_other_frames(tmp_path, monkeypatch):
    """The stage's comparison can fail: a second run that makes other frames than the first (here a
    talker step that drops every other row's hidden state, as a wrong graph would) is named."""
    from lyre.engine.qwen3 import decode_graph
    from lyre.gpucheck import qwen

    real_init, real_forward, made = decode_graph.StaticDecode.__init__, decode_graph.static_forward, []

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    def broken(llama, cache, x, positions, valid, length):
        out = real_forward(llama, cache, x, positions, valid, length)
        return out.flip(0) if len(made) == 2 else out  # (the second engine's steps: rows swapped)

    monkeypatch.setattr(decode_graph.StaticDecode, "__init__", init)
    monkeypatch.setattr(decode_graph, "static_forward", broken)
    with pytest.raises(StageFailed, match="differ from the eager ones"):
        qwen.stage_qwen(context(tmp_path, fake_kit(), backend="torch"))
