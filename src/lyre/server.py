"""Lyre production server: REST + WebSocket (aiohttp) and gRPC (grpc.aio) over one engine.

  lyre serve --config config/model_config.yaml --port 8000 [--grpc-port 50051]
             [--host 0.0.0.0] [--set section.key=value ...]

(``production_server.py`` in the repository runs the same.)

GET / is the playground, a page to try the server from a browser (server.playground; on by
default).

GET /health is liveness (200 while the engine runs); GET /ready and the gRPC health of the
synthesis services say "send me new callers" (503 / NOT_SERVING while admission is full or
draining). On SIGINT/SIGTERM it stops accepting requests (/ready turns 503; idle WebSockets close
with 1001),
lets in-flight streams finish within server.drain_timeout_s, cancels the rest on every protocol
(each told why: an SSE/WebSocket error message, gRPC UNAVAILABLE/CANCELLED, a cut REST body) and
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import dataclass

import grpc
from aiohttp import web
from grpc_health.v1._async import HealthServicer

from lyre.api import log_storms
from lyre.api.common import InFlight
from lyre.api.connections import (
    ConnectionGuard,
    GuardedSite,
    connection_caps,
    per_client_cap,
    raise_descriptor_limit,
)
from lyre.api.grpc.server import follow_readiness, start_grpc
from lyre.api.http.app import create_app
from lyre.config import ConfigError, ServerConfig, add_config_arguments, apply_overrides, config_from_args
from lyre.errors import LyreError
from lyre.model import checkpoint
from lyre.service.tts import TTSService

log = logging.getLogger("lyre.server")

UNWIND_S = 2.0  # after the drain: for cancelled handlers to send their last message, idle connections to close


@dataclass
class Listeners:
    """The sockets of one running server and what serving them shares: REST + WebSocket (aiohttp),
    gRPC (with its health servicer and the task that keeps it equal to /ready), the requests in flight."""

    inflight: InFlight
    runner: web.AppRunner
    http_port: int
    grpc_server: grpc.aio.Server | None = None
    grpc_port: int = 0
    health: HealthServicer | None = None
    readiness: asyncio.Task | None = None


async def listen(service: TTSService, host: str, http_port: int, grpc_port: int | None) -> Listeners:
    """Open the listeners of a started ``service``: ``http_port`` 0 takes any free port; ``grpc_port``
    None serves no gRPC, 0 any free port."""
    cfg = service.config.server
    log_storms.install()  # what clients can make aiohttp and asyncio log: one line per cause per minute
    http_cap, grpc_cap = connection_caps(cfg.max_connections, raise_descriptor_limit())
    inflight = InFlight(cfg.max_connections_per_client, cfg.trusted_proxies)
    per_client = per_client_cap(cfg.max_connections_per_client, http_cap)
    guard = ConnectionGuard(http_cap, per_client, cfg.header_timeout_s, cfg.body_min_bytes_per_s,
                            inflight.address.trusted, service.metrics)
    app = create_app(service, inflight)
    app.middlewares.insert(0, guard.middleware)  # outermost: it sees every request the application gets
    # auto_decompress off: a body is read as sent, and one with a Content-Encoding is refused (415) by
    # the application, not failed by aiohttp's parser (deflate junk reset the connection, br was a 400)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=UNWIND_S, keepalive_timeout=cfg.keepalive_timeout_s,
                           auto_decompress=False)
    await runner.setup()
    await GuardedSite(runner, host, http_port, guard).start()
    log.info("connections: at most %d on the REST/WebSocket port, %d on gRPC, %s per client address", http_cap,
             grpc_cap, per_client or "any number")
    listeners = Listeners(inflight, runner, runner.addresses[0][1] if runner.addresses else http_port)
    if grpc_port is not None:
        listeners.grpc_server, listeners.grpc_port, listeners.health = await start_grpc(service, inflight, host,
                                                                                         grpc_port, grpc_cap)
        listeners.readiness = asyncio.get_running_loop().create_task(
            follow_readiness(service, inflight, listeners.health))
    return listeners


async def drain(listeners: Listeners, cfg: ServerConfig) -> None:
    """Stop serving: announce the drain (``server.drain_notice_s``), refuse new requests, let those in
    flight finish within ``server.drain_timeout_s``, cancel the rest (each told why), close the sockets."""
    inflight = listeners.inflight
    if cfg.drain_notice_s:  # /ready and the gRPC health say "draining" first; requests are still taken
        log.info("shutting down: announcing the drain for %.1f s", cfg.drain_notice_s)
        inflight.announce_drain()
        await asyncio.sleep(cfg.drain_notice_s)
    log.info("shutting down: draining %d in-flight request(s) for up to %.0f s", inflight.count, cfg.drain_timeout_s)
    inflight.start_draining()  # new requests get 503 / UNAVAILABLE; idle WebSockets close now
    if listeners.health is not None:
        listeners.readiness.cancel()
        await listeners.health.enter_graceful_shutdown()
    drained = await inflight.wait_idle(cfg.drain_timeout_s)
    if not drained:
        log.warning("drain timeout: cancelling %d stream(s)", inflight.cancel_all())
        await inflight.wait_idle(UNWIND_S)  # each tells its client why as it unwinds
    if listeners.grpc_server is not None:
        await listeners.grpc_server.stop(grace=0 if not drained else 1)
    await listeners.runner.cleanup()


async def serve(service: TTSService) -> int:
    """Run ``service`` behind its listeners until SIGINT or SIGTERM, then drain."""
    cfg = service.config.server
    async with service:
        listeners = await listen(service, cfg.host, cfg.port, cfg.grpc_port or None)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        model = service.model
        log.info("model: %s; engine backend: %s (%s)", model.source, service.backend.name, service.backend.reason)
        if model.is_demo:
            log.warning("serving the DEMO checkpoint: every response is NOISE, not speech")
        # Tests and scripts wait for this line.
        print(f"Lyre ready: http://{cfg.host}:{listeners.http_port} grpc {cfg.host}:{listeners.grpc_port or 'off'}",
              flush=True)
        await stop.wait()
        await drain(listeners, cfg)
    log.info("stopped")
    return 0


def main(argv=None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p)
    p.add_argument("--host", help="interface (default: server.host)")
    p.add_argument("--port", type=int, help="REST + WebSocket port (default: server.port; 0 = any free port)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default: server.grpc_port; 0 = off)")
    p.add_argument("--baseline", choices=["transformers", "llamacpp"],
                   help="serve a benchmark peer instead of Lyre's engine (for benchmark.py --baseline): "
                        "transformers generate + one SNAC decode, one request at a time; or llamacpp, llama.cpp's "
                        "batched decoding + SNAC over a sliding window (needs .[peer])")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        overrides = {f"server.{k}": v for k, v in (("host", args.host), ("port", args.port),
                                                   ("grpc_port", args.grpc_port)) if v is not None}
        cfg = apply_overrides(cfg, overrides)
        if args.baseline == "llamacpp":
            from lyre.benchmarks.peer.service import LlamaCppBaseline

            service = LlamaCppBaseline(cfg)
        elif args.baseline:
            from lyre.benchmarks.baseline import TransformersBaseline

            service = TransformersBaseline(cfg)
        else:
            service = TTSService(cfg)
        return asyncio.run(serve(service))
    except (ConfigError, checkpoint.CheckpointError, LyreError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

