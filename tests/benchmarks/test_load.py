"""benchmark.py's load modes (scaling, find-max, all, tuning, the peer), run briefly on the demo and
called in-process (``bench``: tests/benchmarks/conftest.py). Where the mode does not need a server of
its own, it loads the shared test server (``--url``); the runs that start one server per setting
(tuning, codec modes, the kept prefix on and off) are slow (``pytest -m slow``), with runs of one
setting here."""

from __future__ import annotations

import json

import pytest

from lyre.benchmarks.figures import find_max, meets, parse_slo, percentile
from tests.support.narrow_codec import narrow_codec

QUICK = ["--set", f"codec.path={narrow_codec()}", "--set", "sampling.max_tokens=14", "--set", "sampling.min_tokens=14", "--set", "codec.noise=false",
         "--set", "scheduler.max_concurrent_sessions=8", "--set", "scheduler.max_batch_size=8"]
FIGURES = {"requests", "success_rate", "ttfb_ms_p50", "ttfb_ms_p95", "ttfb_ms_p99", "underruns",
           "streams_without_underrun", "real_time_streams", "audio_s_per_wall_s", "server_tokens_per_s", "rtf_p50",
           "per_request"}
LENIENT = "success=1.0,ttfb_p95_ms=60000"  # every level meets it: the search must answer the top one
LENIENT_PCM = LENIENT + ",underruns=100000"  # (underruns are measured on PCM only)


@pytest.mark.slow  # (a benchmark run, ~20 s)
def test_scaling_with_slo_search_plot_and_peer(bench, server, tmp_path):
    out, png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    run = bench("--mode", "scaling", "--levels", "1,2", "--requests", "2", "--find-max", "--slo", LENIENT_PCM,
                "--url", server.http, "--baseline", "transformers", "--plot", str(png), "--output", str(out),
                *QUICK)  # (the settings go to the peer the benchmark starts; Lyre is the shared server)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["engines"]) == {"lyre", "transformers"}
    lyre = result["engines"]["lyre"]
    assert [lv["concurrency"] for lv in lyre["levels"]] == [1, 2]
    for entry in result["engines"].values():
        for lv in entry["levels"]:
            assert FIGURES <= set(lv) and lv["success_rate"] == 1.0 and len(lv["per_request"]) == 2
            assert lv["ttfb_ms_p50"] <= lv["ttfb_ms_p95"] <= lv["ttfb_ms_p99"]
            assert lv["server_tokens_per_s"] > 0
    # The search agrees with the sweep: every level met this lenient SLO, so the answer is the top one.
    assert all(meets(lv, parse_slo(LENIENT_PCM)) for lv in lyre["levels"])
    assert lyre["find_max"]["max_concurrency"] == 2
    ratios = result["ratios_vs_transformers"]["lyre"]
    assert [r["concurrency"] for r in ratios] == [1, 2] and all(r["server_tokens_per_s"] > 0 for r in ratios)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert result["machine"]["python"] and result["settings"]["mode"] == "scaling"
    assert "lyre / transformers at 2 users" in run.stdout and "largest concurrency meeting" in run.stdout
    for lv in lyre["levels"]:  # the server's CPU per audio second, by part (the peer's parts are not charged)
        cost = lv["cpu_s_per_audio_s"]
        assert set(cost) == {"model", "sampling", "codec", "encoding", "rest", "total"}
        assert cost["model"] > 0 and cost["sampling"] > 0 and cost["codec"] > 0
        assert cost["total"] == pytest.approx(sum(v for k, v in cost.items() if k != "total"), rel=1e-6)
    assert "server CPU s per audio s" in run.stdout


def test_an_impossible_slo_finds_zero(bench, server, tmp_path):
    out = tmp_path / "r.json"
    run = bench("--mode", "scaling", "--levels", "1", "--requests", "1", "--find-max", "--slo", "ttfb_p95_ms=0.001",
                "--protocol", "rest", "--url", server.http, "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(out.read_text())["engines"]["lyre"]["find_max"]["max_concurrency"] == 0


def test_all_mode_against_a_running_server_over_grpc(bench, server, tmp_path):
    out = tmp_path / "all.json"
    run = bench("--mode", "all", "--requests", "3", "--concurrent", "2", "--rps", "20", "--protocol", "grpc",
                "--url", server.http, "--grpc-url", server.grpc, "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("single", "closed_loop", "open_loop"):
        assert FIGURES <= set(result[key]) and result[key]["success_rate"] == 1.0
    assert result["open_loop"]["rps"] == 20 and result["closed_loop"]["concurrency"] == 2
    assert [lv["concurrency"] for lv in result["engines"]["lyre"]["levels"]] == [1, 2]


def test_an_encoded_format_over_rest_reports_ttfb_and_decoded_seconds_without_underruns(bench, server, tmp_path):
    out = tmp_path / "opus.json"
    run = bench("--mode", "scaling", "--levels", "2", "--requests", "2", "--protocol", "rest", "--format", "opus",
                "--url", server.http, "--find-max", "--slo", LENIENT, "--output", str(out))
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


def test_bad_arguments_are_refused_before_any_server_starts(bench, tmp_path):
    slo = bench("--mode", "scaling", "--levels", "1", "--find-max", "--slo", "fast=1", *QUICK)
    assert slo.returncode == 1 and "--slo: 'fast=1' must be name=value" in slo.stderr
    missing = bench("--mode", "scaling", "--texts", str(tmp_path / "nope.txt"), "--levels", "1")
    assert missing.returncode == 1 and "neither a built-in set" in missing.stderr
    grpc_url = bench("--mode", "scaling", "--protocol", "grpc", "--url", "http://127.0.0.1:1")
    assert grpc_url.returncode == 2 and "--grpc-url" in grpc_url.stderr
    modes = bench("--mode", "scaling", "--url", "http://127.0.0.1:1", "--codec-modes", "stream")
    assert modes.returncode == 2 and "--codec-modes starts one server per mode" in modes.stderr
    cache = bench("--mode", "scaling", "--prefix-cache", "maybe", *QUICK)
    assert cache.returncode == 2 and "--prefix-cache takes on and/or off" in cache.stderr
    tuning = bench("--mode", "tuning", "--url", "http://127.0.0.1:1")
    assert tuning.returncode == 1 and "needs a server it owns" in tuning.stderr


def test_find_max_bisects_to_the_boundary():
    seen = []

    def measure(n):
        seen.append(n)
        return {"success_rate": 1.0, "ttfb_ms_p50": 10.0 * n, "ttfb_ms_p95": 10.0 * n, "ttfb_ms_p99": 10.0 * n,
                "underruns": 0, "streams_without_underrun": 1.0}

    best, tried = find_max(measure, parse_slo("ttfb_p95_ms=125"), 32)
    assert best == 12 and len(seen) <= 7 and sorted(seen) == [t["ttfb_ms_p95"] / 10 for t in tried]
    swept = {n: measure(n) for n in (1, 16, 32)}
    seen.clear()
    assert find_max(measure, parse_slo("ttfb_p95_ms=125"), 32, known=swept)[0] == 12
    assert seen and not set(seen) & set(swept)  # a sweep's levels are not measured again
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
    with pytest.raises(ValueError):
        parse_slo("ttfb_p95_ms=abc")


# --------------------------------------------------------------------------------------------
# one server per setting: one setting here, the comparisons slow


def tuning(bench, tmp_path, policies: str, requests: str, users: int):
    out = tmp_path / "tuning.json"
    run = bench("--mode", "tuning", "--grid-policies", policies, "--grid-batch", "4", "--grid-flush", "7:14",
                "--requests", requests, "--set", f"tuning.conversational.target_concurrent={users}",
                "--set", "tuning.longform.target_concurrent=1", "--protocol", "rest", "--output", str(out), *QUICK)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, json.loads(out.read_text())


@pytest.mark.slow  # (a server per profile; the default run keeps its argument checks: test_bad_arguments_are_refused_...)
def test_tuning_mode_starts_a_server_per_setting_and_profile_and_names_the_best(bench, tmp_path):
    run, result = tuning(bench, tmp_path, "fair", "1", users=1)  # one setting: one server per profile
    assert set(result["profiles"]) == {"conversational", "longform"}
    for profile in result["profiles"].values():
        [point] = profile["points"]
        assert point["success_rate"] == 1.0 and point["settings"]["max_batch_size"] == 4
        assert profile["best"] == point["settings"]
    assert "best: {" in run.stdout


@pytest.mark.slow
def test_tuning_mode_restarts_the_server_per_setting_and_names_the_best(bench, tmp_path):
    run, result = tuning(bench, tmp_path, "fair,deadline", "2", users=2)
    assert set(result["profiles"]) == {"conversational", "longform"}
    for profile in result["profiles"].values():
        assert len(profile["points"]) == 2 and profile["best"]["policy"] in ("fair", "deadline")
    assert "best: {" in run.stdout


@pytest.mark.slow  # (a server per setting, ~17 s)
def test_one_server_per_setting_at_one_setting_each(bench, tmp_path):
    """The options that start a server per setting (codec mode, kept prefix), at one setting each,
    on one server: the codec's cost per frame, and a cloned voice's reference kept after its first use."""
    out = tmp_path / "one.json"
    run = bench("--mode", "scaling", "--levels", "1", "--requests", "3", "--codec-modes", "window",
                "--prefix-cache", "on", "--voice", "tara,clone", "--protocol", "rest", "--output", str(out), *QUICK,
                "--set", f"data_dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    engines = json.loads(out.read_text())["engines"]
    assert set(engines) == {"lyre-window-cache-on/tara", "lyre-window-cache-on/clone"}
    level = {name: e["levels"][0] for name, e in engines.items()}
    for name, lv in level.items():
        assert lv["success_rate"] == 1.0 and lv["prompt_tokens_per_request"] > 0, name
        assert lv["codec_ms_per_frame"] > 0 and lv["decoded_per_emitted"] > 1.2, name  # windows of context
    assert engines["lyre-window-cache-on/clone"]["voice"].startswith("v_")
    clone = level["lyre-window-cache-on/clone"]
    assert clone["prompt_tokens_per_request"] > 600  # an 8 s reference turn
    assert clone["prefilled_tokens_per_request"] < clone["prompt_tokens_per_request"] / 2  # kept after the first
    assert level["lyre-window-cache-on/tara"]["prompt_tokens_per_request"] < 100
    assert "codec ms/frame" in run.stdout and "prompt/prefilled" in run.stdout


@pytest.mark.slow
def test_scaling_measures_one_server_per_codec_mode_with_the_codec_cost_and_an_underrun_slo(bench, tmp_path):
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


@pytest.mark.slow
def test_a_cloned_voice_with_and_without_the_kept_prefix(bench, tmp_path):
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
