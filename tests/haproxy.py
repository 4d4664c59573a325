"""A real HAProxy in front of Lyre replicas, for the tests (Debian's ``haproxy``, which
``./setup.sh --with-test-services`` installs when missing). The configuration is the one
``deploy/compose/haproxy.cfg`` ships, with the test's ports put in (see :func:`config`)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .conftest import REPO_ROOT
from .postgres import free_port

TEMPLATE = REPO_ROOT / "deploy" / "compose" / "haproxy.cfg"


def config(http_port: int, grpc_port: int, stats_port: int, replicas: list[tuple[str, int, int]],
           maxconn: int = 96) -> str:
    """``deploy/compose/haproxy.cfg`` bound to loopback ports, its server lines for ``replicas``
    ((name, http port, grpc port) on 127.0.0.1) instead of the compose service names (no DNS), each
    replica's ``maxconn`` its admission limit."""
    text = TEMPLATE.read_text().replace(" resolvers docker init-addr last,libc,none", "")
    text = text.replace(" maxconn 96", f" maxconn {maxconn}")
    text = text.replace("bind :8000", f"bind 127.0.0.1:{http_port}").replace(
        "bind :50051", f"bind 127.0.0.1:{grpc_port}").replace("bind :8404", f"bind 127.0.0.1:{stats_port}")
    http = "".join(f"    server {n} 127.0.0.1:{h} check\n" for n, h, _ in replicas) + "".join(
        f"    server {n}-any 127.0.0.1:{h} backup\n" for n, h, _ in replicas)
    grpc = "".join(f"    server {n} 127.0.0.1:{g} proto h2 check port {h} check-proto h1\n" for n, h, g in replicas) + \
        "".join(f"    server {n}-any 127.0.0.1:{g} proto h2 backup\n" for n, _, g in replicas)
    start, end = "    # replicas (http) begin\n", "    # replicas (http) end\n"
    text = text[: text.index(start) + len(start)] + http + text[text.index(end):]
    start, end = "    # replicas (grpc) begin\n", "    # replicas (grpc) end\n"
    return text[: text.index(start) + len(start)] + grpc + text[text.index(end):]


@dataclass
class Balancer:
    proc: subprocess.Popen
    http: str
    grpc: str
    stats: str
    folder: Path

    def servers(self) -> dict[tuple[str, str], dict[str, str]]:
        """HAProxy's own view, from its stats CSV: (backend, server) -> row (status, scur, stot, ...)."""
        with urllib.request.urlopen(self.stats + "/stats;csv", timeout=10) as r:
            rows = csv.DictReader(io.StringIO(r.read().decode().lstrip("# ")))
            return {(row["pxname"], row["svname"]): row for row in rows if row["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_status(self, server: str, status: str, timeout: float = 30.0) -> None:
        """Ask HAProxy until both of ``server``'s backends report ``status`` (UP or DOWN)."""
        deadline = time.monotonic() + timeout
        while True:
            states = {b: row["status"] for (b, s), row in self.servers().items() if s == server}  # (checked lines)
            if states and all(v.startswith(status) for v in states.values()):
                return
            assert time.monotonic() < deadline, f"{server} never {status}: {states}"
            time.sleep(0.02)  # (paces the polling: the replicas it waits on share the CPU)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(replicas: list[tuple[str, int, int]], maxconn: int = 96) -> Balancer:
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if binary is None:
        raise RuntimeError("HAProxy is not installed (./setup.sh --with-test-services installs Debian's haproxy)")
    http, grpc, stats = free_port(), free_port(), free_port()
    path = Path(tempfile.mkdtemp(prefix="lyre-haproxy-")) / "haproxy.cfg"
    path.write_text(config(http, grpc, stats, replicas, maxconn))
    check = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen([binary, "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    balancer = Balancer(proc, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{stats}", path.parent)
    deadline = time.monotonic() + 30
    while True:  # ask until it listens and has checked every replica
        try:
            if all(row["status"].startswith("UP") for (_, s), row in balancer.servers().items() if "-any" not in s):
                return balancer
        except OSError:
            pass
        assert proc.poll() is None, "haproxy exited"
        assert time.monotonic() < deadline, "haproxy did not come up"
