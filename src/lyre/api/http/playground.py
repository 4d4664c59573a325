"""The playground: a web page at ``GET /`` to try the server from a browser (``server.playground``,
on by default). Type text, pick a voice (``GET /v1/voices``: built-in and the account's cloned
ones), press speak, and hear it streamed over the WebSocket as raw PCM played by Web Audio at the
stream's sample rate, with the time to first audio, a level meter and cancel.

On a keyed server the page asks for an API key once, keeps it in a JavaScript variable only (never
in storage, a cookie or a URL), exchanges it for short-lived client tokens (``POST
/v1/auth/tokens``) and sends those: as ``Bearer`` on REST, as the subprotocol ``lyre-token.<token>``
on the WebSocket. Its own requests are same-origin ones, which :mod:`lyre.api.http.cors` lets
through when that is safe; a page served under a public name on a keyless server needs its origin
in ``server.cors_origins``.

The files in ``static/`` are served as they are: no build step, nothing fetched from elsewhere. The
page is for people, not an API: like FastAPI's docs pages it is not in ``/openapi.json``
(:data:`ROUTES` names what is left out).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from lyre.api.http.shared import error_response

STATIC = Path(__file__).with_name("static")
PAGE = "index.html"
ASSETS = {"playground.js": "text/javascript", "playground.css": "text/css"}  # /playground/<name>
ROUTES = frozenset({("GET", "/"), ("GET", "/playground/{name}")})  # (not in the OpenAPI document)

# The page loads only its own files and talks only to this server; no other site may frame it (a
# framed page could be made to take a key typed into it).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # (revalidated by its ETag: a new release's page is seen at once)
}


@dataclass(frozen=True)
class File:
    body: bytes
    content_type: str
    etag: str


def _load(name: str, content_type: str) -> File:
    path = STATIC / name
    try:
        body = path.read_bytes()
    except OSError as e:
        raise RuntimeError(f"the playground's file {path} cannot be read ({e}): reinstall Lyre (the package "
                           "ships lyre/api/http/static/), or set server.playground: false") from None
    return File(body, f"{content_type}; charset=utf-8", '"' + hashlib.sha256(body).hexdigest()[:20] + '"')


def routes(app: web.Application) -> None:
    """``GET /`` (the page) and ``GET /playground/{name}`` (its script and style sheet), read once."""
    files = {name: _load(name, ctype) for name, ctype in {PAGE: "text/html", **ASSETS}.items()}

    async def page(request: web.Request) -> web.Response:
        return _answer(request, files[PAGE])

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            return error_response(404, f"the playground has no file {name[:100]!r}", "not_found_error", "not_found")
        return _answer(request, files[name])

    app.router.add_get("/", page)
    app.router.add_get("/playground/{name}", asset)


def _answer(request: web.Request, file: File) -> web.Response:
    headers = {**HEADERS, "ETag": file.etag}
    if file.etag in (t.strip() for t in request.headers.get("If-None-Match", "").split(",")):
        return web.Response(status=304, headers=headers)
    return web.Response(body=file.body, headers={**headers, "Content-Type": file.content_type})
