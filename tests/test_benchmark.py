"""``benchmark.py --mode engine``: runs briefly and writes every figure."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO_ROOT


def test_engine_mode_writes_the_figures_and_a_table(demo_dir, tmp_path):
    out_file = tmp_path / "engine.json"
    run = subprocess.run(
        [sys.executable, "benchmark.py", "--mode", "engine", "--checkpoint", str(demo_dir / "llama"),
         "--concurrency", "1,3", "--max-tokens", "8", "--baseline-requests", "1", "--output", str(out_file)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    assert [lv["concurrency"] for lv in result["engine"]] == [1, 3]
    for lv in result["engine"]:
        assert lv["tokens"] == 8 * lv["concurrency"]
        assert lv["tokens_per_s"] > 0 and lv["step_ms_p50"] > 0
    base = result["transformers_sequential"]
    assert base["tokens"] == 8 and base["tokens_per_s"] > 0
    assert result["machine"]["torch"] and result["settings"]["max_tokens"] == 8
    assert "engine, 3 concurrent" in run.stdout and "transformers, sequential" in run.stdout


def test_unknown_mode_and_bad_levels_are_refused():
    run = subprocess.run([sys.executable, "benchmark.py", "--mode", "engine", "--concurrency", "0,2"],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert run.returncode == 2 and "concurrency levels must be integers >= 1" in run.stderr


def test_service_mode_reports_ttfb_and_real_time_streams_per_policy(tmp_path):
    out_file = tmp_path / "service.json"
    run = subprocess.run(
        [sys.executable, "benchmark.py", "--mode", "service", "--concurrency", "1,3", "--max-tokens", "14",
         "--set", "sampling.min_tokens=14",
         "--policies", "fair,deadline", "--output", str(out_file)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    assert set(result["policies"]) == {"fair", "deadline"}
    for levels in result["policies"].values():
        assert [lv["concurrency"] for lv in levels] == [1, 3]
        for lv in levels:
            assert 0 < lv["ttfb_ms_p50"] <= lv["ttfb_ms_p95"]
            assert 0 <= lv["real_time_streams"] <= lv["concurrency"] and lv["audio_s_per_wall_s"] > 0
    assert "deadline" in run.stdout and "TTFB p95 ms" in run.stdout
    bad = subprocess.run([sys.executable, "benchmark.py", "--mode", "service", "--policies", "lifo"],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "--policies takes fair and/or deadline" in bad.stderr
