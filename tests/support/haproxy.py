"""A real HAProxy in front of Lyre replicas, for the tests (Debian's ``haproxy``, which
``./setup.sh --with-test-services`` installs when missing). The configuration is the one
``deploy/compose/haproxy.cfg`` ships, with the test's sockets put in (see :func:`config`).

Nothing here polls: the listening sockets are bound before HAProxy starts (it inherits them, so a
client may connect at once), and HAProxy's log says when a health check turns a replica UP or
DOWN (:meth:`Balancer.wait_status` waits for that line).

A test of the edge's limits runs the file with smaller numbers: ``replace`` swaps a directive's
text (which must be there, so that the test fails when the directive is gone) and ``env`` sets the
``LYRE_EDGE_*`` limits the file's ``presetenv`` lines give defaults for."""

from __future__ import annotations

import os
import re
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import REPO_ROOT

TEMPLATE = REPO_ROOT / "deploy" / "compose" / "haproxy.cfg"
BACKENDS = ("lyre_http", "lyre_grpc")
CHANGE = re.compile(r"Server (\S+)/(\S+) is (UP|DOWN)\b")  # e.g. "Server lyre_http/lyre1 is DOWN, reason: ..."


def binary() -> str:
    """The haproxy executable (Debian puts it in /usr/sbin, which a user's PATH may lack)."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise RuntimeError("HAProxy is not installed (./setup.sh --with-test-services installs Debian's haproxy)")
    return found


def config(http_fd: int, grpc_fd: int, stats_fd: int, replicas: list[tuple[str, int, int]],
           maxconn: list[int], replace: dict[str, str] | None = None) -> str:
    """``deploy/compose/haproxy.cfg`` listening on inherited sockets, its server lines for
    ``replicas`` ((name, http port, grpc port) on 127.0.0.1) instead of the compose service names (no
    DNS), each replica's ``maxconn`` its admission limit; each ``replace`` key (a text the file must
    hold) replaced by its value."""
    text = TEMPLATE.read_text()
    for old, new in (replace or {}).items():
        assert old in text, f"deploy/compose/haproxy.cfg has no {old!r}"
        text = text.replace(old, new)
    text = text.replace(" resolvers docker init-addr last,libc,none", "")
    text = text.replace("bind :8000", f"bind fd@{http_fd}").replace(
        "bind :50051", f"bind fd@{grpc_fd}").replace("bind :8404", f"bind fd@{stats_fd}")
    http = "".join(f"    server {n} 127.0.0.1:{h} check maxconn {m}\n" for (n, h, _), m in zip(replicas, maxconn, strict=True)) + \
        "".join(f"    server {n}-any 127.0.0.1:{h} backup\n" for n, h, _ in replicas)
    grpc = "".join(f"    server {n} 127.0.0.1:{g} proto h2 check port {h} check-proto h1 maxconn {m}\n"
                   for (n, h, g), m in zip(replicas, maxconn, strict=True)) + \
        "".join(f"    server {n}-any 127.0.0.1:{g} proto h2 backup\n" for n, _, g in replicas)
    for backend, lines in (("http", http), ("grpc", grpc)):
        start, end = f"    # replicas ({backend}) begin\n", f"    # replicas ({backend}) end\n"
        text = text[: text.index(start) + len(start)] + lines + text[text.index(end):]
    return text


@dataclass
class Balancer:
    proc: subprocess.Popen
    http: str
    grpc: str
    folder: Path
    log: list[str] = field(default_factory=list)
    states: dict[tuple[str, str], str] = field(default_factory=dict)  # (backend, server) -> UP / DOWN
    changed: threading.Condition = field(default_factory=threading.Condition)
    ended: bool = False

    @property
    def ports(self) -> tuple[int, int]:
        """(HTTP port, gRPC port) on 127.0.0.1."""
        return int(self.http.rsplit(":", 1)[1]), int(self.grpc.rsplit(":", 1)[1])

    def command(self, line: str) -> str:
        """HAProxy's answer to one command on its admin socket (e.g. ``show table edge_per_key``)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(str(self.folder / "admin.sock"))
            s.sendall(line.encode() + b"\n")
            answer = b""
            while chunk := s.recv(65536):  # (it closes after one command)
                answer += chunk
        return answer.decode()

    def wait_ended(self, timeout: float = 60.0) -> int:
        """Wait until HAProxy exits (its output read to the end); its exit status."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.ended, timeout), \
                f"HAProxy still running: {''.join(self.log[-20:])}"
        return self.proc.wait(timeout)

    def follow(self) -> None:
        """(Its own thread.) Read HAProxy's output; keep each server's last announced state."""
        for line in self.proc.stdout:
            with self.changed:
                self.log.append(line)
                if m := CHANGE.search(line):
                    self.states[(m[1], m[2])] = m[3]
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait_status(self, server: str, status: str, timeout: float = 30.0) -> None:
        """Wait until HAProxy announces ``server`` ``status`` (UP or DOWN) in both backends. (Servers
        start UP: HAProxy announces changes only.)"""
        def reached() -> bool:
            return self.ended or all(self.states.get((b, server), "UP") == status for b in BACKENDS)

        with self.changed:
            assert self.changed.wait_for(reached, timeout) and not self.ended, \
                f"{server} never {status}: {self.states}\n{''.join(self.log[-20:])}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


def start(replicas: list[tuple[str, int, int]], maxconn: list[int], replace: dict[str, str] | None = None,
          env: dict[str, str] | None = None, nofile: int | None = None) -> Balancer:
    """HAProxy in front of ``replicas``, ``maxconn[i]`` the admission limit of the i-th; ``replace``
    edits the file (:func:`config`), ``env`` sets ``LYRE_EDGE_*`` limits (the file's defaults
    otherwise, whatever this process's environment says), ``nofile`` its open-files limit (soft and
    hard). Its admin socket answers :meth:`Balancer.command`."""
    http, grpc, stats = (listening() for _ in range(3))
    fds = tuple(s.fileno() for s in (http, grpc, stats))
    path = Path(tempfile.mkdtemp(prefix="lyre-haproxy-")) / "haproxy.cfg"
    text = config(*fds, replicas, maxconn, replace)
    path.write_text(text.replace("\nglobal\n", f"\nglobal\n    stats socket {path.parent / 'admin.sock'} level admin\n", 1))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LYRE_EDGE_")} | (env or {})

    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    try:
        check = subprocess.run([binary(), "-c", "-f", str(path)], capture_output=True, text=True, pass_fds=fds,
                               env=environment)
        assert check.returncode == 0, check.stdout + check.stderr
        proc = subprocess.Popen([binary(), "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, pass_fds=fds, env=environment,
                                preexec_fn=None if nofile is None else limit_descriptors)
        balancer = Balancer(proc, f"http://127.0.0.1:{http.getsockname()[1]}",
                            f"127.0.0.1:{grpc.getsockname()[1]}", path.parent)
    finally:
        for s in (http, grpc, stats):  # (HAProxy holds its own copies)
            s.close()
    threading.Thread(target=balancer.follow, name="haproxy-log", daemon=True).start()
    return balancer
