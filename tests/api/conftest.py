"""A real Lyre server (production_server.py) on free ports with the demo checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass

import pytest

from ..conftest import REPO_ROOT

MAX_TOKENS = 28  # 4 frames = 8192 samples = 0.341 s per request by default
SECONDS = 4 * 2048 / 24000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    http: str
    grpc: str
    log_path: str

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


def start_server(*extra: str) -> Server:
    grpc_port = free_port()
    args = [sys.executable, "production_server.py", "--host", "127.0.0.1", "--port", "0", "--grpc-port",
            str(grpc_port), "--set", f"model.demo_dir={REPO_ROOT / 'models' / 'demo'}",
            "--set", f"sampling.max_tokens={MAX_TOKENS}", "--set", f"sampling.min_tokens={MAX_TOKENS}",
            "--set", "codec.noise=false",
            "--set", "scheduler.max_concurrent_sessions=8", "--set", "scheduler.max_batch_size=8",
            "--set", "kv_cache.max_seq_len=1024", *extra]
    log = tempfile.NamedTemporaryFile("w+", prefix="lyre-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # blocks until the server says it is ready (or dies)
    if "Lyre ready" not in line:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line}\n{open(log.name).read()[-3000:]}")
    http = line.split()[2]
    return Server(proc, http, f"127.0.0.1:{grpc_port}", log.name)


def stop_server(server: Server) -> int:
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=60)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


@pytest.fixture(scope="session")
def server(demo_dir):
    s = start_server()
    yield s
    assert stop_server(s) == 0
