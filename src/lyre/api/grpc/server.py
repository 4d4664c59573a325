"""gRPC front end (grpc.aio): ``lyre.v1.TextToSpeech`` (:mod:`.tts`) and NVIDIA Riva's TTS API
(:mod:`.riva`) on one port, plus standard health checking and reflection.

Errors map to status codes: INVALID_ARGUMENT (bad options, messages that do not decode, e.g.
bad UTF-8, and messages over their method's size limit), NOT_FOUND (voice), RESOURCE_EXHAUSTED (overload, too many calls from one client),
UNAVAILABLE (shutting down), CANCELLED, DEADLINE_EXCEEDED, UNAUTHENTICATED (api key), INTERNAL.
A client that cancels or whose deadline passes cancels its synthesis, which frees the KV slot at
the next step.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from lyre.api.common import InFlight
from lyre.api.grpc import riva, tts
from lyre.api.grpc.base import handlers, message_limit
from lyre.config import LyreConfig
from lyre.service.tts import TTSService

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def _reflection_v1(reflector: reflection.aio.ReflectionServicer) -> grpc.GenericRpcHandler:
    """Reflection under its v1 name (what grpcurl and current clients ask first) beside v1alpha:
    the two protocols' messages are the same on the wire, so v1alpha's servicer answers both."""
    return grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
        reflector.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)})


class MethodSymbols:
    """The descriptor pool reflection reads, which also finds the file of a method by its full name
    (``lyre.v1.TextToSpeech.Synthesize``: what ``grpcurl describe`` of a method asks for). protobuf's
    upb pool finds services and messages by name but not methods (KeyError, "Symbol not found"):
    a method's file is its service's."""

    def __init__(self, pool: Any):
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, name: str) -> Any:  # noqa: N802 - the pool's own method name
        try:
            return self._pool.FindFileContainingSymbol(name)
        except KeyError:
            service, _, method = name.rpartition(".")
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                raise KeyError(name) from None
            if method not in found.methods_by_name:
                raise
            return found.file


def grpc_options(cfg: LyreConfig, max_connections: int = 0) -> list[tuple[str, int]]:
    """grpcio's channel arguments for the server: how many connections (0: no cap), what a
    connection may hold and for how long."""
    s = cfg.server

    def ms(seconds: float) -> int:  # grpcio: INT_MAX ms is "never"
        return int(seconds * 1000) if seconds > 0 else 2**31 - 1

    return [
        # the largest message of any method (an enrollment's audio); each method then holds its own
        # messages to its limit (base.handlers: server.max_body_bytes for all but EnrollVoice)
        ("grpc.max_receive_message_length", message_limit(cfg, "EnrollVoice")[0]),
        ("grpc.max_concurrent_streams", s.grpc_max_streams_per_connection),
        ("grpc.max_connection_idle_ms", ms(s.grpc_max_connection_idle_s)),
        ("grpc.max_connection_age_ms", ms(s.grpc_max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", ms(s.grpc_max_connection_age_grace_s)),
        # keepalive enforcement, grpcio's defaults made explicit: a client pinging more often than every
        # 5 minutes without a call, or at all between calls, is sent GOAWAY after 2 strikes
        ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_ping_strikes", 2),
        # a connection must finish its HTTP/2 handshake as a request its headers (server.header_timeout_s)
        ("grpc.server_handshake_timeout_ms", ms(s.header_timeout_s)),
    ] + ([("grpc.max_allowed_incoming_connections", max_connections)] if max_connections else [])


async def start_grpc(service: TTSService, inflight: InFlight, host: str, port: int,
                     max_connections: int = 0) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """Start the gRPC server (at most ``max_connections`` open at once; 0: no cap); returns it, the
    bound port and its health servicer."""
    server = grpc.aio.server(options=grpc_options(service.config, max_connections))
    server.add_generic_rpc_handlers((handlers(tts.TextToSpeech(service, inflight), tts.SERVICE, tts.tts_pb2),
                                     riva.handlers(service, inflight)))
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [tts.SERVICE_NAME, riva.SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME,
             REFLECTION_V1]
    reflector = reflection.aio.ReflectionServicer(names, pool=MethodSymbols(descriptor_pool.Default()))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflector, server)
    server.add_generic_rpc_handlers((_reflection_v1(reflector),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC to {host}:{port}")
    await server.start()
    for name in ("", tts.SERVICE_NAME, riva.SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health


READY_POLL_S = 0.25


async def follow_readiness(service: TTSService, inflight: InFlight, health: HealthServicer) -> None:
    """Keep the gRPC health of the synthesis services (``lyre.v1.TextToSpeech``, Riva's) equal to
    ``/ready``: NOT_SERVING while admission is full, SERVING when there is room again (checked every
    READY_POLL_S), NOT_SERVING from the drain's notice on. The server's own status, ``""``, is
    liveness: SERVING while the engine runs (NOT_SERVING if its loop stops), until the drain."""
    status = {True: health_pb2.HealthCheckResponse.SERVING, False: health_pb2.HealthCheckResponse.NOT_SERVING}
    serving: bool | None = None
    alive: bool | None = True
    while not inflight.draining and not inflight.announced:
        now = service.readiness() is None
        if now != serving:
            for name in (tts.SERVICE_NAME, riva.SERVICE_NAME):
                await health.set(name, status[now])
            serving = now
        if service.ready != alive:  # the engine loop stopped: liveness fails, the orchestrator restarts
            alive = service.ready
            await health.set("", status[alive])
        await asyncio.sleep(READY_POLL_S)
    for name in (tts.SERVICE_NAME, riva.SERVICE_NAME):  # draining (or about to): no new callers
        await health.set(name, status[False])
