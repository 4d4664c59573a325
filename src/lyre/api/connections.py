"""The REST/WebSocket port's connection layer: what aiohttp 3.x does not do itself.

aiohttp has no request-header timeout, no minimum body rate and no cap on accepted connections
(its maintainers point to a proxy), and a half-sent request line holds a connection, and a file
descriptor, for as long as the client likes. Lyre must hold without a proxy in front, so
:class:`Guarded` wraps aiohttp's per-connection protocol (everything is passed through to it)
and :class:`ConnectionGuard` decides:

- at accept, before a byte is read: past ``server.max_connections`` open connections, or past
  ``server.max_connections_per_client`` from one address, the connection is aborted at once (a
  reset: nothing read, nothing logged per connection; counted in ``lyre_connections_refused``).
  A trusted balancer's connections (``server.trusted_proxies``) are not counted per address: its
  clients are, per request, by their forwarded address;
- a request's headers must have arrived within ``server.header_timeout_s`` of its first byte (the
  first request's: of accept), i.e. aiohttp must have handed it to the application by then (a
  partial request pipelined behind a whole one is bounded by the keep-alive timeout instead);
- its body must keep coming at ``server.body_min_bytes_per_s`` on average, after
  ``header_timeout_s`` of grace (a slow but honest 10 MB upload passes; a stalled one is cut, and
  whatever place it held is freed by its handler's unwinding);
- an idle keep-alive connection is aborted by aiohttp's own ``keepalive_timeout``
  (``server.keepalive_timeout_s``);
- its kernel send buffer is fixed (:data:`SEND_BUFFER_BYTES`): a slow reader's audio waits in the
  server, where backpressure and its listener's clock count it (a kernel that grows the buffer, as
  Linux 6.18 does on loopback to 4 MB, took a whole utterance and ended its session as if it had
  been heard).

A cut connection is aborted and counted in ``lyre_connections_cut``; the log gets one line per
cause per minute (:mod:`lyre.api.log_storms`). Only the event loop's thread uses these.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("lyre.connections")

BODY_CHECK_S = 1.0  # how often a body's rate is checked
IDLE, HEADERS, REQUEST = "idle", "headers", "request"
MOST_CONNECTIONS = 16384  # server.max_connections 0 derives at most this (memory runs out before descriptors)
# connections accepted in one turn of the event loop (asyncio accepts up to the backlog at once):
# those refused keep their descriptors until the next turn, so a flood's burst must fit under the
# descriptor limit with everything else; out of descriptors, asyncio stops accepting for a second
# (everyone's /health waited 1 s)
BACKLOG = 128
# the kernel's send buffer of an accepted connection (Linux doubles it for its bookkeeping): audio a client
# has not read stays in the server's hands, where backpressure and the listener's clock see it (~1.3 s of
# 24 kHz PCM here), not in megabytes of kernel memory the kernel may grow it to per slow reader
SEND_BUFFER_BYTES = 64 * 1024
GRPC_SHARE = 4  # of the connection cap, 1/GRPC_SHARE goes to the gRPC port (grpc.max_allowed_incoming_connections)


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (logged, both); the soft limit in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as e:
            log.warning("could not raise the file descriptor limit to %d: %s", wanted, e)
    log.info("file descriptors: soft limit %s, hard limit %s", soft,
             "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft


def connection_caps(max_connections: int, descriptors: int) -> tuple[int, int]:
    """(REST/WebSocket port, gRPC port) connection caps: ``server.max_connections`` split between
    them, or (0) the descriptor limit less a reserve for everything else the process opens (the
    database, model files, logs, pipes), at most MOST_CONNECTIONS."""
    reserve = max(256, descriptors // 8) + BACKLOG  # (a refused connection's descriptor closes a loop turn later)
    total = max_connections or min(MOST_CONNECTIONS, max(64, descriptors - reserve))
    grpc = max(1, total // GRPC_SHARE)
    return max(1, total - grpc), grpc


def per_client_cap(configured: int, cap: int) -> int:
    """``server.max_connections_per_client``, at most half the port's cap ``cap``: however the two are
    set, one address cannot hold every place (0, no per-address limit, is kept as the operator's choice)."""
    return min(configured, max(1, cap // 2)) if configured else 0


class ConnectionGuard:
    def __init__(self, max_connections: int, per_client: int, header_timeout_s: float, body_min_bytes_per_s: int,
                 trusted: Callable[[str], bool], metrics: Any = None):
        self.max_connections, self.per_client = max_connections, per_client
        self.header_timeout_s, self.body_min_bytes_per_s = header_timeout_s, body_min_bytes_per_s
        self.trusted = trusted  # a balancer's address: its connections are its clients', counted per request
        self.metrics = metrics
        self.open = 0
        self.by_address: Counter[str] = Counter()
        self.live: dict[asyncio.BaseTransport, Guarded] = {}  # open connections, by transport (for the middleware)

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; the reason it is refused (None: it is not)."""
        if self.max_connections and self.open >= self.max_connections:
            return "max_connections"
        counted = address and not self.trusted(address)
        if counted and self.per_client and self.by_address[address] >= self.per_client:
            return "max_connections_per_client"
        self.open += 1
        if self.metrics is not None:
            self.metrics.connections_open.set(self.open)
        if counted:
            self.by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        if self.metrics is not None:
            self.metrics.connections_open.set(self.open)
        if address in self.by_address:
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]

    def refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_refused.labels(reason=reason).inc()
        log.warning("connection refused at accept: server.%s reached", reason)

    def cut(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_cut.labels(reason=reason).inc()
        log.warning("connection cut: %s", reason)

    def protocol(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Guarded]:
        """The protocol factory of a listener whose connections ``inner`` (aiohttp's server) serves."""
        return lambda: Guarded(self, inner)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        """Tells the request's connection when the application has it and when it is done."""
        guarded = self.live.get(request.transport) if request.transport is not None else None
        if guarded is None:
            return await handler(request)
        guarded.request_started(request)
        try:
            return await handler(request)
        finally:
            guarded.request_done()


class Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, the guard's timers around it."""

    def __init__(self, guard: ConnectionGuard, inner: Callable[[], asyncio.Protocol]):
        self.guard, self._make_inner = guard, inner
        self.inner: asyncio.Protocol | None = None  # made once the connection is admitted
        self.transport: asyncio.Transport | None = None
        self.address: str | None = None  # counted by the guard (None: refused, or not yet)
        self.state = HEADERS  # the first request's headers are awaited from accept
        self._handling = False  # a request is in the application's hands
        self._timer: asyncio.TimerHandle | None = None
        self._body: Any = None  # the current request's body stream, while its rate is watched
        self._body_since = 0.0

    # --- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) and peer else ""
        reason = self.guard.admit(address)
        if reason is not None:
            self.guard.refused(reason)
            transport.abort()  # the inner protocol never sees it
            return
        self.address, self.transport, self.inner = address, transport, self._make_inner()
        sock = transport.get_extra_info("socket")
        if sock is not None:  # (a fixed size: the kernel no longer grows it, to megabytes on some kernels)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self.guard.live[transport] = self
        self._arm(self.guard.header_timeout_s, "header_timeout_s: no complete request headers in time")
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.address is None:
            return
        if self.state == IDLE:  # the next request on a kept-alive connection begins
            self.state = HEADERS
            self._arm(self.guard.header_timeout_s, "header_timeout_s: no complete request headers in time")
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.address is not None else None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.address is None:
            return
        self._disarm()
        self.guard.release(self.address)
        self.guard.live.pop(self.transport, None)
        self.address = None
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # --- the request's life, told by the middleware --------------------------------------------

    def request_started(self, request: web.BaseRequest) -> None:
        """The request reached the application: its headers are complete (aiohttp parsed them; bytes
        are not scanned here, so blank lines before a request line earn no time); watch its body."""
        self._disarm()
        self.state, self._handling = REQUEST, True
        if request.body_exists and not request.content.is_eof():
            self._body, self._body_since = request.content, asyncio.get_running_loop().time()
            self._arm(self.guard.header_timeout_s + BODY_CHECK_S, None)

    def request_done(self) -> None:
        """Its handler is done. The connection is idle until the next request's first byte, once the
        body has all come: a body refused early (401, 413, 429) must still come at the minimum rate
        while aiohttp reads past it, and its bytes are not the next request's."""
        self._handling = False
        if self._body is None or self._body.is_eof():
            self._idle()

    def _idle(self) -> None:
        self._disarm()
        self._body = None
        self.state = IDLE

    # --- timers ---------------------------------------------------------------------------------

    def _arm(self, delay: float, reason: str | None) -> None:
        """In ``delay`` s: cut the connection for ``reason``; None: check the body's rate then."""
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(delay, self._expired, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self, reason: str | None) -> None:
        self._timer = None
        if reason is None:
            body = self._body
            if body is None or body.is_eof():
                self._body = None
                if not self._handling:
                    self._idle()
                return
            elapsed = asyncio.get_running_loop().time() - self._body_since - self.guard.header_timeout_s
            if body.total_bytes >= self.guard.body_min_bytes_per_s * elapsed:
                self._arm(BODY_CHECK_S, None)
                return
            reason = "body_min_bytes_per_s: the request body came too slowly"
        self.guard.cut(reason)
        if self.transport is not None:
            self.transport.abort()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through ``guard`` (aiohttp's TCPSite, but for the protocol factory)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, backlog: int = BACKLOG):
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol(server), self._host, self._port, backlog=self._backlog, reuse_address=True)
