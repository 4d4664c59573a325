"""Readiness means "send me new callers": /ready and the gRPC health of the synthesis services turn
NOT ready while admission is full and while draining, and ready again when there is room; /health
(liveness) stays 200 throughout; lyre_capacity_utilisation follows the load."""

from __future__ import annotations

import signal

import requests

from tests.support.servers import NOT_SERVING, SERVING, HealthWatch, grpc_health, start_server, stop_server

RIVA = "nvidia.riva.tts.RivaSpeechSynthesis"  # (its status is set after lyre.v1.TextToSpeech's)


def utilisation(srv) -> float:
    text = requests.get(srv.http + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("lyre_capacity_utilisation ")).split()[-1])


def hold(srv, text: str):
    """A long stream, its first bytes read (the iterator is kept: a dropped iterator closes the
    connection, which cancels)."""
    held = requests.post(srv.http + "/v1/audio/speech", stream=True, timeout=60,
                         json={"input": text, "response_format": "pcm", "max_tokens": 3000, "min_tokens": 3000})
    chunks = held.iter_content(256)
    assert held.status_code == 200 and next(chunks)
    return held, chunks


def test_full_admission_turns_readiness_off_and_room_turns_it_back_on():
    srv = start_server("scheduler.max_concurrent_sessions=1", "scheduler.max_batch_size=1", "scheduler.max_pending=0",
                       "scheduler.reserved_slots=0", "server.drain_timeout_s=60", "kv_cache.max_seq_len=4096")
    try:
        with HealthWatch(srv, RIVA) as synthesis, HealthWatch(srv, "") as alive:
            ready = requests.get(srv.http + "/ready", timeout=10)
            assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["capacity"] == 1
            assert grpc_health(srv) == SERVING and grpc_health(srv, "") == SERVING
            held, chunks = hold(srv, "Hold the only slot.")
            full = requests.get(srv.http + "/ready", timeout=10)
            assert full.status_code == 503 and full.json()["reason"] == "full"
            synthesis.until(NOT_SERVING)  # the gRPC status follows admission within a poll period
            assert grpc_health(srv) == NOT_SERVING and grpc_health(srv, RIVA) == NOT_SERVING
            assert grpc_health(srv, "") == SERVING  # the server's own status is liveness: it is alive
            assert requests.get(srv.http + "/health", timeout=10).status_code == 200  # alive all along
            assert utilisation(srv) == 1.0  # (published at the step that admitted it, before any audio)
            refused = requests.post(srv.http + "/v1/audio/speech", json={"input": "no room"}, timeout=30)
            assert refused.status_code == 429  # what the balancer avoids by reading /ready
            held.close()  # the slot frees
            synthesis.until(SERVING)
            assert requests.get(srv.http + "/ready", timeout=10).status_code == 200  # ready again
            assert grpc_health(srv) == SERVING

            held, chunks = hold(srv, "Drain me.")
            srv.proc.send_signal(signal.SIGTERM)
            alive.until(NOT_SERVING)  # the drain began
            draining = requests.get(srv.http + "/ready", timeout=10)
            assert draining.status_code == 503 and draining.json()["ready"] is False
            assert draining.json()["reason"] == "draining"
            health = requests.get(srv.http + "/health", timeout=10)
            assert health.status_code == 200 and health.json()["status"] == "draining"
            assert grpc_health(srv) == NOT_SERVING and grpc_health(srv, "") == NOT_SERVING
            held.close()
        assert srv.proc.wait(timeout=60) == 0
    finally:
        if srv.proc.poll() is None:
            stop_server(srv)
