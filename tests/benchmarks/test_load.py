"""benchmark.py's load modes (scaling, find-max, all, tuning, the peer), run briefly on the demo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lyre.benchmarks.figures import find_max, meets, parse_slo, percentile
from tests.support.paths import REPO_ROOT

QUICK = ["--set", "sampling.max_tokens=14", "--set", "sampling.min_tokens=14", "--set", "codec.noise=false", "--set", "scheduler.max_concurrent_sessions=8",
         "--set", "scheduler.max_batch_size=8"]
FIGURES = {"requests", "success_rate", "ttfb_ms_p50", "ttfb_ms_p95", "ttfb_ms_p99", "underruns",
           "streams_without_underrun", "real_time_streams", "audio_s_per_wall_s", "server_tokens_per_s", "rtf_p50",
           "per_request"}


def bench(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmark.py", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=timeout)


def test_scaling_with_slo_search_plot_and_peer(tmp_path):
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    run = bench("--mode", "scaling", "--levels", "1,2", "--requests", "2", "--find-max",
                "--slo", "success=1.0,ttfb_p95_ms=60000", "--baseline", "transformers", "--plot", str(png),
                "--output", str(out), *QUICK)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    lyre = result["engines"]["lyre"]
    assert [lv["concurrency"] for lv in lyre["levels"]] == [1, 2]
    for entry in result["engines"].values():
        for lv in entry["levels"]:
            assert FIGURES <= set(lv) and lv["success_rate"] == 1.0 and len(lv["per_request"]) == 2
            assert lv["ttfb_ms_p50"] <= lv["ttfb_ms_p95"] <= lv["ttfb_ms_p99"]
            assert lv["server_tokens_per_s"] > 0
    # The search agrees with the sweep: every level met this lenient SLO, so the answer is the top one.
    assert all(meets(lv, parse_slo("success=1.0,ttfb_p95_ms=60000")) for lv in lyre["levels"])
    assert lyre["find_max"]["max_concurrency"] == 2
    ratios = result["ratios_vs_transformers"]["lyre"]
    assert [r["concurrency"] for r in ratios] == [1, 2] and all(r["server_tokens_per_s"] > 0 for r in ratios)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert result["machine"]["python"] and result["settings"]["mode"] == "scaling"
    assert "lyre / transformers at 2 users" in run.stdout and "largest concurrency meeting" in run.stdout


def test_an_impossible_slo_finds_zero(tmp_path):
    out = tmp_path / "r.json"
    run = bench("--mode", "scaling", "--levels", "1", "--requests", "1", "--find-max", "--slo", "ttfb_p95_ms=0.001",
                "--protocol", "rest", "--output", str(out), *QUICK)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(out.read_text())["engines"]["lyre"]["find_max"]["max_concurrency"] == 0


def test_all_mode_against_a_running_server_over_grpc(server, tmp_path):
    out = tmp_path / "all.json"
    run = bench("--mode", "all", "--requests", "3", "--concurrent", "2", "--rps", "20", "--protocol", "grpc",
                "--url", server.http, "--grpc-url", server.grpc, "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("single", "closed_loop", "open_loop"):
        assert FIGURES <= set(result[key]) and result[key]["success_rate"] == 1.0
    assert result["open_loop"]["rps"] == 20 and result["closed_loop"]["concurrency"] == 2
    assert [lv["concurrency"] for lv in result["engines"]["lyre"]["levels"]] == [1, 2]


def test_an_encoded_format_over_rest_reports_ttfb_and_decoded_seconds_without_underruns(server, tmp_path):
    out = tmp_path / "opus.json"
    run = bench("--mode", "scaling", "--levels", "2", "--requests", "2", "--protocol", "rest", "--format", "opus",
                "--url", server.http, "--find-max", "--slo", "success=1.0,ttfb_p95_ms=60000", "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    level = json.loads(out.read_text())["engines"]["lyre"]["levels"][0]
    assert level["success_rate"] == 1.0 and level["ttfb_ms_p50"] > 0
    assert all(abs(r["audio_s"] - 28 / 7 * 2048 / 24000) < 0.03 for r in level["per_request"])  # decoded Opus
    assert level["underruns"] is None and level["real_time_streams"] is None
    assert "     -/2" in run.stdout  # real-time streams: not measured
    refused = bench("--mode", "scaling", "--protocol", "rest", "--format", "opus", "--url", server.http, "--find-max")
    assert refused.returncode == 2 and "measures no underruns" in refused.stderr
    ws = bench("--mode", "scaling", "--protocol", "ws", "--format", "mp3", "--url", server.http)
    assert ws.returncode == 2 and "--format is for --protocol rest" in ws.stderr


def test_tuning_mode_restarts_the_server_per_setting_and_names_the_best(tmp_path):
    out = tmp_path / "tuning.json"
    run = bench("--mode", "tuning", "--grid-policies", "fair,deadline", "--grid-batch", "4", "--grid-flush", "7:14",
                "--requests", "2", "--set", "tuning.conversational.target_concurrent=2",
                "--set", "tuning.longform.target_concurrent=1", "--protocol", "rest", "--output", str(out), *QUICK)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["profiles"]) == {"conversational", "longform"}
    for profile in result["profiles"].values():
        assert len(profile["points"]) == 2 and profile["best"]["policy"] in ("fair", "deadline")
    assert "best: {" in run.stdout


def test_bad_arguments_are_refused(tmp_path):
    assert "--slo" in bench("--mode", "scaling", "--levels", "1", "--find-max", "--slo", "fast=1", *QUICK).stderr
    missing = bench("--mode", "scaling", "--texts", str(tmp_path / "nope.txt"), "--levels", "1")
    assert missing.returncode == 1 and "neither a built-in set" in missing.stderr
    grpc_url = bench("--mode", "scaling", "--protocol", "grpc", "--url", "http://127.0.0.1:1")
    assert grpc_url.returncode == 2 and "--grpc-url" in grpc_url.stderr


def test_find_max_bisects_to_the_boundary():
    seen = []

    def measure(n):
        seen.append(n)
        return {"success_rate": 1.0, "ttfb_ms_p50": 10.0 * n, "ttfb_ms_p95": 10.0 * n, "ttfb_ms_p99": 10.0 * n,
                "underruns": 0, "streams_without_underrun": 1.0}

    best, tried = find_max(measure, parse_slo("ttfb_p95_ms=125"), 32)
    assert best == 12 and len(seen) <= 7 and sorted(seen) == [t["ttfb_ms_p95"] / 10 for t in tried]
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
    with pytest.raises(ValueError):
        parse_slo("ttfb_p95_ms=abc")


def test_scaling_measures_one_server_per_codec_mode_with_the_codec_cost_and_an_underrun_slo(tmp_path):
    out = tmp_path / "modes.json"
    run = bench("--mode", "scaling", "--levels", "1", "--requests", "2", "--codec-modes", "stream,window",
                "--find-max", "--slo", "success=1.0,underruns=1000", "--output", str(out), *QUICK,
                "--set", "sampling.max_tokens=84", "--set", "sampling.min_tokens=84")  # 12 frames: past the fixed costs
    assert run.returncode == 0, run.stderr[-3000:]
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"lyre-stream", "lyre-window"}
    stream, window = engines["lyre-stream"]["levels"][0], engines["lyre-window"]["levels"][0]
    assert stream["codec_ms_per_frame"] > 0 and window["codec_ms_per_frame"] > 0
    assert window["decoded_per_emitted"] > stream["decoded_per_emitted"]  # windows of context cost more
    assert all(e["find_max"]["max_concurrency"] == 1 for e in engines.values())
    assert "lyre-window" in run.stdout and "codec ms/frame" in run.stdout
    refused = bench("--mode", "scaling", "--url", "http://127.0.0.1:1", "--codec-modes", "stream")
    assert refused.returncode == 2 and "--codec-modes starts one server per mode" in refused.stderr


def test_a_cloned_voice_with_and_without_the_kept_prefix(tmp_path):
    out = tmp_path / "clone.json"
    run = bench("--mode", "scaling", "--levels", "1", "--requests", "3", "--voice", "tara,clone",
                "--prefix-cache", "on,off", "--protocol", "rest", "--output", str(out), *QUICK,
                "--set", f"data_dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"lyre-cache-on/tara", "lyre-cache-on/clone", "lyre-cache-off/tara", "lyre-cache-off/clone"}
    level = {name: e["levels"][0] for name, e in engines.items()}
    assert engines["lyre-cache-on/clone"]["voice"].startswith("v_")
    for name, lv in level.items():
        assert lv["success_rate"] == 1.0 and lv["prompt_tokens_per_request"] > 0, name
    on, off = level["lyre-cache-on/clone"], level["lyre-cache-off/clone"]
    assert on["prompt_tokens_per_request"] == off["prompt_tokens_per_request"] > 600  # an 8 s reference turn
    assert off["prefilled_tokens_per_request"] == off["prompt_tokens_per_request"]  # computed every time
    assert on["prefilled_tokens_per_request"] < on["prompt_tokens_per_request"] / 2  # kept after the first
    assert level["lyre-cache-on/tara"]["prompt_tokens_per_request"] < 100
    assert "prompt/prefilled" in run.stdout
    refused = bench("--mode", "scaling", "--prefix-cache", "maybe", *QUICK)
    assert refused.returncode == 2 and "--prefix-cache takes on and/or off" in refused.stderr
