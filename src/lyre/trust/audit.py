"""The audit trail: one row per synthesis, on every protocol, in the voices database.

Each row: when it started and ended, account, voice (a built-in name or a cloned voice's id),
sha256 of the text, sha256 of the 24 kHz PCM produced (hashed as it streams, watermark included),
audio seconds, protocol, outcome and its reason. The row is written when the synthesis starts,
before its first audio is delivered (outcome ``started``), and completed when it ends:
``completed``, ``cancelled`` (by the client), ``slow_consumer``, ``timeout``, ``shutdown`` or
``error``. A row a crash left open is closed as ``interrupted`` when its server (the same host and
data_dir) starts again, or after ``OPEN_ROW_MAX_S`` by any server. Rows older than
``audit.retention_days`` are deleted (at start, then hourly). ``lyre audit export`` reads them back
(:mod:`lyre.tools.audit`).

Nothing here blocks the event loop or the engine thread: rows are queued and one writer thread
writes them in batches. What cannot reach the database (a full disk, a database gone) goes to the
spool, an fsynced local file (:mod:`lyre.trust.audit_spool`), replayed when the database is back,
so that neither the outage nor a crash during it loses a row; while writes fail,
:meth:`AuditTrail.check` refuses new syntheses with ``audit.required`` (503). Only when the spool
cannot be written either are rows kept in memory (up to ``audit.max_queued_rows``).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.config import AuditConfig
from lyre.errors import DatabaseError
from lyre.storage.db import audit
from lyre.trust.audit_entry import AuditEntry, row_outcome
from lyre.trust.audit_spool import Spool, apply, close_open_rows

__all__ = ["AuditEntry", "AuditTrail", "instance_name", "row_outcome", "rows"]

log = logging.getLogger("lyre.audit")

PRUNE_EVERY_S = 3600.0
RETRY_S = 1.0
BATCH = 500
OPEN_ROW_MAX_S = 6 * 3600.0  # a row open longer than this lost its server: closed as interrupted by anyone
COLUMNS = ("time", "ended", "account", "voice", "protocol", "outcome", "reason", "audio_seconds", "text_sha256",
           "pcm_sha256", "trace")


def instance_name(data_dir: str | Path) -> str:
    """This server among those sharing a database: its host and its data_dir (stable across restarts)."""
    where = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()[:100]}:{where}"


class AuditTrail:
    def __init__(self, engine: Engine, config: AuditConfig, clock=time.monotonic, spool: Path | None = None,
                 instance: str | None = None):
        self.engine, self.config, self.clock = engine, config, clock
        self.instance = instance or instance_name(".")
        self.spool = Spool(spool) if spool is not None else None
        self._ops: deque[tuple[dict[str, Any], Any]] = deque()  # (op, called once the writer has taken it)
        self._cond = threading.Condition()
        self._busy = config.enabled  # the writer holds ops it is writing (or does its start's work)
        self._stop = False
        self.error: str | None = None  # why the last write failed; None once writes succeed again
        self._next_retry = 0.0  # while writes fail: when the spool (or the start's recovery) is tried again
        self._recovered = False  # the start's recovery (spool, this server's open rows) is done
        self.created = datetime.now(timezone.utc)
        self.written = 0
        self.spooled = 0
        self.dropped = 0  # ops dropped beyond audit.max_queued_rows (spool unwritable, audit.required false)
        self._thread: threading.Thread | None = None
        if config.enabled:
            self._thread = threading.Thread(target=self._run, name="lyre-audit", daemon=True)
            self._thread.start()

    def entry(self, account: str, voice: str, protocol: str) -> AuditEntry:
        return AuditEntry(self if self.config.enabled else None, account, voice, protocol)

    @property
    def refusing(self) -> bool:
        """Whether new syntheses are refused: rows cannot be written and ``audit.required``."""
        return self.config.enabled and self.config.required and self.error is not None

    def check(self) -> None:
        """Raise DatabaseError (503) while rows cannot be written (``audit.required``): no synthesis
        goes unrecorded."""
        if self.refusing:
            raise DatabaseError(f"the audit trail cannot be written ({self.error}); new syntheses are refused until "
                                "it can, so that none goes unrecorded")

    def record(self, op: dict[str, Any], taken: Any = None) -> None:
        """Queue ``op`` for the writer (never blocks while the writer runs; after close(), a late
        op, from a stream that ended during shutdown, is written at once or logged as lost)."""
        with self._cond:
            if not self._stop:
                if not self.config.required and len(self._ops) >= self.config.max_queued_rows:
                    _taken(self._ops.popleft()[1])
                    self.dropped += 1
                    if self.dropped == 1 or self.dropped % 1000 == 0:
                        log.error("audit: %d rows dropped: %d are waiting for the database (audit.max_queued_rows)",
                                  self.dropped, len(self._ops))
                self._ops.append((op, taken))
                self._cond.notify_all()
                return
        try:
            self._write([op])
        except Exception as e:  # noqa: BLE001
            try:
                if self.spool is None:
                    raise OSError("no spool file") from e
                self.spool.append([op])  # (written at the next start)
            except OSError:
                log.error("audit: a row recorded after shutdown could not be written (%s): %s", _reason(e), op)
        _taken(taken)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued op is written or spooled (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._ops or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to ``timeout``), then stop the writer."""
        if self._thread is None:
            return
        if not self.flush(timeout):
            log.error("audit: %d rows could not be written before shutdown (%s)", len(self._ops), self.error)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # --- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        self._recover()
        self._upkeep()
        next_prune = self.clock() + PRUNE_EVERY_S
        with self._cond:
            self._busy = False  # (flush() waits for the start's work too)
            self._cond.notify_all()
        while True:
            with self._cond:
                while (not self._ops and not self._stop and self.clock() < next_prune and not self._retry_spool()
                       and not self._retry_recover()):
                    self._cond.wait(max(0.0, min(next_prune - self.clock(), RETRY_S if self.error else 3600.0)))
                if self._stop and not self._ops:
                    break
                batch = [self._ops.popleft() for _ in range(min(BATCH, len(self._ops)))]
                self._busy = bool(batch)
            if self._retry_recover():
                self._recover()
            kept = self._write_or_spool(batch)
            if self.clock() >= next_prune:
                next_prune = self.clock() + PRUNE_EVERY_S
                if self.error is None:
                    self._upkeep()
            with self._cond:
                if kept:
                    self._ops.extendleft(reversed(kept))
                self._busy = False
                self._cond.notify_all()
                if kept and not self._stop:
                    self._cond.wait(RETRY_S)
                elif kept:
                    log.error("audit: %d rows lost at shutdown: neither the database nor the spool took them (%s)",
                              len(kept), self.error)
                    return
        if self.spool is not None and self.spool.waiting:  # stopping: what the spool holds goes in now if it can
            try:
                self.spool.replay(lambda spooled: self._write(spooled, once=True))
            except Exception as e:  # noqa: BLE001
                log.warning("audit: the spool stays for the next start: the database still fails (%s)", _reason(e))

    def _write_or_spool(self, batch: list[tuple[dict[str, Any], Any]]) -> list:
        """Write ``batch`` (the spool first, when it holds older ops); when the database fails, to the
        spool; when that fails too, hand it back to be kept. Each op's callback runs once it is taken."""
        if not batch and not self._retry_spool():
            return []
        ops = [op for op, _ in batch]
        try:
            if self.spool is not None and self.spool.waiting:
                # Older ops wait in the spool: new ones join them there (in order, and as safe as in
                # the database, so their first audio need not wait), and the spool goes in a chunk
                # at a time, new ops arriving between chunks.
                if ops and self._spool(ops):
                    ops = []
                    for _, taken in batch:
                        _taken(taken)
                    batch = []
                self.spool.replay(lambda spooled: self._write(spooled, once=True), most=BATCH)
            if ops:
                self._write(ops)
            if self.error is not None:
                log.warning("audit: writing again after: %s", self.error)
            self.error = None
            self.written += len(ops)
        except Exception as e:  # noqa: BLE001 - spooled (or kept) and retried; check() refuses new work meanwhile
            reason = _reason(e)
            if self.error is None:
                log.error("audit: cannot write to the database (%s); rows go to the spool and are written once it "
                          "works; %s", reason, "new syntheses are refused until then (audit.required)"
                          if self.config.required else "syntheses go on (audit.required false)")
            self.error = reason
            self._next_retry = self.clock() + RETRY_S
            if ops:
                try:
                    if self.spool is None:
                        raise OSError("no spool file")
                    self.spool.append(ops)
                    self.spooled += len(ops)
                except OSError as spool_error:
                    log.error("audit: the spool cannot be written either (%s): %d rows kept in memory", spool_error,
                              len(ops) + len(self._ops))
                    for _, taken in batch:
                        _taken(taken)  # (the first audio does not wait on a database that is away)
                    return [(op, None) for op, _ in batch]
        for _, taken in batch:
            _taken(taken)
        return []

    def _spool(self, ops: list[dict[str, Any]]) -> bool:
        """Append ``ops`` to the spool; False (logged) when it cannot be written."""
        try:
            self.spool.append(ops)
        except OSError as e:
            log.error("audit: the spool cannot be written (%s)", e)
            return False
        self.spooled += len(ops)
        return True

    def _retry_spool(self) -> bool:
        """Whether to replay (the next chunk of) the spool now: it holds ops, and writes work or
        RETRY_S has passed since they failed."""
        return (self.spool is not None and (self.error is None or self.clock() >= self._next_retry)
                and self.spool.waiting)

    def _write(self, ops: list[dict[str, Any]], once: bool = False) -> None:
        apply(self.engine, ops, once)

    def _recover(self) -> None:
        """At start: what the spool holds from before goes in, then this server's rows left open by
        its last run (a crash: opened before this trail was) are closed as interrupted. Tried again
        every RETRY_S until it works (meanwhile ``error`` says why, and check() refuses)."""
        try:
            if self.spool is not None and self.spool.waiting:
                log.info("audit: %d rows written from the spool",
                         self.spool.replay(lambda spooled: self._write(spooled, once=True)))
            with self.engine.begin() as c:
                closed = close_open_rows(c, self.instance, opened_before=self.created)
            if closed:
                log.warning("audit: %d rows of syntheses this server was running when it stopped are marked "
                            "interrupted", closed)
            self._recovered = True
            if self.error is not None:
                log.warning("audit: writing again after: %s", self.error)
            self.error = None
        except Exception as e:  # noqa: BLE001 - tried again every RETRY_S
            if self.error is None:
                log.error("audit: cannot recover the spool or open rows at start (%s); trying again", _reason(e))
            self.error = _reason(e)
            self._next_retry = self.clock() + RETRY_S

    def _retry_recover(self) -> bool:
        return not self._recovered and self.clock() >= self._next_retry

    def _upkeep(self) -> None:
        """Hourly: delete rows past retention, close rows left open by servers that never came back."""
        try:  # (a failed prune is tried again later; it never re-queues rows nor refuses work)
            self.prune()
            with self.engine.begin() as c:
                close_open_rows(c, None, OPEN_ROW_MAX_S)
        except Exception as e:  # noqa: BLE001
            log.warning("audit: pruning old rows failed (%s); trying again in an hour", _reason(e))

    def prune(self) -> int:
        """Delete rows older than ``audit.retention_days``; returns how many."""
        cutoff = datetime.now(timezone.utc) - timedelta(days=self.config.retention_days)
        with self.engine.begin() as c:
            gone = c.execute(audit.delete().where(audit.c.time < cutoff)).rowcount
        if gone:
            log.info("audit: %d rows older than %g days deleted", gone, self.config.retention_days)
        return gone


def _taken(callback: Callable[[], None] | None) -> None:
    """Tell whoever waits for an op that the writer has taken it; nothing it does stops the writer."""
    if callback is None:
        return
    try:
        callback()
    except Exception:  # noqa: BLE001
        log.exception("audit: telling a synthesis that its row was written failed")


def _reason(e: Exception) -> str:
    return str(getattr(e, "orig", None) or e).splitlines()[0][:200]


# --------------------------------------------------------------------------------------------
# reading it back


def rows(engine: Engine, since: datetime, until: datetime | None = None, voice: str | None = None,
         account: str | None = None) -> Iterator[dict[str, Any]]:
    """Audit rows from ``since`` (and before ``until``), oldest first, optionally of one voice or account."""
    query = sa.select(*[audit.c[name] for name in COLUMNS]).where(audit.c.time >= since).order_by(audit.c.time,
                                                                                                   audit.c.id)
    if until is not None:
        query = query.where(audit.c.time < until)
    if voice is not None:
        query = query.where(audit.c.voice == voice)
    if account is not None:
        query = query.where(audit.c.account == account)
    with engine.connect() as c:
        for row in c.execute(query).mappings():
            out = dict(row)
            for name in ("time", "ended"):  # (SQLite gives them back without their zone: they are UTC)
                stamp = out[name]
                if stamp is not None:
                    out[name] = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).isoformat()
            yield out
