"""Readiness means "send me new callers": /ready and the gRPC health of the synthesis services turn
NOT ready while admission is full and while draining, and ready again when there is room; /health
(liveness) stays 200 throughout; lyre_capacity_utilisation follows the load. (In-process: the drain
is the one SIGTERM begins, tests/server/test_drain.py sends the signal itself.)"""

from __future__ import annotations

import requests

from tests.support.servers import (
    HOLD_SETTINGS,
    NOT_SERVING,
    SERVING,
    HealthWatch,
    HeldStream,
    grpc_health,
    serve_in_process,
)

RIVA = "nvidia.riva.tts.RivaSpeechSynthesis"  # (its status is set after lyre.v1.TextToSpeech's)


def utilisation(srv) -> float:
    text = requests.get(srv.http + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("lyre_capacity_utilisation ")).split()[-1])


def test_full_admission_turns_readiness_off_and_room_turns_it_back_on():
    # one slot, no queue; HOLD_SETTINGS: a HeldStream holds it without generating (tests/support/servers.py)
    with serve_in_process("scheduler.max_concurrent_sessions=1", "scheduler.max_batch_size=1",
                          "scheduler.max_pending=0", "scheduler.reserved_slots=0", "server.drain_timeout_s=60",
                          *HOLD_SETTINGS) as srv:
        with HealthWatch(srv, RIVA) as synthesis, HealthWatch(srv, "") as alive:
            ready = requests.get(srv.http + "/ready", timeout=10)
            assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["capacity"] == 1
            assert grpc_health(srv) == SERVING and grpc_health(srv, "") == SERVING
            with HeldStream(srv):  # the only slot
                full = requests.get(srv.http + "/ready", timeout=10)
                assert full.status_code == 503 and full.json()["reason"] == "full"
                synthesis.until(NOT_SERVING)  # the gRPC status follows admission within a poll period
                assert grpc_health(srv) == NOT_SERVING and grpc_health(srv, RIVA) == NOT_SERVING
                assert grpc_health(srv, "") == SERVING  # the server's own status is liveness: it is alive
                assert requests.get(srv.http + "/health", timeout=10).status_code == 200  # alive all along
                assert utilisation(srv) == 1.0  # (published at the step that admitted it, before any audio)
                refused = requests.post(srv.http + "/v1/audio/speech", json={"input": "no room"}, timeout=30)
                assert refused.status_code == 429  # what the balancer avoids by reading /ready
            # hung up: the slot frees
            synthesis.until(SERVING)
            assert requests.get(srv.http + "/ready", timeout=10).status_code == 200  # ready again
            assert grpc_health(srv) == SERVING

            with HeldStream(srv):
                srv.terminate()  # what SIGTERM begins
                alive.until(NOT_SERVING)  # the drain began
                draining = requests.get(srv.http + "/ready", timeout=10)
                assert draining.status_code == 503 and draining.json()["ready"] is False
                assert draining.json()["reason"] == "draining"
                health = requests.get(srv.http + "/health", timeout=10)
                assert health.status_code == 200 and health.json()["status"] == "draining"
                assert grpc_health(srv) == NOT_SERVING and grpc_health(srv, "") == NOT_SERVING
        assert srv.wait() == 0  # the last stream gone, the drain is over
