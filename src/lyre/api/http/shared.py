"""What the HTTP handlers share: the application's keys (the service, the requests in flight, the
request's account), the error responses, the drain check and the JSON body."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from lyre.api.common import InFlight, classify, error_body, json_object, retry_after
from lyre.errors import ServiceUnavailable
from lyre.service.tts import TTSService

SERVICE = web.AppKey("service", TTSService)
INFLIGHT = web.AppKey("inflight", InFlight)
MAX_BODY = web.AppKey("max_body", int)
ACCOUNT = web.RequestKey("account", str)  # the account the request's API key names


def error_response(status: int, message: str, type_: str, code: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": type_, "code": code}}, status=status,
                             headers=headers)


def lyre_error_response(e: Exception) -> web.Response:
    wait = retry_after(e)
    return web.json_response({"error": error_body(e)}, status=classify(e).http_status,
                             headers={"Retry-After": wait} if wait else None)


async def json_body(request: web.Request) -> dict[str, Any]:
    limit = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    return json_object(await request.read(), "the request body")


def draining(request: web.Request) -> None:
    """Refuse a new request once the server drains (503)."""
    if request.app[INFLIGHT].draining:
        raise ServiceUnavailable("the server is shutting down")
