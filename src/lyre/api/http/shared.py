"""What the HTTP handlers share: the application's keys (the service, the requests in flight, the
request's account), the error responses, the drain check and the JSON body."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from lyre.api.access import AccessLog, Entry
from lyre.api.common import InFlight, classify, error_body, json_object, retry_after
from lyre.errors import InvalidRequest, LyreError, ServiceUnavailable, UnsupportedMediaType, shorten
from lyre.service.tts import TTSService

SERVICE = web.AppKey("service", TTSService)
INFLIGHT = web.AppKey("inflight", InFlight)
MAX_BODY = web.AppKey("max_body", int)
ACCOUNT = web.RequestKey("account", str)  # the account the request's API key names
ACCESS = web.RequestKey("access", Entry)  # the request's line of the access log
ACCESS_LOG = web.AppKey("access_log", AccessLog)


def error_response(status: int, message: str, type_: str, code: str, headers: dict | None = None) -> web.Response:
    response = web.json_response({"error": {"message": message, "type": type_, "code": code}}, status=status,
                                 headers=headers)
    response["code"] = code  # (for the access log)
    return response


def lyre_error_response(e: Exception) -> web.Response:
    wait = retry_after(e)
    body = error_body(e)
    response = web.json_response({"error": body}, status=classify(e).http_status,
                                 headers={"Retry-After": wait} if wait else None)
    response["code"] = body["code"]
    return response


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object. Its Content-Type must say JSON: a web page can send any other
    type cross-origin without asking first (a CORS "simple" request), never this one."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise UnsupportedMediaType(f"send the body as JSON with 'Content-Type: application/json' (got "
                                   f"{shorten(request.headers.get('Content-Type', 'none'))})")
    limit = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    return json_object(await request.read(), "the request body")


@contextlib.contextmanager
def multipart_errors() -> Iterator[None]:
    """Whatever aiohttp's multipart reader raises on a malformed body (bad part headers, a bad
    boundary, an unknown charset, ...) is the client's doing: InvalidRequest (400), never a 500."""
    try:
        yield
    except (LyreError, web.HTTPException, ConnectionError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - the parser's own errors, of many types
        raise InvalidRequest(f"the body is not valid multipart/form-data: {type(e).__name__}: {e}") from None


def draining(request: web.Request) -> None:
    """Refuse a new request once the server drains (503)."""
    if request.app[INFLIGHT].draining:
        raise ServiceUnavailable("the server is shutting down")
