"""The audit trail: one row per synthesis, on every protocol, in the voices database.

Each row: time, account, voice (a built-in name or a cloned voice's id), sha256 of the text, sha256
of the 24 kHz PCM produced (hashed as it streams, watermark included), audio seconds, protocol,
outcome (finished | cancelled | failed) and its reason. Rows older than ``audit.retention_days``
are deleted (at start, then hourly). ``lyre audit export`` reads them back (:mod:`lyre.tools.audit`).

Nothing here blocks the event loop or the engine thread: :meth:`AuditTrail.record` queues the row
and one writer thread inserts rows in batches. A write that fails (a full disk, a database gone)
keeps its rows queued and is retried; meanwhile :meth:`AuditTrail.check` refuses new syntheses
(503), so none goes unrecorded and no row is lost while the process lives.

"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.config import AuditConfig
from lyre.errors import DatabaseError
from lyre.model import orpheus
from lyre.storage.db import audit

log = logging.getLogger("lyre.audit")

PRUNE_EVERY_S = 3600.0
RETRY_S = 1.0
BATCH = 500
COLUMNS = ("time", "account", "voice", "protocol", "outcome", "reason", "audio_seconds", "text_sha256", "pcm_sha256")


@dataclass
class AuditEntry:
    """One synthesis being recorded: its text and PCM are hashed as they go by."""

    trail: AuditTrail | None
    account: str
    voice: str
    protocol: str
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    _text: Any = field(default_factory=hashlib.sha256)
    _pcm: Any = field(default_factory=hashlib.sha256)
    samples: int = 0
    done: bool = False

    def add_text(self, text: str) -> None:
        self._text.update(text.encode("utf-8", "surrogatepass"))

    def add_pcm(self, pcm: np.ndarray) -> None:
        """int16 24 kHz samples as delivered."""
        self._pcm.update(np.ascontiguousarray(pcm, dtype="<i2").tobytes())
        self.samples += int(pcm.size)

    def finish(self, outcome: str, reason: str | None = None) -> None:
        """Record the row (once; later calls do nothing)."""
        if self.done:
            return
        self.done = True
        if self.trail is not None:
            self.trail.record({"time": self.started, "account": self.account, "voice": self.voice,
                               "protocol": self.protocol, "outcome": outcome, "reason": (reason or "")[:64],
                               "audio_seconds": self.samples / orpheus.SAMPLE_RATE,
                               "text_sha256": self._text.hexdigest(), "pcm_sha256": self._pcm.hexdigest()})


class AuditTrail:
    def __init__(self, engine: Engine, config: AuditConfig, clock=time.monotonic):
        self.engine, self.config, self.clock = engine, config, clock
        self._rows: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._busy = False  # the writer holds rows it is inserting
        self._stop = False
        self.error: str | None = None  # why the last write failed; None once writes succeed again
        self.written = 0
        self.dropped = 0  # rows dropped beyond audit.max_queued_rows (audit.required false)
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

    def record(self, row: dict[str, Any]) -> None:
        """Queue ``row`` for the writer (never blocks while the writer runs; after close(), a late
        row, from a stream that ended during shutdown, is written at once or logged as lost)."""
        with self._cond:
            if not self._stop:
                if not self.config.required and len(self._rows) >= self.config.max_queued_rows:
                    self._rows.popleft()
                    self.dropped += 1
                    if self.dropped == 1 or self.dropped % 1000 == 0:
                        log.error("audit: %d rows dropped: %d are waiting for the database (audit.max_queued_rows)",
                                  self.dropped, len(self._rows))
                self._rows.append(row)
                self._cond.notify_all()
                return
        try:
            self._insert([row])
        except Exception as e:  # noqa: BLE001
            log.error("audit: a row recorded after shutdown could not be written (%s): %s", _reason(e), row)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued row is written (True) or ``timeout`` passes, e.g. while writes fail."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._rows or self._busy:
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
            log.error("audit: %d rows could not be written before shutdown (%s)", len(self._rows), self.error)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # --- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_prune = 0.0
        while True:
            with self._cond:
                while not self._rows and not self._stop and self.clock() < next_prune:
                    self._cond.wait(max(0.0, next_prune - self.clock()))
                if self._stop and (not self._rows or self.error is not None):
                    return
                batch = [self._rows.popleft() for _ in range(min(BATCH, len(self._rows)))]
                self._busy = bool(batch)
            failed = False
            try:
                if batch:
                    self._insert(batch)
                    if self.error is not None:
                        log.warning("audit: writing again after: %s", self.error)
                    self.error = None
                    self.written += len(batch)
            except Exception as e:  # noqa: BLE001 - kept and retried; check() refuses new work meanwhile
                failed = True
                reason = _reason(e)
                if self.error is None:
                    log.error("audit: cannot write to the database (%s); %d rows kept for retry; %s", reason,
                              len(batch) + len(self._rows),
                              "new syntheses are refused until it works again (audit.required)" if self.config.required
                              else "syntheses go on (audit.required false), their rows kept")
                self.error = reason
            if not failed and self.clock() >= next_prune:
                next_prune = self.clock() + PRUNE_EVERY_S
                try:  # (a failed prune is tried again later; it never re-queues rows nor refuses work)
                    self.prune()
                except Exception as e:  # noqa: BLE001
                    log.warning("audit: pruning old rows failed (%s); trying again in an hour", _reason(e))
            with self._cond:
                if failed:
                    self._rows.extendleft(reversed(batch))
                self._busy = False
                self._cond.notify_all()
                if failed and not self._stop:
                    self._cond.wait(RETRY_S)

    def _insert(self, rows: list[dict[str, Any]]) -> None:
        with self.engine.begin() as c:
            c.execute(audit.insert(), rows)

    def prune(self) -> int:
        """Delete rows older than ``audit.retention_days``; returns how many."""
        cutoff = datetime.now(timezone.utc) - timedelta(days=self.config.retention_days)
        with self.engine.begin() as c:
            gone = c.execute(audit.delete().where(audit.c.time < cutoff)).rowcount
        if gone:
            log.info("audit: %d rows older than %g days deleted", gone, self.config.retention_days)
        return gone


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
            stamp = out["time"]
            out["time"] = (stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)).isoformat()
            yield out
