"""REST front end (aiohttp) and the application. Parses, validates, encodes audio; no model logic.

- ``POST /v1/audio/speech``: OpenAI-compatible (``model``, ``input`` or ``text``, ``voice``,
  ``response_format``, ``speed``, ``stream_format`` audio|sse, ``instructions`` accepted and
  ignored) plus ``sample_rate``, ``mulaw``/``alaw`` formats and sampling overrides
  (:class:`lyre.service.options.SpeechBody`); audio streams from the first chunk, except FLAC, which is
  sent whole so that its header holds its length (libsndfile cannot read a FLAC file without it).
- voices (built-in and each account's cloned voices: :mod:`lyre.api.http.voices`), ``GET /v1/models``
  (as OpenAI's), ``/v1/stats``, ``/health``, ``/metrics``, ``/openapi.json`` (the
  OpenAPI 3.1 document of all of these, :mod:`lyre.api.http.openapi`).
- ``GET /v1/audio/stream``: the WebSocket (:mod:`lyre.api.http.ws`).

Every response carries ``X-Request-Id``: the client's, when it sent a sane one, else a new one.

Errors are JSON ``{"error": {"message", "type", "code"}}`` with a fitting 4xx/5xx status. With
API keys configured (``server.api_keys``, ``server.api_key``), ``/v1/`` needs ``Authorization:
Bearer <key>`` (compared in constant time); the key names the request's account
(``request[ACCOUNT]``), which owns the cloned voices it enrolls.
Each client address may hold ``server.max_connections_per_client`` requests and sockets at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web

from lyre.api.common import (
    InFlight,
    cancelled_by_drain,
    classify,
    describe_text,
    encode,
    error_body,
    finish,
    json_object,
    retry_after,
    whole_audio,
)
from lyre.api.http.openapi import document
from lyre.audio.formats import AudioEncoder, AudioFormatError, check_format
from lyre.errors import InvalidRequest, LyreError, ServiceUnavailable
from lyre.service.options import SpeechBody, parse
from lyre.service.stream import SpeechStream
from lyre.service.tts import TTSService
from lyre.service.utterance import Utterance
from lyre.trust.accounts import Accounts

log = logging.getLogger("lyre.http")

SERVICE = web.AppKey("service", TTSService)
INFLIGHT = web.AppKey("inflight", InFlight)
ACCOUNT = "lyre.account"  # request key: the account the request's API key names
MAX_BODY = web.AppKey("max_body", int)


def error_response(status: int, message: str, type_: str, code: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": code}}, status=status,
                             headers=headers)


def lyre_error_response(e: Exception) -> web.Response:
    wait = retry_after(e)
    return web.json_response({"error": error_body(e)}, status=classify(e).http_status,
                             headers={"Retry-After": wait} if wait else None)


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except (LyreError, AudioFormatError) as e:
        return lyre_error_response(e)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status, "http_error")
        message = e.text if e.status != 413 else (
            f"request body is larger than server.max_body_bytes ({request.app[MAX_BODY]} bytes)")
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None  # a 405 says what is allowed
        return error_response(e.status, message, "not_found_error" if e.status == 404 else "invalid_request_error",
                              code, headers=allow)


def auth_middleware(accounts: Accounts):
    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path.startswith("/v1/"):
            account = accounts.account(request.headers.get("Authorization"))
            if account is None:
                return error_response(401, "missing or wrong API key (Authorization: Bearer <key>)",
                                      "authentication_error", "unauthorized")
            request[ACCOUNT] = account
        return await handler(request)

    return middleware


@web.middleware
async def clients_middleware(request: web.Request, handler):
    """At most ``server.max_connections_per_client`` open requests and sockets per client address."""
    if not request.path.startswith("/v1/"):
        return await handler(request)
    inflight = request.app[INFLIGHT]
    clients = inflight.clients
    address = clients.enter(inflight.address(request.remote, request.headers.get("X-Forwarded-For")))
    try:
        return await handler(request)
    finally:
        clients.leave(address)


def create_app(service: TTSService, inflight: InFlight) -> web.Application:
    from lyre.api.http import verify, voices
    from lyre.api.http.ws import websocket

    cfg = service.config.server
    app = web.Application(client_max_size=cfg.max_body_bytes,
                          middlewares=[errors_middleware, auth_middleware(Accounts(cfg)), clients_middleware])
    app[SERVICE] = service
    app[INFLIGHT] = inflight
    app[MAX_BODY] = cfg.max_body_bytes
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/stream", websocket)
    voices.routes(app)
    verify.routes(app)
    app.router.add_get("/v1/models", models)
    app.on_response_prepare.append(request_id_header)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    return app


# --------------------------------------------------------------------------------------------
# REST


async def _json_body(request: web.Request) -> dict[str, Any]:
    limit = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    return json_object(await request.read(), "the request body")


def draining(request: web.Request) -> None:
    if request.app[INFLIGHT].draining:
        raise ServiceUnavailable("the server is shutting down")


async def speech(request: web.Request) -> web.StreamResponse:
    draining(request)
    service = request.app[SERVICE]
    body = parse(SpeechBody, await _json_body(request))
    if body.input is not None and body.text is not None:
        raise InvalidRequest("give 'input' (OpenAI's name) or 'text', not both")
    text = body.input if body.input is not None else body.text
    if text is None:
        raise InvalidRequest("'input' is required")
    fmt = body.response_format or ("mp3" if body.input is not None else "wav")
    check_format(fmt, body.sample_rate)  # refused before admission; the encoder is built after it
    account = request[ACCOUNT]
    voice = await service.voices.resolve(body.voice, account)
    stream = service.speak(text, voice, account=account, protocol="rest", **body.sampling())
    log.debug("speech: %s, %s", describe_text(text), fmt)
    with request.app[INFLIGHT]:
        if fmt == "flac" and body.stream_format != "sse":
            return await _respond_whole(request, stream, fmt, body)
        return await _respond(request, stream, fmt, body)


async def _respond_whole(request: web.Request, stream: SpeechStream, fmt: str, body: SpeechBody) -> web.Response:
    """The whole file in one response, its headers filled in (a failure still gets its status)."""
    try:
        encoder = AudioEncoder(fmt, body.sample_rate, speed=body.speed or 1.0, stream=False,
                               mark=request.app[SERVICE].marker())
    except BaseException:
        await stream.aclose()
        raise
    try:
        data = await whole_audio(stream, encoder, gone=lambda: request.transport is None or
                                 request.transport.is_closing())
    except asyncio.CancelledError:
        error = cancelled_by_drain(request.app[INFLIGHT])
        if error is None:
            raise
        raise error from None
    except ConnectionResetError:  # the client left: its synthesis has been cancelled
        log.debug("speech: the client disconnected before its %s file was complete", fmt)
        return web.Response(status=499)
    return web.Response(body=data, headers={"Content-Type": encoder.content_type, "Cache-Control": "no-cache",
                                            "X-Sample-Rate": str(encoder.sample_rate)})


async def _respond(request: web.Request, stream: SpeechStream | Utterance, fmt: str, body: SpeechBody) -> web.StreamResponse:
    """Stream ``stream`` as the response. Every path ends the synthesis and releases the encoder."""
    sse = body.stream_format == "sse"
    resp: web.StreamResponse | None = None
    encoder: AudioEncoder | None = None
    try:
        # Wait for the first chunk before answering, so an early failure still gets its status.
        first = await anext(stream, None)
        encoder = AudioEncoder(fmt, body.sample_rate, speed=body.speed or 1.0,
                               mark=request.app[SERVICE].marker())  # marked again after a tempo change
        headers = {"Content-Type": "text/event-stream" if sse else encoder.content_type,
                   "X-Sample-Rate": str(encoder.sample_rate), "Cache-Control": "no-cache"}
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        if first is not None:
            await _send(resp, await encode(encoder, first.pcm), sse)
        async for chunk in stream:
            await _send(resp, await encode(encoder, chunk.pcm), sse)
        await _send(resp, await finish(encoder), sse)
        if sse:
            m = stream.metrics
            usage = {"input_tokens": m.prompt_tokens if m else 0, "output_tokens": m.tokens if m else 0}
            usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
            await _sse(resp, {"type": "speech.audio.done", "usage": usage, "metrics": m.as_dict() if m else {}})
        await resp.write_eof()
        return resp
    except (LyreError, asyncio.CancelledError) as e:
        error = e if isinstance(e, LyreError) else cancelled_by_drain(request.app[INFLIGHT])
        if error is None:  # cancelled, not by the drain: nothing to tell anyone
            raise
        if resp is None:  # nothing sent yet: the status says it
            raise error from None
        # failed mid-stream: the status is sent; say so and end the body
        log.warning("speech stream ended early: %s", error)
        if sse:
            with contextlib.suppress(ConnectionResetError):
                await _sse(resp, {"type": "error", "error": error_body(error)})
        elif request.transport is not None:  # cut the body: an incomplete response, not a short file
            request.transport.close()
        return resp
    except ConnectionResetError:  # the client went away (its synthesis is cancelled below)
        log.debug("speech stream: the client disconnected")
        return resp
    finally:
        await stream.aclose()
        if encoder is not None:
            encoder.close()


async def _send(resp: web.StreamResponse, data: bytes, sse: bool) -> None:
    if not data:
        return
    if sse:
        await _sse(resp, {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    else:
        await resp.write(data)


async def _sse(resp: web.StreamResponse, event: dict) -> None:
    await resp.write(f"data: {json.dumps(event)}\n\n".encode())


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models`` as OpenAI answers it: the one model served (any name is accepted in requests)."""
    service = request.app[SERVICE]
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "lyre"}
        for name in dict.fromkeys(("lyre", service.config.model.hf_id, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"))]})


MODELS_CREATED = int(time.time())  # OpenAI's "created": when this server started
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


async def request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its request: the client's ``X-Request-Id`` when it sent a sane one,
    else a new one (OpenAI's clients, LiveKit's among them, read it)."""
    if "X-Request-Id" not in response.headers:
        sent = request.headers.get("X-Request-Id", "")
        response.headers["X-Request-Id"] = sent if REQUEST_ID.fullmatch(sent) else f"req_{uuid.uuid4().hex}"


async def stats(request: web.Request) -> web.Response:
    snapshot = request.app[SERVICE].stats()
    return web.json_response(snapshot.as_dict() if snapshot is not None else {})


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the engine runs, draining included (a draining server is alive)."""
    service = request.app[SERVICE]
    draining = request.app[INFLIGHT].draining
    body = {"status": "unavailable" if not service.ready else "draining" if draining else "ok",
            "model": service.model.source if service.model else None,
            "demo": bool(service.model and service.model.is_demo)}
    return web.json_response(body, status=200 if service.ready else 503)


async def ready(request: web.Request) -> web.Response:
    """Readiness, "send me new callers": 503 while draining, when admission is full, or not running."""
    service = request.app[SERVICE]
    inflight = request.app[INFLIGHT]
    reason = "draining" if inflight.draining or inflight.announced else service.readiness()
    s = service.stats()
    body = {"ready": reason is None, "reason": reason, "active_sessions": s.scheduler.active_sessions if s else 0,
            "pending_sessions": s.scheduler.pending_sessions if s else 0,
            "capacity": service.config.scheduler.max_concurrent_sessions,
            "capacity_utilisation": s.capacity_utilisation if s else 0.0}
    return web.json_response(body, status=200 if reason is None else 503)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SERVICE].metrics.exposition(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
