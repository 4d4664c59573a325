"""The HTTP application (aiohttp): its routes and middlewares. Front ends parse, validate and encode
audio; no model logic lives here.

- ``POST /v1/audio/speech``: OpenAI's speech endpoint (:mod:`lyre.api.http.speech`).
- voices (built-in and each account's cloned voices: :mod:`lyre.api.http.voices`; OpenAI's
  ``/v1/audio/voices`` and ``/v1/audio/voice_consents``: :mod:`lyre.api.http.openai_voices`), ``GET /v1/models``
  (as OpenAI's), ``/v1/stats``, ``/health``, ``/metrics``, ``/openapi.json`` (the
  OpenAPI 3.1 document of all of these, :mod:`lyre.api.http.openapi`).
- ``GET /v1/audio/stream``: the WebSocket (:mod:`lyre.api.http.ws`).
- ``GET /``: the playground, a page to try the server from a browser (:mod:`lyre.api.http.playground`;
  ``server.playground``).

Every response carries ``X-Request-Id``: the client's, when it sent a sane one, else a new one.

Errors are JSON ``{"error": {"message", "type", "code"}}`` with a fitting 4xx/5xx status. With
API keys configured (``server.api_keys``, ``server.api_key``), ``/v1/`` needs ``Authorization:
Bearer <key>`` (compared in constant time); the key names the request's account
(``request[ACCOUNT]``), which owns the cloned voices it enrolls.
Each client address may hold ``server.max_connections_per_client`` requests and sockets at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from lyre.api.access import CURRENT, AccessLog, Entry, new_request_id, request_id
from lyre.api.common import InFlight
from lyre.api.http import batches, lexicons, openai_voices, playground, verify, voices
from lyre.api.http.cors import Cors, cors_headers
from lyre.api.http.openapi import document
from lyre.api.http.shared import (
    ACCESS,
    ACCESS_LOG,
    ACCOUNT,
    INFLIGHT,
    MAX_BODY,
    SERVICE,
    error_response,
    lyre_error_response,
)
from lyre.api.http.speech import speech
from lyre.api.http.tokens import GRANT, mint_token, url_token
from lyre.api.http.ws import WEBSOCKET, websocket
from lyre.audio.formats import AudioFormatError
from lyre.errors import LyreError, shorten
from lyre.service.tts import TTSService
from lyre.trust.accounts import Accounts
from lyre.trust.tokens import NOT_FOR_TOKENS, SCOPE, TOKEN_ROUTES

log = logging.getLogger("lyre.http")


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


def access_middleware(access: AccessLog, accounts: Accounts):
    """The access log's line of every request (:mod:`lyre.api.access`), written when it ends (a
    stream's, or a WebSocket's, at its end), and its request id, sent back in ``X-Request-Id``."""

    @web.middleware
    async def middleware(request: web.Request, handler):
        resource = request.match_info.route.resource
        entry = Entry("rest", f"{request.method} {resource.canonical if resource is not None else '(no route)'}",
                      request.app[INFLIGHT].address(request.remote, request.headers.get("X-Forwarded-For")),
                      request_id(request.headers.get("X-Request-Id"), request.headers.get("Authorization"),
                                 accounts.is_key))
        request[ACCESS] = entry
        CURRENT.set(entry)
        response = None
        try:
            response = await handler(request)
            return response
        except web.HTTPException as e:
            entry.status = e.status
            raise
        except asyncio.CancelledError:
            entry.status = 499  # the client went away (or the drain's timeout passed)
            raise
        except BaseException:
            entry.status = 500
            raise
        finally:
            if response is not None:
                entry.status, entry.code = response.status, response.get("code")
                entry.bytes += response.body_length if response.prepared else (response.content_length or 0)
            entry.account = request.get(ACCOUNT)
            access.write(entry)

    return middleware


IDENTITY = ("", "identity")


def auth_middleware(accounts: Accounts):
    @web.middleware
    async def middleware(request: web.Request, handler):
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding not in IDENTITY:  # aiohttp would try to inflate it: a plain body then failed as a 500
            return error_response(415, f"Content-Encoding {shorten(encoding)} is not supported: send the body "
                                  "unencoded", "invalid_request_error", "unsupported_content_encoding")
        if len(request.headers.getall("Authorization", [])) > 1:  # which one would be the caller?
            return error_response(400, "send one Authorization header, not several", "invalid_request_error",
                                  "duplicate_authorization")
        if request.path.startswith("/v1/"):
            authorization = request.headers.get("Authorization")
            if authorization is None and request.path == WEBSOCKET:
                authorization, refusal = url_token(request)  # a browser's WebSocket cannot send the header
                if refusal is not None:
                    return error_response(401, refusal, "authentication_error", "unauthorized")
            account, grant = accounts.caller(authorization)
            if account is None:
                return error_response(401, "missing, wrong or expired API key or token (Authorization: Bearer "
                                      "<key or token>)", "authentication_error", "unauthorized")
            request[ACCOUNT] = account
            if grant is not None:
                resource = request.match_info.route.resource
                if (request.method, resource.canonical if resource is not None else "") not in TOKEN_ROUTES:
                    return error_response(403, NOT_FOR_TOKENS, "permission_error", "not_permitted")
                request[GRANT] = grant
            SCOPE.set(grant.scope if grant is not None else None)  # (what the request's voices are checked against)
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
    cfg = service.config.server
    access = AccessLog(cfg.access_log)
    cors = Cors(cfg.cors_origins, keyed=service.accounts.required)
    app = web.Application(client_max_size=cfg.max_body_bytes,
                          middlewares=[access_middleware(access, service.accounts), cors.middleware, errors_middleware,
                                       auth_middleware(service.accounts), clients_middleware])
    app[ACCESS_LOG] = access
    app[SERVICE] = service
    app[INFLIGHT] = inflight
    app[MAX_BODY] = cfg.max_body_bytes
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get(WEBSOCKET, websocket)
    app.router.add_post("/v1/auth/tokens", mint_token)
    voices.routes(app)
    lexicons.routes(app)
    batches.routes(app)
    openai_voices.routes(app)  # OpenAI's audio.voices and audio.voice_consents
    verify.routes(app)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)  # (a checkpoint id holds a slash)
    app.on_response_prepare.append(request_id_header)
    app.on_response_prepare.append(cors_headers)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    if cfg.playground:
        playground.routes(app)
    return app


# --------------------------------------------------------------------------------------------
# REST


def _models(service: TTSService) -> list[dict]:
    return [{"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "lyre"}
            for name in dict.fromkeys(("lyre", service.config.model.hf_id, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"))]


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models`` as OpenAI answers it: the one model served (any name is accepted in requests)."""
    return web.json_response({"object": "list", "data": _models(request.app[SERVICE])})


async def model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}`` (OpenAI's ``models.retrieve``): one of those names, or 404."""
    name = request.match_info["model"]
    found = next((m for m in _models(request.app[SERVICE]) if m["id"] == name), None)
    if found is None:
        return error_response(404, f"no model {shorten(name)}: GET /v1/models lists them", "not_found_error",
                              "model_not_found")
    return web.json_response(found)


MODELS_CREATED = int(time.time())  # OpenAI's "created": when this server started


async def request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its request: the client's ``X-Request-Id`` when it sent a sane one (not
    an API key), else a new one (OpenAI's clients, LiveKit's among them, read it); the access log's."""
    if "X-Request-Id" not in response.headers:
        entry = request.get(ACCESS)
        response.headers["X-Request-Id"] = entry.request_id if entry is not None else new_request_id()


async def stats(request: web.Request) -> web.Response:
    """The server's load; the engine's and codec's figures (which move with other accounts' requests:
    a cloned voice's prefill shows its clip's length) only for an operator account."""
    service, account = request.app[SERVICE], request[ACCOUNT]
    snapshot = service.stats()
    if snapshot is None:
        return web.json_response({})
    body = snapshot.as_dict(None if service.sees_all(account) else account)
    if "account" in body:
        body["account"].update(service.quotas.usage(account))  # its WebSocket contexts, enrollments, verifies
    return web.json_response(body)


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
    """Prometheus' figures of every account: with several accounts, only for an operator account's key."""
    service = request.app[SERVICE]
    account, grant = service.accounts.caller(request.headers.get("Authorization"))
    if not service.sees_all(account or "") or (grant is not None and len(service.accounts.names) > 1):
        return error_response(403 if account else 401, "/metrics shows every account's figures: it needs the key "
                              "(not a client token) of an account in server.operator_accounts",
                              "authentication_error", "forbidden" if account else "unauthorized")
    return web.Response(body=request.app[SERVICE].metrics.exposition(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
