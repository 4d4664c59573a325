"""``TTSService.lexicons``: each account's pronunciation lexicons (W3C PLS, :mod:`lyre.text.pls`).

    lexicon = await tts.lexicons.create(open("brands.pls").read(), name="brands", default=True)
    async for chunk in tts.stream("Lyre ships today.", lexicons=[lexicon.id]): ...

A request names the lexicons it reads (``lexicons: [ids]``, applied in that order: the first that
names a grapheme wins); one that names none reads the account's default lexicons. Their ``<alias>``
entries replace whole words before the text is normalised; the caller's text is still what timestamps
and the audit trail refer to. Phoneme-only entries are kept and counted (``unused_phonemes``): no
model family served here reads phonemes.

Lexicons live in the voices' database, isolated per account; each is at most
``voices.max_lexicon_bytes`` and an account holds at most ``voices.max_lexicons_per_account``.
Creating and deleting one writes an audit row (voice ``lexicon:<id>``, outcome ``lexicon_created`` /
``lexicon_deleted``, the document's sha256 as its text's).

A request reads the account's lexicons from a cache refreshed every :data:`REFRESH_S` (a lexicon
another replica created or deleted counts from then). A refresh reads the database in a worker
thread while requests go on with the copy they have, so a slow or unreachable database never holds
up the event loop; only an account's first request on this server reads it on the calling thread
(a failed read is remembered for :data:`REFRESH_S`: an outage costs one wait, not one per request).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from lyre.errors import DatabaseError, InvalidRequest, ServiceUnavailable, UploadTooLarge
from lyre.service.voices import Voices
from lyre.storage.lexicons import LexiconRegistry, StoredLexicon, unknown_lexicon
from lyre.storage.registry import check_name
from lyre.text import pls
from lyre.trust.accounts import DEFAULT_ACCOUNT

log = logging.getLogger("lyre.voices")

REFRESH_S = 5.0
MAX_TABLES = 1024  # alias tables kept (cleared when full)
LABEL = "a name for the lexicon"


class Lexicons:
    def __init__(self, voices: Voices, audit: Any = None):
        self.voices = voices
        self.audit = audit  # the service's AuditTrail (set once it starts)
        self._store: LexiconRegistry | None = None
        self._lock = threading.Lock()
        # account -> (when read, [(id, sha256, default, parsed)] oldest first)
        # (None: the account's first read failed)
        self._cache: dict[str, tuple[float, list[tuple[str, str, bool, pls.Lexicon]] | None]] = {}
        self._refreshing: set[str] = set()  # accounts a worker thread is reading again
        self._tables: dict[tuple[int, ...], tuple[list[pls.Lexicon], pls.Aliases]] = {}  # built alias tables

    def _registry(self) -> LexiconRegistry:
        registry = self.voices.registry
        if registry is None:
            raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
        if self._store is None or self._store.engine is not registry.engine:
            self._store = LexiconRegistry(registry.engine, self.voices.config.voices.max_lexicons_per_account)
        return self._store

    async def create(self, document: Any, *, name: Any, default: bool = False, account: str = DEFAULT_ACCOUNT,
                     protocol: str = "library") -> StoredLexicon:
        """A new lexicon of ``account`` from a PLS document. InvalidRequest naming the line of what is
        not valid PLS, UploadTooLarge past voices.max_lexicon_bytes, TooManyLexicons."""
        registry = self._registry()
        name = check_name(name, LABEL)
        if not isinstance(document, str):
            raise InvalidRequest("'pls' must be the PLS document, as a string")
        most = self.voices.config.voices.max_lexicon_bytes
        size = len(document.encode("utf-8", "surrogatepass"))
        if size > most:
            raise UploadTooLarge(f"the lexicon has {size} bytes; at most {most} are accepted (voices.max_lexicon_bytes)")
        try:
            lexicon = await asyncio.to_thread(pls.parse, document)
        except pls.PlsError as e:
            raise InvalidRequest(f"not a valid PLS lexicon: {e}") from None
        digest = hashlib.sha256(document.encode("utf-8")).hexdigest()
        stored = await asyncio.to_thread(registry.add, owner=account, name=name, language=lexicon.language[:64],
                                         pls=document, sha256=digest, aliases=lexicon.aliases,
                                         phonemes=lexicon.phonemes, default=bool(default))
        self._audit(account, stored, "lexicon_created", protocol)
        await self._reread(account)
        return stored

    async def get(self, lexicon_id: Any, account: str = DEFAULT_ACCOUNT, with_pls: bool = False) -> StoredLexicon:
        return await asyncio.to_thread(self._registry().get, lexicon_id, account, with_pls)

    async def list(self, account: str = DEFAULT_ACCOUNT) -> list[StoredLexicon]:
        """Oldest first."""
        return await asyncio.to_thread(self._registry().list, account)

    async def delete(self, lexicon_id: Any, account: str = DEFAULT_ACCOUNT, protocol: str = "library") -> None:
        stored = await asyncio.to_thread(self._registry().delete, lexicon_id, account)
        self._audit(account, stored, "lexicon_deleted", protocol)
        await self._reread(account)

    # --- requests -------------------------------------------------------------------------------

    def aliases(self, account: str, ids: list[str] | None) -> pls.Aliases | None:
        """The aliases a request of ``account`` reads: its ``ids`` in order, or (None) the account's
        defaults; None when there are none. UnknownLexicon for an id that is not the account's."""
        if self.voices.registry is None:
            if ids:
                raise ServiceUnavailable("the service is not running (use `async with TTSService...`)")
            return None
        try:
            held = self._held(account)
        except DatabaseError:
            if ids:  # (named: refused, 503, rather than read without them)
                raise
            log.warning("account %s: its default lexicons cannot be read (the database is unavailable); speaking "
                        "without them", account)
            return None
        if ids is None:
            chosen = [lex for _, _, default, lex in held if default]
        else:
            by_id = {i: lex for i, _, _, lex in held}
            missing = next((i for i in ids if i not in by_id), None)
            if missing is not None:
                raise unknown_lexicon(missing)
            chosen = [by_id[i] for i in dict.fromkeys(ids)]
        return self._table(chosen)

    def _table(self, chosen: list[pls.Lexicon]) -> pls.Aliases | None:
        """The aliases of ``chosen`` in order, built once per choice of parsed lexicons (not per request)."""
        if not chosen:
            return None
        key = tuple(id(lex) for lex in chosen)  # (a lexicon read again is a new object: a new key)
        with self._lock:
            table = self._tables.get(key)
            if table is None:
                if len(self._tables) >= MAX_TABLES:
                    self._tables.clear()
                table = self._tables[key] = (chosen, pls.Aliases(chosen))  # (holds chosen: its ids stay theirs)
        return table[1] if table[1] else None

    def _held(self, account: str) -> list[tuple[str, str, bool, pls.Lexicon]]:
        """The account's lexicons, oldest first, from the cache (a stale copy while a worker thread reads
        them again). DatabaseError when they could never be read."""
        with self._lock:
            cached = self._cache.get(account)
            refresh = (cached is not None and time.monotonic() - cached[0] >= REFRESH_S
                       and account not in self._refreshing)
            if refresh:
                self._refreshing.add(account)
        if refresh:
            threading.Thread(target=self._refresh, args=(account,), name="lyre-lexicons", daemon=True).start()
        held = self._read(account) if cached is None else cached[1]
        if held is None:
            raise DatabaseError("the account's lexicons cannot be read: the database is unavailable")
        return held

    def _read(self, account: str) -> list[tuple[str, str, bool, pls.Lexicon]]:
        """Read the account's lexicons into the cache (blocking). On DatabaseError the cache keeps what
        it held (or notes the failure) until the next refresh is due."""
        registry = self._registry()
        with self._lock:
            cached = self._cache.get(account)
        known = {i: lex for i, _, _, lex in (cached[1] or [])} if cached is not None else {}
        try:
            fresh = []
            for row in registry.list(account):
                lexicon = known.get(row.id)
                if lexicon is None:  # (new here: read and parsed once)
                    lexicon = pls.parse(registry.get(row.id, account, with_pls=True).pls)
                fresh.append((row.id, row.sha256, row.default, lexicon))
        except DatabaseError:
            with self._lock:
                held = self._cache.get(account)
                self._cache[account] = (time.monotonic(), held[1] if held is not None else None)
            raise
        with self._lock:
            self._cache[account] = (time.monotonic(), fresh)
        return fresh

    def _refresh(self, account: str) -> None:
        """(A worker thread's: the account's lexicons read again.)"""
        try:
            self._read(account)
        except DatabaseError as e:
            log.warning("account %s: its lexicons cannot be read again (%s); requests use the last read", account, e)
        except Exception:  # noqa: BLE001 - a refresh never ends the server
            log.exception("account %s: reading its lexicons failed", account)
        finally:
            with self._lock:
                self._refreshing.discard(account)

    async def _reread(self, account: str) -> None:
        """After this server changed the account's lexicons: its requests read the change from now on."""
        try:
            await asyncio.to_thread(self._read, account)
        except DatabaseError:
            with self._lock:
                self._cache.pop(account, None)

    def _audit(self, account: str, stored: StoredLexicon, outcome: str, protocol: str) -> None:
        if self.audit is None or not self.audit.config.enabled:
            return
        now = datetime.now(timezone.utc)
        self.audit.record({"op": "row", "row": {
            "time": now, "ended": now, "account": account, "voice": f"lexicon:{stored.id}", "protocol": protocol,
            "outcome": outcome, "reason": "", "audio_seconds": 0.0, "text_sha256": stored.sha256, "pcm_sha256": "",
            "entry_id": uuid.uuid4().hex, "instance": self.audit.instance}})
