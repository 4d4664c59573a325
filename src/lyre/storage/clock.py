"""The time servers sharing a database agree on: on PostgreSQL, the database's clock (read as an offset
from this machine's once a minute, so that replicas whose clocks disagree never take each other's
leases early); on SQLite, this machine's clock, which every server sharing the file runs on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from lyre.storage.registry import in_utc

CHECK_S = 60.0  # how often the database's clock is read (PostgreSQL)
RETRY_S = 5.0  # after a failed read

log = logging.getLogger("lyre.batch")


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


class DatabaseClock:
    def __init__(self, engine: Engine, clock: Callable[[], datetime] = now_utc):
        self.engine = engine
        self.clock = clock  # this machine's UTC time
        self._offset = timedelta(0)  # the database's clock minus ours
        self._read_at: float | None = None  # (monotonic) when it was read

    def now(self) -> datetime:
        if self.engine.dialect.name == "postgresql" and (
                self._read_at is None or time.monotonic() - self._read_at >= CHECK_S):
            try:
                with self.engine.connect() as c:
                    before = self.clock()
                    theirs = in_utc(c.execute(sa.select(sa.func.now())).scalar())
                    after = self.clock()
                self._offset = theirs - (before + (after - before) / 2)
                if abs(self._offset) > timedelta(seconds=5):
                    log.warning("this server's clock is %.1f s off the database's: batch leases use the "
                                "database's", -self._offset.total_seconds())
                self._read_at = time.monotonic()
            except SQLAlchemyError:  # (the last offset is kept; tried again in a few seconds, not on every call)
                self._read_at = time.monotonic() - CHECK_S + RETRY_S
        return self.clock() + self._offset
