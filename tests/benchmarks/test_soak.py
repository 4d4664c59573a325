"""The reliability suite as CI runs it: benchmark.py --mode soak with 300 requests (the README's
figure uses 10 000). Its figures are asserted where they are counts, reported where they are times."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO_ROOT


def test_soak_overload_drain_and_fuzz_leave_nothing_behind(tmp_path, demo_dir):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "benchmark.py", "--mode", "soak", "--requests", "300", "--concurrent", "8",
         "--fuzz-examples", "100", "--set", f"model.demo_dir={demo_dir}", "--set", "codec.noise=false",
         "--set", "scheduler.max_concurrent_sessions=8", "--set", "scheduler.max_batch_size=8",
         "--set", "scheduler.max_pending=8", "--output", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    soak, overload, drain, fuzz = r["soak"], r["overload"], r["drain"], r["fuzz"]
    assert soak["requests"] == 300 and soak["disconnected"] > 50  # ~30% went away at a random moment
    assert soak["unexpected"] == 0, soak["unexpected_examples"]
    assert soak["complete_with_all_audio"] == soak["asked_complete"] > 100
    nothing_left = {"kv_slots_used": 0, "active_sessions": 0, "pending_sessions": 0, "codec_states": 0}
    assert {k: soak["after"][k] for k in nothing_left} == nothing_left
    assert overload["burst"] == 160 and overload["refused"] > 0 and overload["probes_refused"] > 0
    assert overload["refused_clearly"] == overload["refusals"]  # every refusal is 429+Retry-After / RESOURCE_EXHAUSTED
    assert overload["admitted_complete"] == overload["admitted"]  # nobody admitted timed out
    assert {k: overload["after"][k] for k in nothing_left} == nothing_left
    assert drain["completed_with_all_audio"] == drain["finishing_in_time"]
    assert drain["cancelled_with_a_message"] == drain["too_long"] and drain["exit_code"] == 0
    assert fuzz["violations"] == [] and fuzz["health"] == 200
    assert {k: fuzz["after"][k] for k in nothing_left} == nothing_left
    assert r["log_errors"] == [] and drain["log_errors"] == []
    assert "soak      300 requests" in run.stdout and "rejection p50" in run.stdout
