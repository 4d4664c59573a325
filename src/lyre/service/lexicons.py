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

A request reads the account's lexicons from the copy this server keeps: :meth:`Lexicons.keep_fresh`
(a task of the running service) reads the copies of accounts used in the last :data:`IDLE_S` again
every :data:`REFRESH_S`, in a worker thread, so a lexicon another replica created or deleted counts
here within about that long, and a slow or unreachable database never holds up a request: it uses
the copy it has. Only an account's first request (or its first after :data:`IDLE_S` unused) reads
the database on the calling thread; a read that fails is remembered until the next refresh, so an
outage costs that one wait, not one per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from lyre.errors import DatabaseError, InvalidRequest, ServiceUnavailable, UnknownLexicon, UploadTooLarge
from lyre.service.voices import Voices
from lyre.storage.lexicons import LexiconRegistry, StoredLexicon, unknown_lexicon
from lyre.storage.registry import check_name
from lyre.text import pls
from lyre.trust.accounts import DEFAULT_ACCOUNT

log = logging.getLogger("lyre.voices")

REFRESH_S = 5.0
IDLE_S = 300.0  # an account's copy unused this long is dropped (not read again every REFRESH_S)
MAX_TABLES = 1024  # alias tables kept (cleared when full)
LABEL = "a name for the lexicon"

Held = list[tuple[str, str, bool, pls.Lexicon]]  # [(id, sha256, default, parsed)], oldest first


@dataclass
class _Copy:
    """What this server holds of one account's lexicons."""

    lexicons: Held | None  # None: never read (the database was unavailable)
    used: float  # (monotonic) when a request last read it


class Lexicons:
    def __init__(self, voices: Voices, audit: Any = None):
        self.voices = voices
        self.audit = audit  # the service's AuditTrail (set once it starts)
        self._store: LexiconRegistry | None = None
        self._lock = threading.Lock()
        self._cache: dict[str, _Copy] = {}  # account -> its copy
        self._generation = 0  # changes made here: a read begun before the last one is not kept (it may miss it)
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

    def _held(self, account: str) -> Held:
        """The account's lexicons: its copy (read on this thread when there is none). DatabaseError when
        they could never be read."""
        with self._lock:
            copy = self._cache.get(account)
            if copy is not None:
                copy.used = time.monotonic()
        held = copy.lexicons if copy is not None else self._read(account)
        if held is None:
            raise DatabaseError("the account's lexicons cannot be read: the database is unavailable")
        return held

    def _read(self, account: str) -> Held:
        """Read the account's lexicons into its copy (blocking). When that fails the copy stays as it was
        (noted as never read when there was none) and the error is raised."""
        registry = self._registry()
        with self._lock:
            copy, generation = self._cache.get(account), self._generation
        known = {i: lex for i, _, _, lex in (copy.lexicons or [])} if copy is not None else {}
        try:
            fresh = []
            for row in registry.list(account):
                lexicon = known.get(row.id)
                if lexicon is None:  # (new here: read and parsed once)
                    try:
                        lexicon = pls.parse(registry.get(row.id, account, with_pls=True).pls)
                    except UnknownLexicon:  # (deleted since the list was read)
                        continue
                    except pls.PlsError as e:  # (stored before a stricter parser: the others still count)
                        log.error("account %s: its lexicon %s no longer parses (%s): left out", account, row.id, e)
                        continue
                fresh.append((row.id, row.sha256, row.default, lexicon))
        except DatabaseError:
            with self._lock:
                self._cache.setdefault(account, _Copy(None, time.monotonic()))
            raise
        with self._lock:
            if self._generation == generation:  # (else a change made here since: the read after it is kept)
                held = self._cache.get(account)
                self._cache[account] = _Copy(fresh, held.used if held is not None else time.monotonic())
        return fresh

    async def _reread(self, account: str) -> None:
        """After this server changed the account's lexicons: its requests read the change from now on
        (or, when the database cannot be read just now, from the next refresh)."""
        with self._lock:
            self._generation += 1
            held = account in self._cache
        if not held:  # (no copy: its first request reads one)
            return
        try:
            await asyncio.to_thread(self._read, account)
        except Exception as e:  # noqa: BLE001 - the change is made: keep_fresh reads it again
            log.warning("account %s: its lexicons could not be read again after a change (%s)", account, e)

    async def keep_fresh(self) -> None:
        """Every REFRESH_S: the copies of accounts used in the last IDLE_S read again, one account at a
        time in a worker thread; the others dropped. (The running service's task.)"""
        while True:
            await asyncio.sleep(REFRESH_S)
            now = time.monotonic()
            with self._lock:
                for account in [a for a, copy in self._cache.items() if now - copy.used > IDLE_S]:
                    del self._cache[account]
                due = list(self._cache)
            for account in due:
                try:
                    await asyncio.to_thread(self._read, account)
                except DatabaseError as e:
                    log.warning("account %s: its lexicons cannot be read again (%s); requests use the last read",
                                account, e)
                except Exception:  # noqa: BLE001 - a refresh never ends the task
                    log.exception("account %s: reading its lexicons failed", account)

    def _audit(self, account: str, stored: StoredLexicon, outcome: str, protocol: str) -> None:
        if self.audit is None or not self.audit.config.enabled:
            return
        now = datetime.now(timezone.utc)
        self.audit.record({"op": "row", "row": {
            "time": now, "ended": now, "account": account, "voice": f"lexicon:{stored.id}", "protocol": protocol,
            "outcome": outcome, "reason": "", "audio_seconds": 0.0, "text_sha256": stored.sha256, "pcm_sha256": "",
            "entry_id": uuid.uuid4().hex, "instance": self.audit.instance}})
