"""``benchmark.py --mode engine | service | codec | watermark | batch-fill``: each runs briefly and writes every
figure (in-process: ``bench``, tests/benchmarks/conftest.py; the script runs as a process once, in
the codec mode's test). The service mode over every policy and codec mode and the codec mode over
several batch sizes are slow (``pytest -m slow``), each with a run of one setting here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.support.narrow_codec import narrow_codec
from tests.support.paths import REPO_ROOT


def test_engine_mode_writes_the_figures_and_a_table(bench, demo_dir, tmp_path):
    out_file = tmp_path / "engine.json"
    run = bench("--mode", "engine", "--checkpoint", str(demo_dir / "llama"), "--concurrency", "1,3",
                "--max-tokens", "8", "--baseline-requests", "1", "--slot-order", "shuffled", "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    assert [lv["concurrency"] for lv in result["engine"]] == [1, 3]
    for lv in result["engine"]:
        assert lv["tokens"] == 8 * lv["concurrency"]
        assert lv["tokens_per_s"] > 0 and lv["step_ms_p50"] > 0
    base = result["transformers_sequential"]
    assert base["tokens"] == 8 and base["tokens_per_s"] > 0
    assert result["machine"]["torch"] and result["settings"]["max_tokens"] == 8
    assert result["settings"]["slot_order"] == "shuffled"
    assert "engine, 3 concurrent" in run.stdout and "transformers, sequential" in run.stdout


def test_engine_mode_times_the_reference_step_at_every_level(bench, demo_dir, tmp_path):
    """--baseline reference: the minimal static-KV step on the same weights beside the engine's, a
    ratio per level, the transformers run left out with --baseline-requests 0."""
    out_file = tmp_path / "engine.json"
    run = bench("--mode", "engine", "--checkpoint", str(demo_dir / "llama"), "--concurrency", "1,4",
                "--max-tokens", "20", "--baseline-requests", "0", "--baseline", "reference", "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    ref = result["reference"]
    assert ref["context"] % 64 == 0 and 20 < ref["position"] < ref["context"] and ref["graphs"] is False
    for lv in result["engine"]:
        assert lv["reference_step_ms"] > 0 and lv["vs_reference"] == lv["step_ms_p50"] / lv["reference_step_ms"]
        assert ref["step_ms"][str(lv["concurrency"])] == lv["reference_step_ms"]
    assert result["transformers_sequential"]["skipped"] and "transformers, sequential" not in run.stdout
    assert "vs reference" in run.stdout and "engine, 4 concurrent" in run.stdout
    bad = bench("--mode", "scaling", "--baseline", "reference")
    assert bad.returncode == 2 and "--baseline reference is a peer of --mode engine" in bad.stderr


def test_unknown_mode_and_bad_levels_are_refused(bench):
    run = bench("--mode", "engine", "--concurrency", "0,2")
    assert run.returncode == 2 and "concurrency levels must be integers >= 1" in run.stderr
    run = bench("--mode", "telepathy")
    assert run.returncode == 2 and "invalid choice: 'telepathy'" in run.stderr
    for args, message in ((["--policies", "lifo"], "--policies takes fair and/or deadline"),
                          (["--codec-modes", "fast"], "--codec-modes takes stream and/or window"),
                          (["--runtimes", "tensorrt"], "--runtimes takes torch, onnxruntime and/or openvino")):
        mode = "codec" if args[0] == "--runtimes" else "service"
        bad = bench("--mode", mode, *args)
        assert bad.returncode == 2 and message in bad.stderr


def service(bench, tmp_path, policies: str, modes: str):
    out_file = tmp_path / "service.json"
    run = bench("--mode", "service", "--concurrency", "1,3", "--max-tokens", "14", "--set", "codec.noise=false",
                "--set", f"codec.path={narrow_codec()}",
                "--policies", policies, "--codec-modes", modes, "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    runs = {(r["policy"], r["codec_mode"]): r["levels"] for r in result["runs"]}
    for (_, mode), levels in runs.items():
        assert [lv["concurrency"] for lv in levels] == [1, 3]
        for lv in levels:
            assert 0 < lv["ttfb_ms_p50"] <= lv["ttfb_ms_p95"]
            assert 0 <= lv["real_time_streams"] <= lv["concurrency"] and lv["audio_s_per_wall_s"] > 0
            assert lv["codec_ms_per_frame"] > 0
            if mode == "window":  # windows of context: more frames decoded than emitted
                assert lv["decoded_per_emitted"] >= 1.5
    assert "TTFB p95 ms" in run.stdout and "dec/emit" in run.stdout
    return run, runs


def test_service_mode_reports_ttfb_real_time_streams_and_codec_cost(bench, tmp_path):
    run, runs = service(bench, tmp_path, "deadline", "window")
    assert set(runs) == {("deadline", "window")} and "deadline" in run.stdout


@pytest.mark.slow
def test_service_mode_reports_ttfb_real_time_streams_and_codec_cost_per_policy_and_codec_mode(bench, tmp_path):
    run, runs = service(bench, tmp_path, "fair,deadline", "stream,window")
    assert set(runs) == {("fair", "stream"), ("fair", "window"), ("deadline", "stream"), ("deadline", "window")}
    assert "deadline" in run.stdout


def check_codec_rows(rows: list[dict], batches: tuple[int, ...]) -> None:
    assert {(r["mode"], r["runtime"], r["batch"]) for r in rows} == {
        (m, rt, b) for m, rt in (("stream", "torch"), ("stream", "onnxruntime"), ("window", "torch")) for b in batches}
    for r in rows:
        assert r["ms_per_frame"] > 0
        if r["mode"] == "stream":
            assert r["decoded_per_emitted"] == 1.0 and r["max_error_vs_torch"] <= 1e-5  # each frame once, exact
        else:
            assert 5.0 < r["decoded_per_emitted"] <= 7.0  # 1-frame chunks inside windows of up to 3 + 1 + 3


def test_codec_mode_measures_each_runtime_against_torch(tmp_path):
    """The script as a user runs it (the one process of benchmark.py in the suite): exit 0, the table,
    the JSON. On the tests' narrow SNAC, whose graphs the tests' servers export anyway (the slow run
    below measures the demo's full width)."""
    out_file = tmp_path / "codec.json"
    run = subprocess.run(
        [sys.executable, "benchmark.py", "--mode", "codec", "--batches", "1", "--chunk", "1",
         "--runtimes", "torch,onnxruntime", "--set", f"codec.path={narrow_codec()}", "--output", str(out_file)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    check_codec_rows(json.loads(out_file.read_text())["rows"], (1,))
    assert "ms / emitted frame" in run.stdout


@pytest.mark.slow
def test_codec_mode_measures_each_runtime_against_torch_at_each_batch_size(bench, tmp_path):
    out_file = tmp_path / "codec.json"
    run = bench("--mode", "codec", "--batches", "1,2", "--chunk", "1", "--runtimes", "torch,onnxruntime",
                "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    check_codec_rows(json.loads(out_file.read_text())["rows"], (1, 2))
    assert "ms / emitted frame" in run.stdout


def test_watermark_mode_reports_detection_false_positives_and_cost(bench, tmp_path):
    out_file = tmp_path / "watermark.json"
    run = bench("--mode", "watermark", "--requests", "2", "--set", f"data_dir={tmp_path}",
                "--set", "sampling.max_tokens=210", "--set", "sampling.min_tokens=210", "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    for path in ("wav", "mp3_128k", "mulaw_8k"):
        assert result["outputs_marked"][path] | {"detected": 2, "of": 2} == result["outputs_marked"][path]
    assert result["mark_ms_per_audio_s"] > 0 and 0 < result["mark_cost_vs_codec"] < 1
    if shutil.which("espeak-ng"):  # real speech: marked is found, unmarked is not
        assert result["speech_marked"]["wav"]["detected"] == 2 and result["speech_unmarked"]["wav"]["detected"] == 0
    else:
        assert "espeak-ng is not installed" in run.stdout
    assert "marking costs" in run.stdout and "mu-law 8k" in run.stdout


def test_engine_mode_runs_qwen3_tts_beside_its_reference_implementation(bench, tmp_path):
    out_file = tmp_path / "qwen.json"
    run = bench("--mode", "engine", "--family", "qwen3-tts", "--concurrency", "1,2", "--max-tokens", "6",
                "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    assert result["frames"] == 6 and [lv["streams"] for lv in result["levels"]] == [1, 2]
    for lv in result["levels"]:
        assert lv["audio_s_per_wall_s"] > 0 and 0 < lv["first_audio_ms_p50"] <= lv["first_audio_ms_max"]
        assert 0 < lv["cp_share"] < 1 and lv["cp_s_per_step"] > 0
        peer = lv["peer"]  # QwenLM's qwen_tts on the same checkpoint and texts
        assert peer["audio_s_per_wall_s"] > 0 and len(peer["frames"]) == lv["streams"]
        assert all(1 <= f <= 6 for f in peer["frames"])
    assert result["cp_batching"] > 0
    assert "peer first audio ms" in run.stdout and "(goal <= 3)" in run.stdout


@pytest.mark.slow
def test_service_mode_runs_the_qwen3_tts_family(bench, tmp_path):
    out_file = tmp_path / "service.json"
    run = bench("--mode", "service", "--family", "qwen3-tts", "--concurrency", "2", "--max-tokens", "5",
                "--policies", "fair", "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    (level,) = json.loads(out_file.read_text())["runs"][0]["levels"]
    assert level["concurrency"] == 2 and level["ttfb_ms_p50"] > 0 and level["audio_s_per_wall_s"] > 0
    assert level["decoded_per_emitted"] == 1.0  # the 12 Hz decoder: each frame decoded once


def qwen_codec_rows(runtimes: list[str]) -> list[dict]:
    from lyre.benchmarks import qwen_codec
    from lyre.codec.qwen12hz import DecoderConfig
    from tests.support.qwen_reference import tiny_decoder_config

    result = qwen_codec.run([1, 2], 1, runtimes, progress=lambda _: None,
                            decoder_config=DecoderConfig.from_dict(tiny_decoder_config()))
    assert "12 Hz decoder" in qwen_codec.table(result)
    return result["rows"]


def test_qwen_codec_mode_measures_the_12hz_streaming_decoder_at_each_batch_size():
    rows = qwen_codec_rows(["torch"])
    assert [(r["what"], r["batch"]) for r in rows] == [("stream", 1), ("stream", 2)]
    assert all(r["ms_per_frame"] > 0 for r in rows)


@pytest.mark.slow
def test_qwen_codec_mode_sets_onnxruntime_against_torch_on_the_same_decode():
    rows = qwen_codec_rows(["torch", "onnxruntime"])
    ort = [r for r in rows if r["runtime"] == "onnxruntime"]
    assert [r["batch"] for r in ort] == [1, 2]
    assert all(r["speedup_vs_torch"] > 0 and r["max_error_vs_torch"] < 1e-4 for r in ort)


def test_text_mode_reports_the_normalisers_cost():
    from lyre.benchmarks import text
    from lyre.config import load_config

    result = text.run(load_config(None, {}), 1, progress=lambda _: None, spoken=0)
    n = result["normalise_ms"]
    assert 0 < n["p50"] <= n["p99"] <= n["max"] and result["sentences"] >= 200 and "normalising a sentence" in \
        text.table(result)


@pytest.mark.slow
def test_text_mode_reports_first_audio_with_normalisation_on_and_off():
    from lyre.benchmarks import text
    from lyre.config import load_config

    result = text.run(load_config(None, {}), 1, progress=lambda _: None, spoken=2)
    t = result["ttfb_ms"]
    assert t["on"]["n"] == t["off"]["n"] == 2 and t["on"]["p50"] > 0 and t["off"]["p50"] > 0
    assert 0 < result["share_of_ttfb_p50"] < 1 and "share of first audio" in text.table(result)


def test_batch_fill_refuses_bad_levels(bench):
    for args in (["--live-levels", "0.3,1.5"], ["--live-levels", "x"], ["--backlog", "0"], ["--seconds", "0"]):
        bad = bench("--mode", "batch-fill", *args)
        assert bad.returncode == 2 and "--live-levels takes shares in (0, 1)" in bad.stderr


@pytest.mark.slow
def test_batch_fill_measures_the_capacity_and_each_live_level_with_and_without_a_backlog(bench, tmp_path):
    out_file = tmp_path / "fill.json"
    run = bench("--mode", "batch-fill", "--live-levels", "0.5", "--backlog", "40", "--seconds", "4",
                "--set", f"codec.path={narrow_codec()}", "--set", "codec.noise=false", "--output", str(out_file))
    assert run.returncode == 0, run.stderr
    result = json.loads(out_file.read_text())
    assert result["capacity_audio_per_s"] > 0
    [level] = result["levels"]
    assert level["users"] >= 1 and level["without"]["ok"] >= 1 and level["with"]["ok"] >= 1
    assert level["with"]["batch_audio_per_s"] > 0 and level["without"]["batch_audio_per_s"] < 0.05
    assert "batch share of unused" in run.stdout
