"""Real Lyre servers (``python -m lyre serve`` processes) on free ports with the demo checkpoint, and
what tests ask them."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lyre.benchmarks.servers import ManagedServer, free_port  # noqa: F401  (free_port is used by tests)
from tests.support.paths import REPO_ROOT

MAX_TOKENS = 28  # 4 frames = 8192 samples = 0.341 s per request by default


SECONDS = 4 * 2048 / 24000


@dataclass
class Server:
    proc: subprocess.Popen
    http: str
    grpc: str
    log_path: str
    data_dir: str

    def log(self) -> str:
        return open(self.log_path).read()

    def get(self, path: str, headers: dict | None = None) -> tuple[int, dict | str]:
        req = urllib.request.Request(self.http + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            body, status = e.read().decode(), e.code
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def stats(self) -> dict:
        return self.get("/v1/stats")[1]

    def eventually_idle(self, timeout: float = 30.0) -> dict:
        """Wait (by asking, not sleeping) until no session holds a KV slot; returns the stats."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s["kv_cache"]["used_slots"] == 0 and s["scheduler"]["active_sessions"] == 0 \
                    and s["scheduler"]["pending_sessions"] == 0:
                return s
            assert time.monotonic() < deadline, f"slots still in use: {s}"


def start_server(*overrides: str) -> Server:
    """A production_server.py on free ports (the benchmark's launcher), with the test settings."""
    data_dir = tempfile.mkdtemp(prefix="lyre-data-")  # its own voices database and audit trail
    managed = ManagedServer(None, (
        f"model.demo_dir={REPO_ROOT / 'models' / 'demo'}", f"sampling.max_tokens={MAX_TOKENS}",
        f"sampling.min_tokens={MAX_TOKENS}", "codec.noise=false", "scheduler.max_concurrent_sessions=8",
        "scheduler.max_batch_size=8", "kv_cache.max_seq_len=1024", f"data_dir={data_dir}", *overrides)).__enter__()
    return Server(managed.proc, managed.http, managed.grpc, managed.log_path, data_dir)


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_health(srv: Server, service: str = "lyre.v1.TextToSpeech") -> int:
    """The gRPC health status of ``service`` ("" is the server's own)."""
    with grpc.insecure_channel(srv.grpc) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=10).status


class HealthWatch:
    """The gRPC health Watch stream of one ``service`` of ``srv``: the server tells of each change of
    its status (readiness, which /ready answers, turns it: full, room, audit trail, drain).
    :meth:`until` waits for the next change to ``status``. (One stream for a whole test: grpcio's
    health servicer forgets the other watchers of a service when one of its streams ends.)"""

    def __init__(self, srv: Server, service: str = "lyre.v1.TextToSpeech", timeout: float = 180.0):
        self.service = service or "the server"
        self.channel = grpc.insecure_channel(srv.grpc)
        self.changes = health_pb2_grpc.HealthStub(self.channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout)

    def until(self, status: int) -> None:
        try:
            for reply in self.changes:
                if reply.status == status:
                    return
        except grpc.RpcError as e:
            raise AssertionError(f"{self.service} never {status}: {e.code()}") from None
        raise AssertionError(f"the health watch of {self.service} ended before {status}")

    def __enter__(self) -> HealthWatch:
        return self

    def __exit__(self, *exc) -> None:
        self.channel.close()


def stop_server(server: Server) -> int:
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=60)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def same_speech(a: bytes, b: bytes) -> bool:
    """Two s16le PCM renderings of the same tokens. The codec's float arithmetic differs a little
    with how its frames were batched, which depends on timing (tens of units near the first chunk
    on a loaded machine), so: equal length and nearly the same waveform. Different tokens (another
    voice or seed) are uncorrelated."""
    x, y = (np.frombuffer(pcm, dtype=np.int16).astype(float) for pcm in (a, b))
    return len(x) == len(y) and float(np.corrcoef(x, y)[0, 1]) > 0.99
