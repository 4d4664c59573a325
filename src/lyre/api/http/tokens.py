"""``POST /v1/auth/tokens``: an API key mints a short-lived client token (:mod:`lyre.trust.tokens`)
for a browser or another client that must not hold the key; and the WebSocket's token in its URL."""

from __future__ import annotations

from aiohttp import web

from lyre.api.http.shared import ACCOUNT, SERVICE, json_body
from lyre.service.options import TokenRequest, parse
from lyre.storage.registry import Voice
from lyre.trust.tokens import SUBPROTOCOL, Grant, Scope, looks_like_token

GRANT = web.RequestKey("grant", Grant)  # the client token the request authenticated with, if any

NO_KEYS_IN_URLS = ("API keys are not accepted in URLs (they would sit in logs and browser histories): exchange "
                   "one for a short-lived token (POST /v1/auth/tokens) and pass ?token=<token>")


async def mint_token(request: web.Request) -> web.Response:
    """A token of the key's account, valid ``expires_in_s`` to start a request or connection, narrowed
    to ``voices`` and ``max_session_s`` when given (each voice checked now, as the account sees it)."""
    service, account = request.app[SERVICE], request[ACCOUNT]
    body = parse(TokenRequest, await json_body(request) if request.body_exists else {})
    voices = None
    if body.voices is not None:
        resolved = [await service.voices.resolve(name, account) for name in body.voices]
        voices = tuple(dict.fromkeys(v.id if isinstance(v, Voice) else v for v in resolved))
    token, grant = service.accounts.client_tokens.mint(account, body.expires_in_s, Scope(voices, body.max_session_s))
    return web.json_response({"token": token, "expires_at": int(grant.expires_at), "expires_in_s": body.expires_in_s,
                              "account": account, **grant.scope.as_dict()}, status=201,
                             headers={"Cache-Control": "no-store"})


def token_protocol(request: web.Request) -> str | None:
    """The WebSocket subprotocol offered that carries a token (``lyre-token.<token>``), if any."""
    offered = (p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(","))
    return next((p for p in offered if p.startswith(SUBPROTOCOL)), None)


def url_token(request: web.Request) -> tuple[str | None, str | None]:
    """A WebSocket's token from its URL (``?token=``) or its subprotocols (``lyre-token.<token>``), as
    an Authorization value; or why it is refused (an API key there)."""
    query = request.query
    if "api_key" in query or "key" in query:
        return None, NO_KEYS_IN_URLS
    token = query.get("token")
    if token is None and (protocol := token_protocol(request)) is not None:
        token = protocol[len(SUBPROTOCOL):]
    if token is None:
        return None, None
    if not looks_like_token(token):
        return None, NO_KEYS_IN_URLS
    return f"Bearer {token}", None
