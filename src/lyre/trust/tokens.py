"""Short-lived client tokens: what a browser (or any client that must not hold a long-lived API
key) authenticates with, the convention of realtime speech APIs (OpenAI's client secrets,
ElevenLabs' single-use tokens, Deepgram's grants, Cartesia's access tokens).

``POST /v1/auth/tokens``, authenticated with an API key, mints one: bound to the key's account,
valid to *start* a request or connection until it expires (60 s by default, at most 600), and
optionally scoped to some voices and to a longest session. A token is
``lyre_t.<payload>.<signature>``: the payload (base64url JSON: account, expiry, scope, a nonce)
signed with HMAC-SHA256 under ``server.token_secret``, so any replica that shares the secret
accepts it and none keeps state. Without a configured secret each process draws one at start, and
its tokens are good on that process only.

A token is accepted wherever an API key is (``Authorization: Bearer``, gRPC metadata) and, on the
WebSocket, in the URL (``?token=``) or as a subprotocol (``lyre-token.<token>``), which a browser
can set; an API key is never accepted in a URL. Tokens, like keys, never reach a log.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from lyre.config import ConfigError, ServerConfig

log = logging.getLogger("lyre.auth")

PREFIX = "lyre_t."
SUBPROTOCOL = "lyre-token."  # a WebSocket subprotocol carrying a token (a browser cannot set headers)
SECRET_ENV = "LYRE_TOKEN_SECRET"
DEFAULT_TTL_S = 60.0
MAX_TTL_S = 600.0
MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class Scope:
    """What a token allows beyond its account's own limits: None is no narrowing."""

    voices: tuple[str, ...] | None = None  # the voices it may speak (built-in names, cloned voices' ids)
    max_session_s: float | None = None  # how long a WebSocket it opens may stay open

    def as_dict(self) -> dict:
        return {"voices": list(self.voices) if self.voices is not None else None, "max_session_s": self.max_session_s}


@dataclass(frozen=True)
class Grant:
    account: str
    expires_at: float  # (UNIX seconds) after this it starts nothing
    scope: Scope


# What a client token may do at all, whatever its scope: speak, and see the voices and models (REST
# routes and gRPC methods); never manage voices, read consent records or stats, verify or mint tokens.
TOKEN_ROUTES = frozenset({("POST", "/v1/audio/speech"), ("GET", "/v1/audio/stream"), ("GET", "/v1/voices"),
                          ("GET", "/v1/models"), ("GET", "/v1/models/{model}")})
TOKEN_METHODS = frozenset({"lyre.v1.TextToSpeech/Synthesize", "lyre.v1.TextToSpeech/SynthesizeStream",
                           "lyre.v1.TextToSpeech/StreamingSynthesize", "lyre.v1.TextToSpeech/ListVoices",
                           "nvidia.riva.tts.RivaSpeechSynthesis/Synthesize",
                           "nvidia.riva.tts.RivaSpeechSynthesis/SynthesizeOnline",
                           "nvidia.riva.tts.RivaSpeechSynthesis/GetRivaSynthesisConfig"})
NOT_FOR_TOKENS = "a client token may only speak (and list voices and models): do this with an API key"

# the scope of the token the current request or call authenticated with (None: an API key, or none)
SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("lyre_token_scope", default=None)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def looks_like_token(text: str | None) -> bool:
    return bool(text) and text.startswith(PREFIX)


def configured_secret(server: ServerConfig) -> bytes | None:
    """``server.token_secret``, the file ``server.token_secret_file`` or the environment's
    ``LYRE_TOKEN_SECRET`` (the first set); ConfigError when it is unreadable or too short."""
    if server.token_secret:
        secret, where = server.token_secret, "server.token_secret"
    elif server.token_secret_file:
        where = f"server.token_secret_file {server.token_secret_file}"
        try:
            secret = Path(server.token_secret_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where} cannot be read: {e}") from None
    elif os.environ.get(SECRET_ENV):
        secret, where = os.environ[SECRET_ENV].strip(), f"the environment's {SECRET_ENV}"
    else:
        return None
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where} is too short: at least {MIN_SECRET_BYTES} bytes (e.g. openssl rand -hex 32)")
    return secret.encode()


class Tokens:
    def __init__(self, secret: bytes | None = None, clock=time.time):
        if secret is None:
            log.info("client tokens are signed with a secret drawn at start: a token is good on this process only "
                     "(set server.token_secret, or %s, on replicas that should share them)", SECRET_ENV)
            secret = secrets.token_bytes(32)
        self._key = hashlib.sha256(b"lyre client tokens\0" + secret).digest()  # (never the configured text itself)
        self.clock = clock

    def mint(self, account: str, ttl_s: float = DEFAULT_TTL_S, scope: Scope = Scope()) -> tuple[str, Grant]:
        grant = Grant(account, self.clock() + min(ttl_s, MAX_TTL_S), scope)
        claims = {"a": account, "e": round(grant.expires_at, 3), "v": scope.voices, "s": scope.max_session_s,
                  "n": secrets.token_urlsafe(9)}
        body = PREFIX + _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{body}.{_b64(self._sign(body))}", grant

    def verify(self, token: str) -> Grant | None:
        """The grant ``token`` carries, or None: not a token, not signed with this secret, or expired."""
        if not looks_like_token(token):
            return None
        body, _, signature = token.rpartition(".")
        try:
            valid = hmac.compare_digest(_unb64(signature), self._sign(body))
            claims = json.loads(_unb64(body[len(PREFIX):])) if valid else None
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(claims, dict) or not isinstance(claims.get("e"), (int, float)) or claims["e"] < self.clock():
            return None
        voices = claims.get("v")
        return Grant(str(claims["a"]), float(claims["e"]), Scope(tuple(voices) if voices is not None else None,
                                                                  claims.get("s")))

    def _sign(self, body: str) -> bytes:
        return hmac.new(self._key, body.encode(), hashlib.sha256).digest()
