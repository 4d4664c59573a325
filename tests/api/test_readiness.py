"""Readiness means "send me new callers": /ready and the gRPC health of the synthesis services turn
NOT ready while admission is full and while draining, and ready again when there is room; /health
(liveness) stays 200 throughout; lyre_capacity_utilisation follows the load."""

from __future__ import annotations

import signal
import time

import grpc
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .conftest import start_server, stop_server

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_health(srv, service: str = "lyre.v1.TextToSpeech") -> int:
    with grpc.insecure_channel(srv.grpc) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service)).status


def until(check, what: str, timeout: float = 30.0):
    """Ask until ``check()`` is truthy (the gRPC status follows admission within a poll period)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)  # (paces the asking: the server it waits on shares the CPU)
    return value


def utilisation(srv) -> float:
    text = requests.get(srv.http + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("lyre_capacity_utilisation ")).split()[-1])


def test_full_admission_turns_readiness_off_and_room_turns_it_back_on():
    srv = start_server("scheduler.max_concurrent_sessions=1", "scheduler.max_batch_size=1", "scheduler.max_pending=0",
                       "scheduler.reserved_slots=0", "server.drain_timeout_s=60", "kv_cache.max_seq_len=4096")
    try:
        ready = requests.get(srv.http + "/ready", timeout=10)
        assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["capacity"] == 1
        assert grpc_health(srv) == SERVING and grpc_health(srv, "") == SERVING
        held = requests.post(srv.http + "/v1/audio/speech", stream=True, timeout=60,
                             json={"input": "Hold the only slot.", "response_format": "pcm", "max_tokens": 3000,
                                   "min_tokens": 3000})
        chunks = held.iter_content(256)  # (kept: a dropped iterator closes the connection, which cancels)
        assert held.status_code == 200 and next(chunks)
        full = requests.get(srv.http + "/ready", timeout=10)
        assert full.status_code == 503 and full.json()["reason"] == "full"
        until(lambda: grpc_health(srv) == NOT_SERVING, "NOT_SERVING while full")
        assert grpc_health(srv, "nvidia.riva.tts.RivaSpeechSynthesis") == NOT_SERVING
        assert grpc_health(srv, "") == SERVING  # the server's own status is liveness: it is alive
        assert requests.get(srv.http + "/health", timeout=10).status_code == 200  # alive all along
        until(lambda: utilisation(srv) == 1.0, "utilisation 1.0")
        refused = requests.post(srv.http + "/v1/audio/speech", json={"input": "no room"}, timeout=30)
        assert refused.status_code == 429  # what the balancer avoids by reading /ready
        held.close()  # the slot frees
        until(lambda: requests.get(srv.http + "/ready", timeout=10).status_code == 200, "ready again")
        until(lambda: grpc_health(srv) == SERVING, "SERVING again")

        held = requests.post(srv.http + "/v1/audio/speech", stream=True, timeout=60,
                             json={"input": "Drain me.", "response_format": "pcm", "max_tokens": 3000,
                                   "min_tokens": 3000})
        chunks = held.iter_content(256)
        assert held.status_code == 200 and next(chunks)
        srv.proc.send_signal(signal.SIGTERM)
        until(lambda: requests.get(srv.http + "/ready", timeout=10).json()["reason"] == "draining", "draining")
        draining = requests.get(srv.http + "/ready", timeout=10)
        assert draining.status_code == 503 and draining.json()["ready"] is False
        health = requests.get(srv.http + "/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "draining"
        assert grpc_health(srv) == NOT_SERVING and grpc_health(srv, "") == NOT_SERVING
        held.close()
        assert srv.proc.wait(timeout=60) == 0
    finally:
        if srv.proc.poll() is None:
            stop_server(srv)
