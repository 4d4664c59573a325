"""Servers the benchmark starts itself (``python -m lyre serve`` subprocesses, in the current working
directory) and stops by their pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ManagedServer:
    """``with ManagedServer(config, overrides) as srv:`` -> srv.http, srv.grpc."""

    config: Path | None
    overrides: tuple[str, ...] = ()
    baseline: str | None = None
    http: str = ""
    grpc: str = ""
    pid: int = 0

    @property
    def proc(self) -> subprocess.Popen:
        return self._proc

    @property
    def log_path(self) -> str:
        return self._log.name

    def __enter__(self) -> ManagedServer:
        grpc_port = free_port()
        args = [sys.executable, "-m", "lyre", "serve", "--host", "127.0.0.1", "--port", "0",
                "--grpc-port", str(grpc_port)]
        if self.config is not None:
            args += ["--config", str(self.config)]
        for o in self.overrides:
            args += ["--set", o]
        if self.baseline:
            args += ["--baseline", self.baseline]
        self._log = tempfile.NamedTemporaryFile("w+", prefix="lyre-bench-server-", suffix=".log", delete=False)
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.pid = self._proc.pid
        line = self._proc.stdout.readline()  # the server prints its ready line once it listens
        if "Lyre ready" not in line:
            self._proc.kill()
            raise RuntimeError(f"the benchmark's server did not start:\n{Path(self._log.name).read_text()[-2000:]}")
        self.http = line.split()[2]
        self.grpc = f"127.0.0.1:{grpc_port}"
        return self

    def __exit__(self, *exc) -> None:
        if self._proc.poll() is not None:  # stopped already (the soak's drain sends its own SIGTERM)
            return
        os.kill(self.pid, signal.SIGTERM)  # our own process, by its id
        try:
            self._proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
