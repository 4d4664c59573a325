"""Pieces the front ends share: error mapping, API keys, per-client limits, draining, encoding off
the event loop, and how requests appear in logs."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lyre.api.access import add_audio
from lyre.audio.formats import AudioEncoder, AudioFormatError
from lyre.errors import (
    ConsentInUse,
    ConsentRequired,
    DatabaseError,
    InvalidAudio,
    InvalidRequest,
    LyreError,
    NotPermitted,
    OutOfRange,
    OverloadedError,
    ServiceUnavailable,
    SynthesisCancelled,
    SynthesisFailed,
    SynthesisTimeout,
    TextTooLong,
    TooManyConnections,
    TooManyVoices,
    UnknownConsent,
    UnknownVoice,
    UnsupportedMediaType,
    UploadTooLarge,
    VoiceExists,
)
from lyre.model import orpheus

if TYPE_CHECKING:
    from lyre.service.stream import SpeechStream
    from lyre.service.utterance import Utterance


@dataclass(frozen=True)
class ErrorInfo:
    http_status: int
    grpc_status: str  # name of a grpc.StatusCode
    type: str


def classify(error: BaseException) -> ErrorInfo:
    """How a Lyre error maps to HTTP and gRPC status codes."""
    if isinstance(error, (UnknownVoice, UnknownConsent)):
        return ErrorInfo(404, "NOT_FOUND", "not_found_error")
    if isinstance(error, (TextTooLong, OutOfRange, AudioFormatError, InvalidAudio, ConsentRequired)):
        return ErrorInfo(422, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, NotPermitted):
        return ErrorInfo(403, "PERMISSION_DENIED", "permission_error")
    if isinstance(error, UnsupportedMediaType):
        return ErrorInfo(415, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, UploadTooLarge):
        return ErrorInfo(413, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, (VoiceExists, TooManyVoices)):
        return ErrorInfo(409, "ALREADY_EXISTS" if isinstance(error, VoiceExists) else "RESOURCE_EXHAUSTED",
                         "conflict_error")
    if isinstance(error, ConsentInUse):
        return ErrorInfo(409, "FAILED_PRECONDITION", "conflict_error")
    if isinstance(error, DatabaseError):
        return ErrorInfo(503, "UNAVAILABLE", "service_unavailable")
    if isinstance(error, InvalidRequest):
        return ErrorInfo(400, "INVALID_ARGUMENT", "invalid_request_error")
    if isinstance(error, (OverloadedError, TooManyConnections)):
        return ErrorInfo(429, "RESOURCE_EXHAUSTED", "overloaded_error")
    if isinstance(error, ServiceUnavailable):
        return ErrorInfo(503, "UNAVAILABLE", "service_unavailable")
    if isinstance(error, SynthesisTimeout):
        return ErrorInfo(504, "DEADLINE_EXCEEDED", "timeout_error")
    if isinstance(error, SynthesisCancelled):
        return ErrorInfo(499, "CANCELLED", "cancelled")
    if isinstance(error, (SynthesisFailed, LyreError)):
        return ErrorInfo(500, "INTERNAL", "server_error")
    return ErrorInfo(500, "INTERNAL", "server_error")


def error_code(error: BaseException) -> str:
    if isinstance(error, AudioFormatError):
        return "unsupported_format"
    return getattr(error, "code", "internal_error")


def error_body(error: BaseException) -> dict[str, Any]:
    """``{"message", "type", "code"}``: the error object of REST bodies and WebSocket frames."""
    body = {"message": str(error), "type": classify(error).type, "code": error_code(error)}
    if getattr(error, "problems", None):  # a batch input refused at validation: each bad line
        body["lines"] = [{"line": line, "message": why} for line, why in error.problems]
    return body


def retry_after(error: BaseException) -> str | None:
    """The Retry-After value (whole seconds, at least 1) for an overload refusal."""
    seconds = getattr(error, "retry_after_s", None)
    return None if seconds is None else str(max(1, round(seconds)))


def json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    """``raw`` parsed as a JSON object; InvalidRequest naming ``what`` ("the request body",
    "message") for anything else, including nesting too deep to parse."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest(f"{what} is not acceptable JSON: it is nested too deeply") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"{what} must be a JSON object")
    return data


def describe_text(text: str) -> str:
    """How request text appears in logs: its length and a hash, never the words."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{len(text)} chars sha256:{digest}"


# --------------------------------------------------------------------------------------------
# per-client limits and draining


class Clients:
    """Open requests, sockets and calls per client address (``server.max_connections_per_client``)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: Counter[str] = Counter()

    def enter(self, address: str | None) -> str:
        address = address or "unknown"
        if self.limit and self.open[address] >= self.limit:
            raise TooManyConnections(
                f"this client already has {self.open[address]} open requests/sockets; "
                f"server.max_connections_per_client is {self.limit}")
        self.open[address] += 1
        return address

    def leave(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


def peer_address(peer: str) -> str:
    """The client address of a gRPC peer as aiohttp names it: "ipv4:1.2.3.4:5678" -> "1.2.3.4",
    "ipv6:[::1]:5678" -> "::1"."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = rest.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


class ClientAddress:
    """The client's address: the peer's, or, when the peer is a trusted balancer
    (``server.trusted_proxies``), the last X-Forwarded-For hop that is not one."""

    def __init__(self, trusted: tuple[str, ...] = ()):
        self.networks = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in n for n in self.networks)

    def __call__(self, peer: str | None, forwarded_for: str | None) -> str | None:
        if not self.networks or not peer or not forwarded_for or not self.trusted(peer):
            return peer
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        for hop in reversed(hops):
            if not self.trusted(hop):
                try:
                    return str(ipaddress.ip_address(hop))
                except ValueError:
                    return peer  # not an address: a client's own invention, not the balancer's
        return peer


class InFlight:
    """The requests being served (every front end's), so a shutdown can wait for them (no polling)
    and then cancel the rest; ``on_drain`` callbacks run when draining starts (idle WebSockets close
    then). ``clients`` counts them per client address (``address`` finds it behind a balancer)."""

    def __init__(self, max_per_client: int = 0, trusted_proxies: tuple[str, ...] = ()) -> None:
        self.clients = Clients(max_per_client)
        self.address = ClientAddress(trusted_proxies)
        self.announced = False  # a drain is coming: /ready says so, requests are still taken
        self.draining = False
        self._tasks: set[asyncio.Task] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_drain: set[Callable[[], Any]] = set()

    @property
    def count(self) -> int:
        return len(self._tasks)

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count the current task in flight while the block runs. The task is the one that entered:
        a streaming handler hung up while it waits to send is closed later, as an async generator,
        in another task, and must still leave as the one it came in as."""
        task = asyncio.current_task()
        self._tasks.add(task)
        self._idle.clear()
        try:
            yield
        finally:
            self._tasks.discard(task)
            if not self._tasks:
                self._idle.set()

    def on_drain(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """Call ``callback`` when draining starts (at once if it has); returns the unsubscriber."""
        if self.draining:
            callback()
        self._on_drain.add(callback)
        return lambda: self._on_drain.discard(callback)

    def announce_drain(self) -> None:
        """Tell balancers (``/ready``, gRPC health) before refusing anything (server.drain_notice_s)."""
        self.announced = True

    def start_draining(self) -> None:
        self.draining = True
        for callback in list(self._on_drain):
            callback()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def cancel_all(self) -> int:
        """Cancel every request still being served (the drain timeout passed); returns how many.
        Each handler answers its client with a final "shutting down" message as it unwinds."""
        for task in self._tasks:
            task.cancel(DRAIN_TIMEOUT)
        return len(self._tasks)


DRAIN_TIMEOUT = "the server is shutting down and server.drain_timeout_s has passed: synthesis cancelled"


def cancelled_by_drain(inflight: InFlight) -> ServiceUnavailable | None:
    """While unwinding a cancelled handler: the error to tell its client, when the drain cancelled it."""
    return ServiceUnavailable(DRAIN_TIMEOUT) if inflight.draining else None


# --------------------------------------------------------------------------------------------
# encoding off the event loop


async def _off_loop(encoder: AudioEncoder, fn: Callable[..., bytes], *args: Any) -> bytes:
    """``fn(*args)`` of ``encoder``: in a worker thread for compressed formats and resampling, so
    many mp3 streams do not stall the sockets of others (calls on one encoder are awaited in order)."""
    return fn(*args) if encoder.cheap else await asyncio.to_thread(fn, *args)


async def encode(encoder: AudioEncoder, pcm: Any) -> bytes:
    add_audio(len(pcm) / orpheus.SAMPLE_RATE)  # (the access log's audio seconds of the request)
    return await _off_loop(encoder, encoder.encode, pcm)


async def finish(encoder: AudioEncoder) -> bytes:
    return await _off_loop(encoder, encoder.finish)


async def whole_audio(stream: SpeechStream | Utterance, encoder: AudioEncoder,
                      gone: Callable[[], bool] | None = None) -> bytes:
    """All of ``stream``'s audio, encoded; the stream and the encoder end with it. ``gone``: whether
    the client has left (checked at every chunk: ConnectionResetError ends the synthesis at once)."""
    try:
        parts = []
        async for chunk in stream:
            if gone is not None and gone():
                raise ConnectionResetError("the client went away before its audio was complete")
            parts.append(await encode(encoder, chunk.pcm))
        parts.append(await finish(encoder))
        return b"".join(parts)
    finally:
        await stream.aclose()
        encoder.close()
