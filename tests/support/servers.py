"""Real Lyre servers on free ports with the demo checkpoint and the test settings, and what tests ask
them. Two kinds, with one interface (``.http``, ``.grpc``, ``.data_dir``, ``.get()``, ``.stats()``,
``.eventually_idle()``, ``.log()``, ``.terminate()``, ``.wait()``, ``.stop()``):

- :func:`serve_in_process` — a :class:`~lyre.service.tts.TTSService` and its listeners
  (``lyre.server.listen``) on an event loop in a background thread of the test process: real sockets,
  real clients, no process start. What tests use unless the process itself is the point.
  ``terminate()`` drains as SIGTERM does (``lyre.server.drain``).
- :func:`start_server` — a ``python -m lyre serve`` process, for what only a process shows: signals
  and the exit code, SIGKILL, the ready line, replicas behind HAProxy (:func:`restart_server` starts
  a stopped one again on its ports).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import requests
import requests.adapters
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.narrow_codec import narrow_codec
from tests.support.paths import CONFIG_PATH, DEMO_DIR, REPO_ROOT
from tests.support.services import SHARED
from tests.support.waiting import until

MAX_TOKENS = 28  # 4 frames = 8192 samples = 0.341 s per request by default


SECONDS = 4 * 2048 / 24000

# A bound for a stuck server, not a measurement: generous, so that a machine with every core busy
# never reaches it.
STOP_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port nobody listens on now (for a server to take, or for a client to find refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_settings(data_dir: str) -> list[str]:
    """The settings every test server starts with (``--set`` form), before a test's own."""
    return [f"model.demo_dir={DEMO_DIR}", f"sampling.max_tokens={MAX_TOKENS}", f"sampling.min_tokens={MAX_TOKENS}",
            "codec.noise=false", "scheduler.max_concurrent_sessions=8", "scheduler.max_batch_size=8",
            "kv_cache.max_seq_len=1024", f"data_dir={data_dir}",
            f"codec.path={narrow_codec()}"]  # (the tests' narrow SNAC: tests/support/narrow_codec.py)  # its own voices database and audit trail


class Asking:
    """What tests ask a server over HTTP (``self.http`` is its base URL)."""

    http: str

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

    def connections_settled(self, headers: dict | None = None) -> None:
        """Wait until the server has seen every earlier connection of this test close (a client's
        close reaches the server a moment later): only the asking one is open."""

        def settled() -> bool:
            text = self.get("/metrics", headers)[1]
            return "lyre_connections_open 1.0" in text.splitlines()

        until(settled, what="the earlier connections to close on the server's side")

    def eventually_idle(self, timeout: float = 60.0) -> dict:
        """Wait until no session holds a KV slot or waits for one; returns the stats. (Sessions end on
        the engine thread a step after their client left: asked every few tens of milliseconds.)"""

        def idle() -> dict | None:
            s = self.stats()
            sch = s["scheduler"]
            idle = s["kv_cache"]["used_slots"] == 0 and sch["active_sessions"] == sch["pending_sessions"] == 0
            return s if idle else None

        return until(idle, timeout, "every KV slot to be free")


# --------------------------------------------------------------------------------------------
# in-process


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the server process's (lyre.server.main)


class _LogCapture(logging.Handler):
    """The server's log, formatted like the process's: every ``lyre`` logger's record, and any other
    logger's (aiohttp, grpc, asyncio) emitted on the server's event-loop thread. (Several in-process
    servers at once share the ``lyre`` loggers: a test that asserts what is *not* in a log reads it
    from a mark, at a time when the others are idle.)"""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.lines: list[str] = []
        self.loop_thread: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "lyre" or record.name.startswith("lyre.") or record.thread == self.loop_thread:
            self.lines.append(self.format(record))


class _LyreInfo:
    """Keeps the ``lyre`` loggers at INFO while any in-process server runs (the process logs INFO)."""

    lock = threading.Lock()
    users = 0
    saved = logging.NOTSET

    @classmethod
    def enter(cls) -> None:
        with cls.lock:
            lyre = logging.getLogger("lyre")
            if cls.users == 0:
                cls.saved = lyre.level
            if lyre.getEffectiveLevel() > logging.INFO:
                lyre.setLevel(logging.INFO)
            cls.users += 1

    @classmethod
    def leave(cls) -> None:
        with cls.lock:
            cls.users -= 1
            if cls.users == 0:
                logging.getLogger("lyre").setLevel(cls.saved)


def _forget_stopped_apps() -> None:
    """aiohttp caches the middleware chain of each (handler, application) pair in a module-level LRU
    of 1,024 entries: every stopped server's application, and through it its TTSService (~140 MB:
    engine, KV cache, database), would stay alive for the rest of the run. (A server process has
    one application: nothing to forget there.)"""
    from aiohttp import web_app

    cache = getattr(web_app, "_cached_build_middleware", None)
    if cache is not None:
        cache.cache_clear()


@dataclass(eq=False)
class InProcessServer(Asking):
    """A TTSService behind its real listeners, on an event loop in a thread of its own. Start it with
    :func:`serve_in_process`."""

    overrides: tuple[str, ...]
    data_dir: str
    http: str = ""
    grpc: str = ""
    service: object = None  # the TTSService, once started (for a test that must look inside)
    listeners: object = None  # its lyre.server.Listeners
    _capture: _LogCapture = field(default_factory=_LogCapture)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _done: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def start(self) -> InProcessServer:
        from lyre.config import load_config

        config = load_config(CONFIG_PATH, [*base_settings(self.data_dir), *self.overrides])  # (a bad one raises)
        started: concurrent.futures.Future = concurrent.futures.Future()
        _LyreInfo.enter()
        logging.getLogger().addHandler(self._capture)
        self._thread = threading.Thread(target=self._run, args=(config, started), name="lyre-test-server",
                                        daemon=True)
        self._thread.start()
        try:
            started.result()  # (what the service's start raised, raised here)
        except BaseException:
            self._thread.join(STOP_TIMEOUT_S)
            raise
        return self

    def _run(self, config, started: concurrent.futures.Future) -> None:
        self._capture.loop_thread = threading.get_ident()
        loop = self._loop = asyncio.new_event_loop()
        error: BaseException | None = None
        try:
            loop.run_until_complete(self._serve(config, started))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        except BaseException as e:  # noqa: BLE001 - handed to start() or wait()
            error = e
            if not started.done():
                started.set_exception(e)
        finally:
            loop.close()
            self._release()
            shutil.rmtree(self.data_dir, ignore_errors=True)
            if error is None:
                self._done.set_result(0)
            else:
                self._done.set_exception(error)

    async def _serve(self, config, started: concurrent.futures.Future) -> None:
        """What ``lyre.server.serve`` does, with an event for the signals and no ready line."""
        from lyre.server import drain, listen
        from lyre.service.tts import TTSService

        self._stop = asyncio.Event()
        service = TTSService(config, shared=SHARED)  # the loaded parts the tests' services share
        async with service:
            listeners = self.listeners = await listen(service, "127.0.0.1", 0, 0)
            self.service = service
            self.http = f"http://127.0.0.1:{listeners.http_port}"
            self.grpc = f"127.0.0.1:{listeners.grpc_port}"
            started.set_result(None)
            await self._stop.wait()
            await drain(listeners, config.server)

    def _release(self) -> None:
        logging.getLogger().removeHandler(self._capture)
        _LyreInfo.leave()
        _forget_stopped_apps()

    # what a test does to it

    def log(self, since: int = 0) -> str:
        """Its log lines so far (from :meth:`log_mark` ``since``), as the server process writes them."""
        return "".join(line + "\n" for line in self._capture.lines[since:])

    def log_mark(self) -> int:
        return len(self._capture.lines)

    @property
    def running(self) -> bool:
        return not self._done.done()

    def terminate(self) -> None:
        """What SIGTERM does: begin the drain (server.drain_notice_s, then server.drain_timeout_s) and
        stop. Returns at once; :meth:`wait` for the end."""
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # (its loop has closed: it has stopped already)
            pass

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """0 once it has drained and stopped cleanly (what it raised otherwise)."""
        return self._done.result(timeout)

    def stop(self) -> int:
        self.terminate()
        return self.wait()

    def __enter__(self) -> InProcessServer:
        return self

    def __exit__(self, *exc) -> None:
        if self.running:
            self.stop()


def serve_in_process(*overrides: str) -> InProcessServer:
    """An in-process server with the test settings and ``overrides`` (``--set`` form): real sockets on
    free ports, REST + WebSocket and gRPC, its own temporary data_dir (removed once it stops). It
    shares the loaded checkpoint parts of the tests' other services (tests.support.services.SHARED),
    so it starts in a fraction of a second. ``with serve_in_process(...) as srv:`` stops it
    (draining) at the end."""
    return InProcessServer(overrides, tempfile.mkdtemp(prefix="lyre-data-")).start()


# --------------------------------------------------------------------------------------------
# a process


@dataclass
class Server(Asking):
    """A ``python -m lyre serve`` process. Start it with :func:`start_server`."""

    proc: subprocess.Popen
    http: str
    grpc: str
    log_path: str
    data_dir: str
    overrides: tuple[str, ...] = ()

    def log(self) -> str:
        return open(self.log_path).read()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM: drain and exit."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> int:
        return stop_server(self)


def start_server(*overrides: str, http_port: int = 0, grpc_port: int | None = None,
                 data_dir: str | None = None) -> Server:
    """A ``python -m lyre serve`` process with the test settings and ``overrides``, once it has printed
    its ready line. ``http_port`` 0 = any free port; ``grpc_port`` None = a free one."""
    data_dir = data_dir or tempfile.mkdtemp(prefix="lyre-data-")
    grpc_port = grpc_port or free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="lyre-server-", suffix=".log", delete=False)  # noqa: SIM115
    sets = [arg for o in (*base_settings(data_dir), *overrides) for arg in ("--set", o)]
    proc = subprocess.Popen([sys.executable, "-m", "lyre", "serve", "--host", "127.0.0.1",
                             "--port", str(http_port), "--grpc-port", str(grpc_port), *sets],
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()  # "Lyre ready: http://127.0.0.1:PORT grpc 127.0.0.1:PORT", once it listens
    if "Lyre ready" not in line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the server did not start:\n{Path(log.name).read_text()[-3000:]}")
    return Server(proc, line.split()[2], f"127.0.0.1:{grpc_port}", log.name, data_dir, overrides)


def restart_server(server: Server) -> Server:
    """A stopped (or killed) server started again: the same settings, ports and data_dir."""
    assert not server.running
    port = int(server.http.rsplit(":", 1)[1])
    return start_server(*server.overrides, http_port=port, grpc_port=int(server.grpc.rsplit(":", 1)[1]),
                        data_dir=server.data_dir)


def stop_server(server: Server) -> int:
    """SIGTERM, then its exit code (killed if it outlives the drain by far)."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=STOP_TIMEOUT_S)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


# --------------------------------------------------------------------------------------------
# gRPC health


SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_health(srv, service: str = "lyre.v1.TextToSpeech") -> int:
    """The gRPC health status of ``service`` ("" is the server's own)."""
    with grpc.insecure_channel(srv.grpc) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                         timeout=10).status


class HealthWatch:
    """The gRPC health Watch stream of one ``service`` of ``srv``: the server tells of each change of
    its status (readiness, which /ready answers, turns it: full, room, audit trail, drain).
    :meth:`until` waits for the next change to ``status``. (One stream for a whole test: grpcio's
    health servicer forgets the other watchers of a service when one of its streams ends.)"""

    def __init__(self, srv, service: str = "lyre.v1.TextToSpeech", timeout: float = 180.0):
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


# --------------------------------------------------------------------------------------------
# streams held open by backpressure
#
# A test that needs a slot taken (admission full, a drain with work in flight) holds a stream whose
# client reads its first audio and then nothing: the server's writes stop, the audio its handler
# cannot hand over reaches scheduler.max_buffer_s and the scheduler stops generating for it. So the
# server's CPU is not burnt while the test runs, and the stream cannot end by itself, however fast
# the machine: ``max_tokens`` is several times what the buffers on the way hold (~330 tokens here).
# The client must read slowly at the socket too: loopback's 64 kB segments give a server's socket a
# send buffer of megabytes (~25 s of audio) that would fill before the server felt anything.


# What a server needs for a held stream: backpressure early (little unread audio), a client that
# reads nothing for a while not taken for a slow consumer (scheduler.consumer_timeout_s), and room
# for HELD_TOKENS in a KV slot.
HOLD_SETTINGS = ("scheduler.max_buffer_s=0.5", "scheduler.consumer_timeout_s=3600", "kv_cache.max_seq_len=4096")
HELD_TOKENS = 2000

# A slow reader's socket (REST, WebSocket): small receive buffer, small segments (set before it
# connects, so that the server's side is sized by them too)
SLOW_SOCKET_OPTIONS = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096), (socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1024)]


def slow_requests() -> requests.Session:
    """A ``requests`` session whose connections are slow readers (:data:`SLOW_SOCKET_OPTIONS`)."""

    class SlowAdapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args, **kwargs):
            super().init_poolmanager(*args, **kwargs, socket_options=SLOW_SOCKET_OPTIONS)

    session = requests.Session()
    session.mount("http://", SlowAdapter())
    return session


def slow_socket(http_url: str) -> socket.socket:
    """A connected, non-blocking slow-reader socket to the server at ``http_url``, for
    ``websockets.connect(url, sock=..., max_queue=1)`` (max_queue: it queues no messages either)."""
    host, port = http_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    for option in SLOW_SOCKET_OPTIONS:
        sock.setsockopt(*option)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


class HeldStream:
    """A REST synthesis (pcm) held open by backpressure: its slow-reader client read the first bytes
    and reads no more until :meth:`read_to_end`; :meth:`close` hangs up (the server ends the session
    and frees the slot). The server needs :data:`HOLD_SETTINGS`."""

    def __init__(self, srv, max_tokens: int = HELD_TOKENS, headers: dict | None = None):
        self.session = slow_requests()
        self.response = self.session.post(srv.http + "/v1/audio/speech", headers=headers, stream=True, timeout=60,
                                          json={"input": "A long answer, held open.", "response_format": "pcm",
                                                "max_tokens": max_tokens, "min_tokens": max_tokens})
        try:
            assert self.response.status_code == 200, self.response.text
            self.chunks = self.response.iter_content(4096)  # (kept: dropping it would close the connection)
            self.first = next(self.chunks)  # it is speaking: its slot is taken
        except BaseException:
            self.close()
            raise

    def read_to_end(self) -> int:
        """The bytes of the whole body, once read to its end (raises if it was cut off)."""
        return len(self.first) + sum(len(c) for c in self.chunks)

    def close(self) -> None:
        self.response.close()
        self.session.close()

    def __enter__(self) -> HeldStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HeldCall:
    """A gRPC SynthesizeStream held open by backpressure, where a held REST body cannot be (through
    HAProxy, whose socket to the replica has a loopback-sized send buffer): with no BDP probing the
    call's HTTP/2 flow-control window stays at 64 kB, end to end. A seed that runs to ``max_tokens``
    (gRPC has no min_tokens). The server needs :data:`HOLD_SETTINGS`.

    End it by :meth:`read_to_end`, by :meth:`close` (hanging up), or let a drain cancel it."""

    def __init__(self, target: str, max_tokens: int = HELD_TOKENS, metadata: tuple = (), timeout: float = 300.0):
        from lyre.v1 import tts_pb2, tts_pb2_grpc

        self.channel = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
        self.call = tts_pb2_grpc.TextToSpeechStub(self.channel).SynthesizeStream(
            tts_pb2.SynthesizeRequest(text="A long answer, held open.",
                                      sampling=tts_pb2.SamplingOptions(max_tokens=max_tokens, seed=1)),
            metadata=metadata, timeout=timeout)
        try:
            self.first = next(self.call)  # it is speaking: its slot is taken
        except BaseException:
            self.channel.close()
            raise

    def read_to_end(self) -> int:
        """The bytes of audio of the whole call, once read to its end (raises the call's error)."""
        return len(self.first.audio) + sum(len(c.audio) for c in self.call)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> HeldCall:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def same_speech(a: bytes, b: bytes) -> bool:
    """Two s16le PCM renderings of the same tokens. The codec's float arithmetic differs a little
    with how its frames were batched, which depends on timing (tens of units near the first chunk
    on a loaded machine), so: equal length and nearly the same waveform. Different tokens (another
    voice or seed) are uncorrelated."""
    x, y = (np.frombuffer(pcm, dtype=np.int16).astype(float) for pcm in (a, b))
    return len(x) == len(y) and float(np.corrcoef(x, y)[0, 1]) > 0.99
