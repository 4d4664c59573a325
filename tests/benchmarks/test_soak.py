"""``benchmark.py --mode soak``: the reliability suite. Its figures are asserted where they are counts,
reported where they are times. The run CI's figure comes from (300 requests; the README's uses
10 000) is slow (``pytest -m slow``); a small run of every phase stays in the default run."""

from __future__ import annotations

import json

import pytest

from lyre.benchmarks.fuzz import GRPC_CORPUS, REST_CORPUS, STREAM_CORPUS, WS_CORPUS
from tests.support.narrow_codec import narrow_codec

NOTHING_LEFT = {"kv_slots_used": 0, "active_sessions": 0, "pending_sessions": 0, "codec_states": 0}
SERVER = ["--set", f"codec.path={narrow_codec()}", "--set", "codec.noise=false", "--set", "scheduler.max_concurrent_sessions=8",
          "--set", "scheduler.max_batch_size=8", "--set", "scheduler.max_pending=8"]


def left(phase: dict) -> dict:
    return {k: phase["after"][k] for k in NOTHING_LEFT}


def check_every_phase(r: dict, requests: int, burst: int) -> None:
    """What holds on any machine, whatever its speed."""
    soak, overload, drain, fuzz = r["soak"], r["overload"], r["drain"], r["fuzz"]
    assert soak["requests"] == requests and soak["unexpected"] == 0, soak["unexpected_examples"]
    assert soak["complete_with_all_audio"] == soak["asked_complete"] > 0
    assert left(soak) == NOTHING_LEFT
    assert overload["burst"] == burst and overload["refused"] > 0 and overload["probes_refused"] > 0
    assert overload["refused_clearly"] == overload["refusals"]  # every refusal is 429+Retry-After / RESOURCE_EXHAUSTED
    assert overload["admitted_complete"] == overload["admitted"], overload["admitted_incomplete_examples"]
    assert left(overload) == NOTHING_LEFT
    # every stream in flight at SIGTERM ends complete, or cancelled with a clear message at the timeout
    assert drain["lost"] == 0, drain["lost_examples"]
    assert drain["exit_code"] == 0
    assert fuzz["violations"] == [] and fuzz["health"] == 200 and left(fuzz) == NOTHING_LEFT
    # the fixed corpus of issue 25's inputs went first, on every surface (the streams' later messages too)
    assert fuzz["corpus"] == len(REST_CORPUS) + len(WS_CORPUS) + len(GRPC_CORPUS) + len(STREAM_CORPUS)
    assert fuzz["grpc_streams"] == len(STREAM_CORPUS) and fuzz["rest"] > len(REST_CORPUS)
    assert r["log_errors"] == [] and drain["log_errors"] == []


@pytest.mark.slow  # (a benchmark run, ~20 s: the answers it checks are tests/text/test_hostile_served.py's and test_fuzz.py's)
def test_a_small_soak_runs_every_phase_and_leaves_nothing_behind(bench, tmp_path, demo_dir):
    """The mode end to end at a small size (the codec's ~60 ms per frame on CPU is most of its cost):
    12 one-frame requests, a burst of 2x a capacity of 4, 5 fuzz examples per surface, a drain of 2."""
    out = tmp_path / "soak.json"
    run = bench("--mode", "soak", "--requests", "12", "--concurrent", "2", "--max-tokens", "7",
                "--overload-factor", "2", "--fuzz-examples", "5", "--drain-timeout", "1",
                "--set", f"model.demo_dir={demo_dir}", "--set", "codec.noise=false", "--set", f"codec.path={narrow_codec()}",
                "--set", "scheduler.max_concurrent_sessions=2", "--set", "scheduler.max_batch_size=2",
                "--set", "scheduler.max_pending=2", "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    check_every_phase(r, requests=12, burst=2 * 4)
    assert r["soak"]["by_protocol"] == {"rest": 4, "ws": 4, "grpc": 4} and r["drain"]["streams"] == 2
    assert r["overload"]["probes"] == 200  # 100 REST + 100 gRPC, each on a connection opened before timing
    assert "soak      12 requests" in run.stdout and "rejection p50" in run.stdout and "0 lost" in run.stdout


@pytest.mark.slow
def test_soak_overload_drain_and_fuzz_leave_nothing_behind(bench, tmp_path, demo_dir):
    out = tmp_path / "soak.json"
    # drain_timeout_s 10, a bound with room on both sides: the short drain streams (28 tokens) end
    # within ~1.5 s of the signal here on a quiet machine and within ~6.5 s with every core busy
    # (first chunks are decoded a few per round); the long ones (3000 tokens) would take minutes (the
    # codec's ~60 ms a frame on CPU: ~15 tokens/s each at concurrency 8).
    run = bench("--mode", "soak", "--requests", "300", "--concurrent", "8", "--fuzz-examples", "100",
                "--drain-timeout", "10", "--set", f"model.demo_dir={demo_dir}", *SERVER, "--output", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    r = json.loads(out.read_text())
    check_every_phase(r, requests=300, burst=160)
    soak, drain = r["soak"], r["drain"]
    assert soak["disconnected"] > 50 and soak["asked_complete"] > 100  # ~30% went away at a random moment
    # The drain let streams in flight finish (ended after the signal, all audio) and cut the rest at the
    # timeout with a message; which stream was which is the machine's speed (see soak._drain).
    finished = [o for o in drain["outcomes"] if o["result"] == "complete" and o["ended_after_s"] > 0]
    assert finished and drain["completed_with_all_audio"] + drain["short_cut_at_timeout"] == drain["finishing_in_time"]
    assert drain["cancelled_with_a_message"] > 0
    assert drain["cancelled_with_a_message"] + drain["long_completed"] == drain["too_long"]
    assert "soak      300 requests" in run.stdout and "rejection p50" in run.stdout
