"""``benchmark.py --mode isolation``, its quick form end to end on a real server (the narrow test codec):
every phase runs, every attacker process is stopped by its pid, the server's resources are
measured. Whether the server meets the goals under attack (issue 24) is what the mode reports, on
the machine it runs on; it is not asserted here, nor is any time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lyre.benchmarks.isolation import ATTACKS
from tests.support.narrow_codec import narrow_codec


@pytest.mark.slow  # (a benchmark run, ~50 s: the isolation itself is held by tests/api/test_account_quotas.py and test_connections.py)
def test_the_quick_isolation_run_measures_every_phase_and_stops_every_attacker(bench, tmp_path, demo_dir):
    out = tmp_path / "isolation.json"
    run = bench("--mode", "isolation", "--quick", "--set", f"model.demo_dir={demo_dir}",
                "--set", f"codec.path={narrow_codec()}", "--set", "codec.noise=false",
                "--set", "scheduler.max_concurrent_sessions=4", "--set", "scheduler.max_batch_size=4",
                "--set", "scheduler.max_pending=4", "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["settings"]["nofile"] == r["nofile"] == 256 and r["server_exit"] == 0
    idle = r["idle"]
    assert idle["rss_mb"] > 0 and 0 < idle["fds"] < 256
    assert idle["warmup_ok"] == idle["warmup_calls"] == 4  # the victim's client works: 2 syntheses, verify, enroll
    assert [p["phase"] for p in r["phases"]] == ["quiet", *ATTACKS]
    for p in r["phases"]:
        assert "skipped" not in p, p
        victim = p["victim"]
        assert victim["speech"]["requests"] >= 3 and victim["verify"]["calls"] == victim["enroll"]["calls"] == 1
        assert victim["health"]["polls"] >= 3
        assert p["peak"]["samples"] > 0 and p["peak"]["rss_mb"] > 0 and p["peak"]["fds"] > 0  # measured throughout
        assert set(p["after"]["back"]) == {"sessions", "fds", "rss", "uploads"} and p["after"]["rss_mb"] > 0
        assert set(p["verdict"]) <= {"success", "ttfb", "rss", "health", "idle"}
    assert r["phases"][0]["attack"] is None
    for p in r["phases"][1:]:
        attack = p["attack"]
        # stopped by SIGTERM to its own pid, and gone; it said when it was in place and what it did
        assert attack["stopped"] and not Path(f"/proc/{attack['pid']}").exists(), attack
        assert attack["exit_code"] == 0 and not attack["killed"], attack
        assert attack["ready"] is not None and attack["counts"], attack
    attacked = {p["phase"]: p["attack"]["counts"] for p in r["phases"][1:]}
    assert attacked["half_open"].get("opened", 0) > 0
    assert attacked["stalled_verify"].get("stalled", 0) > 0
    assert any(k.startswith("enroll_http_") for k in attacked["enrollment_flood"])
    assert any("_enroll_http_" in k or "_verify_http_" in k for k in attacked["oversized_audio"])
    for label in ("quiet", "half-open flood", "account flood", "stalled verify", "enrollment flood", "oversized audio"):
        assert label in run.stdout
    assert "peak RSS MB" in run.stdout and "stopped (exit 0)" in run.stdout


def test_bad_isolation_arguments_are_refused_before_any_server_starts(bench):
    attacks = bench("--mode", "isolation", "--attacks", "half_open,telepathy")
    assert attacks.returncode == 2 and "--attacks takes half_open, account_flood" in attacks.stderr
    url = bench("--mode", "isolation", "--url", "http://127.0.0.1:1")
    assert url.returncode == 2 and "starts its own server (no --url)" in url.stderr
    nofile = bench("--mode", "isolation", "--nofile", "10")
    assert nofile.returncode == 2 and "--nofile must be >= 64" in nofile.stderr
