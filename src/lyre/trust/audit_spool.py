"""What the audit trail's writer does to the database, and its spool: the local file that holds what
could not reach the database, so that neither a database outage nor a crash during one loses a row.

An *op* is a dict: ``{"op": "start", "row": {...}}`` (a synthesis began: its row, outcome
``started``), ``{"op": "end", "entry_id": ..., "values": {...}}`` (it ended: outcome, reason,
audio seconds, hashes, when), or ``{"op": "row", "row": {...}}`` (a whole row at once). Ops are
applied in order, in one transaction per batch. The spool is JSON lines, appended and fsynced;
replaying it applies each op at most once (a start whose entry id is in the table already is
skipped; an end sets what it sets), a chunk at a time, and takes what it applied off the front of
the file. Processes that share the file (two servers on one data_dir) take turns: each append and
each chunk's replay holds an exclusive lock on a file beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lyre.storage.db import audit

log = logging.getLogger("lyre.audit")

ENDING = ("outcome", "reason", "audio_seconds", "text_sha256", "pcm_sha256", "ended")
_END = audit.update().where(audit.c.entry_id == sa.bindparam("b_entry_id")).values(
    **{name: sa.bindparam(f"b_{name}") for name in ENDING})
INTERRUPTED = "the server stopped before the synthesis ended"


def apply(engine: Engine, ops: list[dict[str, Any]], once: bool = False) -> None:
    """Apply ``ops`` in one transaction (``once``: skip starts and rows already in the table)."""
    with engine.begin() as c:
        for op in ops:
            if op["op"] in ("start", "row"):
                row = op["row"]
                if once and c.execute(sa.select(audit.c.id).where(audit.c.entry_id == row["entry_id"])).first():
                    continue
                c.execute(audit.insert(), [row])
            elif c.execute(_END, {"b_entry_id": op["entry_id"], **{f"b_{k}": v for k, v in op["values"].items()}}
                           ).rowcount == 0:  # (its start was lost: never written, spooled nor kept)
                log.error("audit: the end of synthesis %s (%s) has no row to complete", op["entry_id"],
                          op["values"].get("outcome"))


def close_open_rows(c: Connection, instance: str | None, older_than_s: float | None = None,
                    opened_before: datetime | None = None) -> int:
    """Mark rows still ``started`` as ``interrupted``: those ``instance`` opened before
    ``opened_before`` (its last run's: it is starting again, so none of them runs), or any opened
    more than ``older_than_s`` ago (their server never came back)."""
    query = audit.update().where(audit.c.outcome == "started")
    if instance is not None:
        query = query.where(audit.c.instance == instance)
    if opened_before is not None:
        query = query.where(audit.c.time < opened_before)
    if older_than_s is not None:
        query = query.where(audit.c.time < datetime.now(timezone.utc) - timedelta(seconds=older_than_s))
    return c.execute(query.values(outcome="interrupted", reason=INTERRUPTED[:64],
                                  ended=datetime.now(timezone.utc))).rowcount


class Spool:
    """The append-only local file of ops that could not be written (JSON lines, fsynced)."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def waiting(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes, or its process dies)
            yield

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Raises OSError when the file cannot be written (the ops then stay in memory)."""
        data = "".join(json.dumps(op, default=_encode, separators=(",", ":")) + "\n" for op in ops).encode()
        with self._locked(), open(self.path, "a+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                data = b"\n" + data  # a line a crash cut short stays alone on its line (and is skipped)
            try:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                f.truncate(size)  # no half-written line: the ops stay in memory, and only there
                raise

    def replay(self, write: Callable[[list[dict[str, Any]]], None], most: int | None = None) -> int:
        """``write`` the oldest ``most`` ops the file holds (all when None; :func:`apply` with
        ``once``), then take them off the file; returns how many. Raises what ``write`` raises (the
        file is kept as it was)."""
        with self._locked():
            try:
                lines = self.path.read_text().splitlines(keepends=True)
            except FileNotFoundError:
                return 0
            ops, used = [], 0
            for line in lines:
                if most is not None and len(ops) >= most:
                    break
                used += 1
                try:
                    ops.append(json.loads(line, object_hook=_decode))
                except ValueError:
                    continue  # a line cut short by a crash mid-write: its op was not acknowledged either
            write(ops)
            if used < len(lines):  # the rest stays, in order: written to a new file that replaces it whole
                rest = self.path.with_name(self.path.name + ".rest")
                with open(rest, "w") as f:
                    f.writelines(lines[used:])
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(rest, self.path)
            else:
                with open(self.path, "r+b") as f:
                    f.truncate(0)
                    os.fsync(f.fileno())
        return len(ops)


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return {"$time": value.isoformat()}
    raise TypeError(f"cannot spool {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    return datetime.fromisoformat(obj["$time"]) if set(obj) == {"$time"} else obj
