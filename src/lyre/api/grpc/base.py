"""What every gRPC service here shares: the checks before a call (a message that decodes, the API
key, the drain, the client's limit), Lyre's errors as status codes, method handlers whose request
decoders hand undecodable messages to the method (INVALID_ARGUMENT, not UNKNOWN), and an
utterance's audio as a call streams it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from lyre.api.access import CURRENT, METHOD, AccessLog, Entry, request_id
from lyre.api.common import (
    DRAIN_TIMEOUT,
    InFlight,
    classify,
    encode,
    error_code,
    finish,
    peer_address,
    retry_after,
)
from lyre.audio.formats import AudioEncoder, AudioFormatError
from lyre.config import LyreConfig
from lyre.errors import InvalidRequest, LyreError, TooManyConnections, UploadTooLarge
from lyre.service.tts import TTSService
from lyre.service.utterance import Utterance
from lyre.trust.tokens import NOT_FOR_TOKENS, SCOPE, TOKEN_METHODS

log = logging.getLogger("lyre.grpc")


@dataclass
class Undecodable:
    """A request message that did not parse, or is larger than its method takes (handed to the
    method, which answers with :meth:`refusal`: INVALID_ARGUMENT either way)."""

    type_name: str
    error: str
    too_large: bool = False

    def refusal(self) -> LyreError:
        if self.too_large:
            return UploadTooLarge(self.error)
        return InvalidRequest(f"the request is not a valid {self.type_name} message: {self.error}")


# the methods whose messages carry an audio file (voices.max_upload_bytes), not only text and options
AUDIO_METHODS = frozenset({"EnrollVoice"})


def message_limit(cfg: LyreConfig, method: str) -> tuple[int, str]:
    """The largest request message ``method`` takes, in bytes, and the setting that says so:
    server.max_body_bytes, or for a method that carries an audio file, voices.max_upload_bytes and
    room for its other fields."""
    if method in AUDIO_METHODS:
        return max(cfg.server.max_body_bytes, cfg.voices.max_upload_bytes + 64 * 1024), "voices.max_upload_bytes"
    return cfg.server.max_body_bytes, "server.max_body_bytes"


def _decoder(cls: Any, limit: int, setting: str):
    name = cls.DESCRIPTOR.name

    def decode(data: bytes) -> Any:
        if len(data) > limit:  # (received whole already: grpc.max_receive_message_length bounds that)
            return Undecodable(name, f"the {name} message is {len(data)} bytes; at most {limit} are taken "
                                     f"({setting})", too_large=True)
        try:
            return cls.FromString(data)
        except DecodeError as e:
            return Undecodable(name, str(e))

    return decode


class Servicer:
    """What every gRPC service here shares: the checks before a call and its errors as status codes."""

    def __init__(self, service: TTSService, inflight: InFlight):
        self.service = service
        self.inflight = inflight
        self.accounts = service.accounts
        self.access = AccessLog(service.config.server.access_log)

    @contextlib.asynccontextmanager
    async def _serving(self, context: grpc.aio.ServicerContext, request: Any = None, keyless: bool = False):
        """Every call: a message that decodes, the API key (yields its account; ``keyless``: a call
        that may go on without one yields None), not draining, the client's limit; then Lyre's
        errors become status codes."""
        pairs = context.invocation_metadata() or ()
        metadata = dict(pairs)
        method = METHOD.get()
        entry = Entry("riva" if method.startswith("nvidia.riva") else "grpc", method, self.client_address(context, metadata),
                      request_id(metadata.get("x-request-id"), metadata.get("authorization"), self.accounts.is_key))
        CURRENT.set(entry)
        address = None
        try:
            if isinstance(request, Undecodable):
                await self._abort(context, entry, request.refusal())
            if sum(1 for key, _ in pairs if key == "authorization") > 1:  # which one would be the caller?
                await self._abort(context, entry, "send one authorization metadata entry, not several",
                                  grpc.StatusCode.UNAUTHENTICATED, "duplicate_authorization")
            account, grant = self.accounts.caller(metadata.get("authorization"))
            entry.account = account
            if account is None and not (keyless and "authorization" not in metadata):
                await self._abort(context, entry, "missing, wrong or expired API key or token (authorization: "
                                  "Bearer <key or token>)", grpc.StatusCode.UNAUTHENTICATED, "unauthorized")
            if grant is not None and method not in TOKEN_METHODS:
                await self._abort(context, entry, NOT_FOR_TOKENS, grpc.StatusCode.PERMISSION_DENIED, "not_permitted")
            SCOPE.set(grant.scope if grant is not None else None)  # (what the call's voices are checked against)
            if self.inflight.draining:
                await self._abort(context, entry, "the server is shutting down", grpc.StatusCode.UNAVAILABLE,
                                  "unavailable")
            try:
                address = self.inflight.clients.enter(entry.client)
            except TooManyConnections as e:
                await self._abort(context, entry, e)
            over = _session_deadline(grant)
            with self.inflight.request():
                try:
                    yield account
                    entry.status = "OK"
                except (LyreError, AudioFormatError) as e:
                    wait = retry_after(e)
                    if wait:  # a refusal that passes: when to try again, as HTTP's Retry-After says it
                        context.set_trailing_metadata((("retry-after", wait),))
                    await self._abort(context, entry, e)
                except asyncio.CancelledError:
                    if over is not None and over.ran:  # the token's max_session_s
                        await self._abort(context, entry, "the client token's max_session_s is over",
                                          grpc.StatusCode.DEADLINE_EXCEEDED, "session_over")
                    entry.status, entry.code = "CANCELLED", "cancelled"  # the client's cancel, or the drain's end
                    if self.inflight.draining:
                        log.info("call cancelled: %s", DRAIN_TIMEOUT)
                    raise
                finally:
                    if over is not None:
                        over.cancel()
        except BaseException:
            if entry.status == "-":
                entry.status, entry.code = "UNKNOWN", "internal_error"  # (grpc's answer to an unexpected error)
            raise
        finally:
            if address is not None:
                self.inflight.clients.leave(address)
            self.access.write(entry)

    async def _abort(self, context: grpc.aio.ServicerContext, entry: Entry, error: BaseException | str,
                     status: grpc.StatusCode | None = None, code: str | None = None) -> None:
        """End the call with ``error`` (a Lyre error's status and code, or these), as its access-log line says."""
        if not isinstance(error, str):
            status = getattr(grpc.StatusCode, classify(error).grpc_status)
            code = error_code(error)
        entry.status, entry.code = status.name, code
        await context.abort(status, str(error))


    def client_address(self, context: grpc.aio.ServicerContext, metadata: dict | None = None) -> str | None:
        """The caller's address (behind a trusted balancer: its x-forwarded-for)."""
        metadata = dict(context.invocation_metadata()) if metadata is None else metadata
        return self.inflight.address(peer_address(context.peer()), metadata.get("x-forwarded-for"))


class _Deadline:
    """Cancels the running task after ``seconds`` (``ran`` says it did)."""

    def __init__(self, seconds: float):
        task = asyncio.current_task()
        self.ran = False
        self._handle = asyncio.get_running_loop().call_later(seconds, self._fire, task)

    def _fire(self, task: asyncio.Task) -> None:
        self.ran = True
        task.cancel()

    def cancel(self) -> None:
        self._handle.cancel()


def _session_deadline(grant: Any) -> _Deadline | None:
    """A call made with a client token whose scope has ``max_session_s``: ended when it is over."""
    if grant is None or grant.scope.max_session_s is None:
        return None
    return _Deadline(grant.scope.max_session_s)


async def utterance_audio(utterance: Utterance, encoder: AudioEncoder,
                          reader: asyncio.Task) -> AsyncIterator[tuple[bytes, bool]]:
    """The encoded audio of an utterance that ``reader`` (a task reading the request stream) feeds:
    ``(bytes, last)`` pairs, the last one the encoder's tail; the reader's error when it failed.
    Whatever happens, the reader, the utterance and the encoder end with it."""
    try:
        try:
            async for chunk in utterance:
                data = await encode(encoder, chunk.pcm)
                if data:
                    yield data, False
        except LyreError:
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception() from None  # a bad message cancelled the utterance: it is the answer
            raise
        if reader.done():
            await reader  # a bad message ended the utterance: its error is the answer
        yield await finish(encoder), True
    finally:
        reader.cancel()
        utterance.cancel()
        encoder.close()


def handlers(servicer: Servicer, service: Any, messages: Any) -> grpc.GenericRpcHandler:
    """The method handlers of ``service`` (a ServiceDescriptor whose messages are in the generated
    module ``messages``), with request decoders that hand undecodable messages, and messages over the
    method's :func:`message_limit`, to the method (so they get INVALID_ARGUMENT, not UNKNOWN)."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    cfg = servicer.service.config
    table = {}
    for method in service.methods:
        make = kinds[(method.client_streaming, method.server_streaming)]
        table[method.name] = make(
            _named(getattr(servicer, method.name), f"{service.full_name}/{method.name}", method.server_streaming),
            request_deserializer=_decoder(getattr(messages, method.input_type.name), *message_limit(cfg, method.name)),
            response_serializer=getattr(messages, method.output_type.name).SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, table)


def _named(fn: Any, name: str, streams: bool) -> Any:
    """``fn`` with the call's method name where its access-log line reads it (:data:`METHOD`)."""
    if streams:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            METHOD.set(name)
            async for response in fn(request, context):
                yield response

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        METHOD.set(name)
        return await fn(request, context)

    return unary
