"""Accounts: who a request is, from its API key.

Keys come from ``server.api_keys`` (key -> account), ``server.api_key`` (the single key of earlier
configs: account ``default``), the file ``server.api_keys_file`` and the environment's
``LYRE_API_KEYS`` (both: one ``<key> <account>`` per line, ``#`` comments). Anywhere, a key may be
given as ``sha256:<64 hex digits>``, the SHA-256 of the key, so that neither a config file, a
manifest nor a process's argv need hold a secret. With no key configured at all, every caller is
the account ``default``. A cloned voice belongs to the account that enrolled it, and no other
account can see it (404 everywhere: existence does not leak).

Keys are accepted only from ``Authorization: Bearer <key>`` (HTTP header or gRPC metadata), and
every configured key is compared in constant time (as SHA-256 digests, all of one length), so the
time taken says nothing about which key (or how much of one) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

from lyre.config import ConfigError, ServerConfig
from lyre.config.schema import API_KEYS_ENV
from lyre.trust.tokens import Grant, Tokens, configured_secret, looks_like_token

DEFAULT_ACCOUNT = "default"
HASHED = re.compile(r"sha256:([0-9a-fA-F]{64})")
_ACCOUNT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def _key_digest(key: str) -> bytes:
    """The digest a configured key is compared as: given as ``sha256:<hex>``, that; else the key's."""
    hashed = HASHED.fullmatch(key)
    return bytes.fromhex(hashed.group(1)) if hashed else _digest(key)


def _key_lines(text: str, where: str) -> dict[str, str]:
    keys = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            # the line may hold a key: say where, never what
            raise ConfigError(f"{where} line {n}: expected '<key> <account>' (two fields), found {len(parts)}")
        keys[parts[0]] = parts[1]
    return keys


def configured_keys(server: ServerConfig) -> dict[str, str]:
    """Every configured key (as given: the key or ``sha256:<hex>``) -> its account. ConfigError for
    an unreadable keys file, a malformed line or an account name that cannot be a metrics label."""
    keys = dict(server.api_keys)
    if server.api_key:
        keys.setdefault(server.api_key, DEFAULT_ACCOUNT)
    if server.api_keys_file:
        path = Path(server.api_keys_file)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"server.api_keys_file {path} cannot be read: {e}") from None
        keys.update(_key_lines(text, f"server.api_keys_file {path}"))
    if os.environ.get(API_KEYS_ENV):
        keys.update(_key_lines(os.environ[API_KEYS_ENV], f"the environment's {API_KEYS_ENV}"))
    for account in keys.values():
        if not _ACCOUNT.fullmatch(account):
            raise ConfigError(f"account name {account!r} is not allowed: 1-64 letters, digits and _.@- (it names "
                              "the account in metrics and the audit trail)")
    return keys


class Accounts:
    def __init__(self, server: ServerConfig):
        keys = configured_keys(server)
        self._tokens = [(_key_digest(key), account) for key, account in keys.items()]
        self.client_tokens = Tokens(configured_secret(server))  # short-lived tokens the keys mint
        # every account there is: the keys' (no key names "default" unless api_key does), else "default"
        self.names: tuple[str, ...] = tuple(sorted(set(keys.values()))) or (DEFAULT_ACCOUNT,)

    @property
    def required(self) -> bool:
        """Whether requests must carry a key."""
        return bool(self._tokens)

    def is_key(self, text: str) -> bool:
        """Whether ``text`` is one of the configured keys, or a client token (so that it is never
        logged or echoed)."""
        if looks_like_token(text):
            return True
        given = _digest(text)
        return any([hmac.compare_digest(given, token) for token, _ in self._tokens])

    def caller(self, authorization: str | None) -> tuple[str | None, Grant | None]:
        """Who an ``Authorization`` value is, checked once: (its account, the grant of its client
        token or None for an API key); (None, None) when it names no account (keys configured and
        none matches, or a token that is not valid: forged, expired, another secret's, or of an
        account this server does not have)."""
        scheme, _, key = (authorization or "").partition(" ")
        if looks_like_token(key):
            grant = self.client_tokens.verify(key) if scheme == "Bearer" else None
            if grant is None or grant.account not in self.names:
                return None, None
            return grant.account, grant
        return self.account(authorization), None

    def account(self, authorization: str | None) -> str | None:
        """The account an ``Authorization`` value names (an API key's, or a client token's); None
        when keys are configured and it names none of them, or it holds a token that is not valid
        (:meth:`caller`). Every key is compared, whatever matched."""
        scheme, _, key = (authorization or "").partition(" ")
        if looks_like_token(key):
            return self.caller(authorization)[0]
        if not self._tokens:
            return DEFAULT_ACCOUNT
        given, found = _digest(key), None
        for token, account in self._tokens:
            if hmac.compare_digest(given, token):
                found = account
        return found if scheme == "Bearer" else None
