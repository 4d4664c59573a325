"""Cross-origin requests from browsers (``server.cors_origins``).

A request that carries an ``Origin`` header (a browser's, for a cross-origin fetch, a POST, or any
WebSocket) is served only when that origin is on the allow-list; any other is refused with 403
before any work is done, "simple" requests (a
``text/plain`` POST a page can send without a preflight) and WebSocket handshakes included. A
request without ``Origin`` is no browser's cross-origin request: CORS does not apply to it.

A page this server served itself (the playground at ``/``: :mod:`lyre.api.http.playground`) sends
``Origin`` too, on its POSTs and its WebSocket. Such a same-origin request (``Origin`` equal to the
request's own ``scheme://Host``) is served without being listed when that is safe against DNS
rebinding, where an attacker's page, under the attacker's own name pointed at this server's
address, looks same-origin: when the server has API keys (that page has no key), or when the
``Host`` is an IP address or ``localhost`` (a rebinding page's ``Host`` is the attacker's name). A
keyless server reached under a name (``http://tts.internal:8000``), or behind a proxy that ends TLS
(the page's ``https`` origin against the proxied ``http`` request), needs that origin in
``server.cors_origins``. The same holds for a browser's reads of ``/v1/`` that carry no ``Origin``
(a same-origin GET): on a keyless server, a request with ``Sec-Fetch-Site`` (every current browser
sends it; other clients do not) under a ``Host`` name that is not listed is refused, so that a
rebinding page cannot read the voices and consent records either.

Preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered here, before the API
key is asked for (a browser sends none with them), with the methods the route accepts and the
headers a client may send; allowed responses (errors and streams included) name the origin and
expose the headers clients read. ``*`` allows every origin, and only on a server without API keys
(:func:`lyre.config.checks.check` refuses it otherwise): a page anywhere can then spend the
server's capacity, which a warning says at start.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from urllib.parse import urlsplit

from aiohttp import web

from lyre.api.http.shared import error_response

log = logging.getLogger("lyre.http")

ALLOWED = web.RequestKey("cors_origin", str)  # the request's allowed (cross-)origin, to be named in its answer
REQUEST_HEADERS = ("Authorization", "Content-Type", "X-Request-Id")  # what a page may send
EXPOSED = ("X-Request-Id", "Retry-After", "X-Sample-Rate", "Location")  # what a page may read
MAX_AGE_S = 600  # how long a browser may keep a preflight's answer
HOST = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")  # a Host header a browser sends


class Cors:
    def __init__(self, origins: tuple[str, ...], keyed: bool = False):
        self.keyed = keyed  # the server has API keys (server.api_keys, server.api_key)
        self.everyone = "*" in origins
        self.origins = frozenset(o.rstrip("/").lower() for o in origins if o != "*")
        if self.everyone:
            log.warning("server.cors_origins has '*': any web page can make this server synthesize (it has no API "
                        "keys); list the pages' origins instead")

    def allows(self, origin: str) -> bool:
        return self.everyone or origin.rstrip("/").lower() in self.origins

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        origin = request.headers.get("Origin")
        if origin is None:
            if self.rebound_read(request):
                return error_response(403, f"a browser's request under the name {request.host[:200]!r} (list "
                                      f"'{request.scheme}://{request.host[:200]}' in server.cors_origins)",
                                      "invalid_request_error", "origin_not_allowed")
            return await handler(request)
        if not self.allows(origin):
            if self.own_page(request, origin):
                return await handler(request)  # (same-origin: no CORS headers needed)
            return error_response(403, f"origin {origin[:200]!r} is not allowed (server.cors_origins)",
                                  "invalid_request_error", "origin_not_allowed", headers={"Vary": "Origin"})
        request[ALLOWED] = origin
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return self._preflight(request, origin)
        return await handler(request)

    def rebound_read(self, request: web.Request) -> bool:
        """A browser's same-origin read of the API (a GET sends no ``Origin``) that DNS rebinding could have
        made: on a keyless server, under a ``Host`` name that is not listed (a browser says it is one by
        its ``Sec-Fetch-Site`` header; other clients send none). The page at ``/`` itself stays open."""
        if self.keyed or self.everyone or "Sec-Fetch-Site" not in request.headers:
            return False
        if not request.path.startswith("/v1/"):
            return False
        host = request.headers.get("Host", "")
        return not (not_rebindable(host) or self.allows(f"{request.scheme}://{host}"))

    def own_page(self, request: web.Request, origin: str) -> bool:
        """Whether ``origin`` is the request's own ``scheme://Host`` and that is safe to trust: a
        keyed server, or a ``Host`` that no DNS rebinding can put there (an IP address, ``localhost``)."""
        host = request.headers.get("Host", "")
        if not host or origin.rstrip("/").lower() != f"{request.scheme}://{host}".lower():
            return False
        return self.keyed or not_rebindable(host)

    def _preflight(self, request: web.Request, origin: str) -> web.Response:
        """The methods the route accepts (404 for no route: there is nothing to ask about)."""
        problem = getattr(request.match_info, "http_exception", None)
        if isinstance(problem, web.HTTPMethodNotAllowed):
            methods = sorted(set(problem.allowed_methods) | {"OPTIONS"})
        elif problem is None:  # (a route that answers OPTIONS itself: none does today)
            methods = [request.method]
        else:
            return error_response(404, "no such route", "not_found_error", "not_found", headers={"Vary": "Origin"})
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Allow-Methods": ", ".join(methods),
            "Access-Control-Allow-Headers": ", ".join(REQUEST_HEADERS),
            "Access-Control-Max-Age": str(MAX_AGE_S)})


def not_rebindable(host: str) -> bool:
    """Whether a ``Host`` header's name is one DNS cannot point elsewhere: an IP address (v4, or v6
    in brackets) or ``localhost``."""
    if HOST.fullmatch(host) is None:  # (what a browser sends: a name or an address, and a port)
        return False
    try:
        name = urlsplit("//" + host).hostname or ""
        if name != "localhost":
            ipaddress.ip_address(name)
    except ValueError:  # (a name, or brackets around no IPv6 address)
        return False
    return True


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """An allowed cross-origin request's answer (any status, a stream or a WebSocket's handshake too)
    names its origin, so the page may read it, and the headers the page may read."""
    origin = request.get(ALLOWED)
    if origin is not None and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = ", ".join(EXPOSED)
        response.headers.add("Vary", "Origin")
