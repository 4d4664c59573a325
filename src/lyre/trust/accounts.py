"""Accounts: who a request is, from its API key.

``server.api_keys`` maps API keys to account names; ``server.api_key`` (the single key of earlier
configs) is one more key, of the account ``default``. With no key configured at all, every caller
is the account ``default``. A cloned voice belongs to the account that enrolled it, and no other
account can see it (404 everywhere: existence does not leak).

Keys are accepted only from ``Authorization: Bearer <key>`` (HTTP header or gRPC metadata), and
every configured key is compared in constant time, so the time taken says nothing about which key
(or how much of one) matched.
"""

from __future__ import annotations

import hashlib
import hmac

from lyre.config import ServerConfig

DEFAULT_ACCOUNT = "default"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class Accounts:
    def __init__(self, server: ServerConfig):
        keys = dict(server.api_keys)
        if server.api_key:
            keys.setdefault(server.api_key, DEFAULT_ACCOUNT)
        # compared as sha256 digests: equal lengths, so not even a key's length shows in the timing
        self._tokens = [(_digest(f"Bearer {key}"), account) for key, account in keys.items()]

    @property
    def required(self) -> bool:
        """Whether requests must carry a key."""
        return bool(self._tokens)

    def account(self, authorization: str | None) -> str | None:
        """The account an ``Authorization`` value names; None when keys are configured and it names
        none of them. Every key is compared, whatever matched."""
        if not self._tokens:
            return DEFAULT_ACCOUNT
        given = _digest(authorization or "")
        found = None
        for token, account in self._tokens:
            if hmac.compare_digest(given, token):
                found = account
        return found
