"""Batch jobs in the database: batches and their items, claimed with leases (exactly once).

An item moves queued -> running (claimed: ``lease_owner`` = the server, ``lease_until``,
``attempts`` + 1) -> completed | failed, or to cancelled / expired. Only the holder of the current
lease (its owner *and* its attempt number) can complete or fail an item, in one conditional UPDATE:
a server whose lease ran out (it stalled, or died and came back) finds that the row is no longer
its own, and its result is never shown. An item whose lease ran out is claimed again by any
server. On PostgreSQL a claim takes rows ``FOR UPDATE SKIP LOCKED`` (servers claiming at once take
different items, never waiting for each other); SQLite has one writer at a time, which orders claims
already. Times (leases, windows) are the database's on PostgreSQL: each store reads its offset
from the server's clock once a minute, so replicas whose clocks disagree never take each other's
live items (SQLite: this machine's clock, which every server sharing the file runs on). Ids are server-generated (``batch_`` + 24 URL-safe characters); every lookup is by (id,
account): another account's batch is a 404 like one never made.

Blocking: run these in worker threads (:mod:`lyre.service.batch` does).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.errors import IdempotencyConflict, QuotaExceeded, UnknownBatch
from lyre.storage.clock import DatabaseClock, now_utc
from lyre.storage.db import audit, batch_items, batches
from lyre.storage.registry import database_errors, in_utc

BATCH_ID_PATTERN = re.compile(r"batch_[A-Za-z0-9_-]{24}")
ACTIVE, ENDED_ITEM = ("queued", "running"), ("completed", "failed", "cancelled", "expired")
ITEM_STATES = (*ACTIVE, *ENDED_ITEM)


@dataclass(frozen=True)
class Claim:
    """An item a server holds a lease on: what to synthesise, and the attempt whose result counts."""

    id: int
    batch_id: str
    owner: str
    custom_id: str
    line: int
    request: dict[str, Any]
    attempt: int


def unknown_batch(batch_id: Any) -> UnknownBatch:
    shown = batch_id if isinstance(batch_id, str) and BATCH_ID_PATTERN.fullmatch(batch_id) else "that id"
    return UnknownBatch(f"no batch {shown} (batches are visible only to the account that created them)")


class BatchStore:
    def __init__(self, engine: Engine, clock: Callable[[], datetime] = now_utc):
        self.engine = engine
        self.now = DatabaseClock(engine, clock).now  # the time every server sharing the database agrees on

    # --- batches ---------------------------------------------------------------------------------

    def create(self, *, owner: str, items: list[dict[str, Any]], input_sha256: str, input_bytes: int,
               completion_window: str, window_s: float, meta: dict[str, str], idempotency_key: str | None,
               max_items: int) -> tuple[dict[str, Any], bool]:
        """Store a validated batch and its items (``line``, ``custom_id``, ``request``) in one
        transaction: (the batch's row, True). With an ``idempotency_key`` the account used before: that
        batch, False (IdempotencyConflict when its input differs). QuotaExceeded when the account's
        queued and running items would pass ``max_items``."""
        now = self.now()
        row = {"id": "batch_" + secrets.token_urlsafe(18), "owner": owner, "status": "in_progress",
               "idempotency_key": idempotency_key, "input_sha256": input_sha256, "input_bytes": input_bytes,
               "total": len(items), "completion_window": completion_window, "meta": meta, "created_at": now,
               "expires_at": now + timedelta(seconds=window_s), "cancelling_at": None, "ended_at": None}
        try:
            stored = self._create(row, items, now, max_items)
        except sa.exc.IntegrityError:  # the same Idempotency-Key stored by a request racing this one
            if idempotency_key is None:
                raise
            stored = self._create(row, items, now, max_items)
        return stored, stored["id"] == row["id"]

    def _create(self, row: dict[str, Any], items: list[dict[str, Any]], now: datetime, max_items: int) -> dict[str, Any]:
        """(:meth:`create`'s transaction: the batch a reused key names, else the new one.)"""
        owner, idempotency_key = row["owner"], row["idempotency_key"]
        with database_errors(), self.engine.begin() as c:
            if c.dialect.name == "postgresql":  # one creation of an account at a time (its quota, its keys)
                c.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": "batches:" + owner})
            if idempotency_key is not None:
                before = c.execute(sa.select(batches).where(batches.c.owner == owner,
                                                            batches.c.idempotency_key == idempotency_key)).mappings().first()
                if before is not None:
                    if before["input_sha256"] != row["input_sha256"]:
                        raise IdempotencyConflict(f"Idempotency-Key {idempotency_key!r} was used for another input "
                                                  f"(batch {before['id']}); use a new key for a new batch")
                    return dict(before)
            held = c.execute(sa.select(sa.func.count()).select_from(batch_items).where(
                batch_items.c.owner == owner, batch_items.c.state.in_(ACTIVE))).scalar()
            if held + len(items) > max_items:
                raise QuotaExceeded(owner, "accounts.batch_items", max_items,
                                    f"batch items queued or running ({held} now; this batch has {len(items)})", 60.0)
            c.execute(batches.insert().values(**row))
            c.execute(batch_items.insert(), [
                {"batch_id": row["id"], "owner": owner, "line": it["line"], "custom_id": it["custom_id"],
                 "request": it["request"], "state": "queued", "attempts": 0, "queued_at": now} for it in items])
        return row

    def existing(self, owner: str, idempotency_key: str) -> dict[str, Any] | None:
        """The account's batch stored under ``idempotency_key``, if any (checked before validating a resubmission)."""
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(batches).where(batches.c.owner == owner,
                                                     batches.c.idempotency_key == idempotency_key)).mappings().first()
        return dict(row) if row is not None else None

    def get(self, batch_id: Any, owner: str) -> dict[str, Any]:
        """The batch's row with its items' ``counts`` by state (UnknownBatch for anyone else's)."""
        if not (isinstance(batch_id, str) and BATCH_ID_PATTERN.fullmatch(batch_id)):
            raise unknown_batch(batch_id)
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(batches).where(batches.c.id == batch_id, batches.c.owner == owner)
                            ).mappings().first()
            if row is None:
                raise unknown_batch(batch_id)
            return {**row, "counts": _counts(c, [batch_id])[batch_id]}

    def list(self, owner: str, limit: int = 20, after: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """The account's batches, newest first, ``limit`` of them after the batch ``after``; and whether more remain."""
        query = sa.select(batches).where(batches.c.owner == owner)
        with database_errors(), self.engine.connect() as c:
            if after is not None:
                mark = c.execute(sa.select(batches.c.created_at, batches.c.id).where(
                    batches.c.id == after, batches.c.owner == owner)).first()
                if mark is None:
                    raise unknown_batch(after)
                query = query.where(sa.tuple_(batches.c.created_at, batches.c.id) < sa.tuple_(mark[0], mark[1]))
            rows = c.execute(query.order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit + 1)
                             ).mappings().all()
            counts = _counts(c, [r["id"] for r in rows[:limit]])
        return [{**r, "counts": counts[r["id"]]} for r in rows[:limit]], len(rows) > limit

    def cancel(self, batch_id: str, owner: str) -> dict[str, Any]:
        """Cancel: queued items at once; running ones end at their server's next check (then the batch is cancelled)."""
        self.get(batch_id, owner)
        now = self.now()
        with database_errors(), self.engine.begin() as c:
            _lock(c, batch_id)
            changed = c.execute(batches.update().where(batches.c.id == batch_id, batches.c.status == "in_progress")
                                .values(status="cancelling", cancelling_at=now)).rowcount
            if changed:
                c.execute(batch_items.update().where(batch_items.c.batch_id == batch_id, batch_items.c.state == "queued")
                          .values(state="cancelled", finished_at=now, error_code="cancelled",
                                  error_message="the batch was cancelled before this item ran"))
                _settle(c, batch_id, now)
        return self.get(batch_id, owner)

    def status(self, batch_id: str) -> str | None:
        """The batch's status (any account's: a server checking on an item it runs)."""
        with database_errors(), self.engine.connect() as c:
            return c.execute(sa.select(batches.c.status).where(batches.c.id == batch_id)).scalar()

    # --- items -----------------------------------------------------------------------------------

    def waiting_accounts(self) -> list[str]:
        """Accounts with items to run (queued, or running on a lease that ran out), in order."""
        now = self.now()  # (before the connection: it may take one of its own)
        with database_errors(), self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(batch_items.c.owner).where(_free(now))
                                            .distinct().order_by(batch_items.c.owner))]

    def claim(self, server: str, lease_s: float, owner: str, max_attempts: int,
              exclude: tuple[int, ...] = ()) -> Claim | None:
        """Lease ``owner``'s next item to run: its oldest queued one (or one whose lease ran out) of a
        batch in progress whose completion window is still open, not one of ``exclude`` (those this
        server runs); None when there is none. An item tried ``max_attempts`` times already fails
        instead (an item that kills its server is not retried for ever)."""
        now = self.now()
        query = (sa.select(batch_items).where(_free(now), batch_items.c.owner == owner, batch_items.c.batch_id.in_(
            sa.select(batches.c.id).where(batches.c.status == "in_progress", batches.c.expires_at > now))))
        if exclude:
            query = query.where(batch_items.c.id.not_in(exclude))
        query = query.order_by(batch_items.c.id).limit(1).with_for_update(skip_locked=True)
        with database_errors(), self.engine.begin() as c:
            row = c.execute(query).mappings().first()
            if row is None:
                return None
            attempt = row["attempts"] + 1
            if attempt > max_attempts:
                c.execute(batch_items.update().where(batch_items.c.id == row["id"],
                                                     batch_items.c.attempts == row["attempts"]).values(
                    state="failed", finished_at=now, lease_owner=None, lease_until=None, error_code="gave_up",
                    error_message=f"tried {row['attempts']} times (batch.max_attempts); its servers died or "
                                  "stalled each time"))
            else:
                taken = c.execute(batch_items.update().where(batch_items.c.id == row["id"],
                                                             batch_items.c.attempts == row["attempts"])
                                  .values(state="running", attempts=attempt, lease_owner=server,
                                          lease_until=now + timedelta(seconds=lease_s))).rowcount
                if not taken:  # (SQLite: another writer changed it between the two statements)
                    return None
        if attempt > max_attempts:  # (the batch settles in a transaction of its own: its row is locked first)
            with database_errors(), self.engine.begin() as c:
                _lock(c, row["batch_id"])
                _settle(c, row["batch_id"], now)
            return None
        return Claim(row["id"], row["batch_id"], row["owner"], row["custom_id"], row["line"], row["request"], attempt)

    def renew(self, server: str, claims: list[Claim], lease_s: float) -> set[int]:
        """Extend the leases still ours; the ids of those lost (another server took them, or they ended)."""
        lost = set()
        until = self.now() + timedelta(seconds=lease_s)
        with database_errors(), self.engine.begin() as c:
            for claim in claims:
                if not c.execute(_mine(claim, server).values(lease_until=until)).rowcount:
                    lost.add(claim.id)
        return lost

    def finish(self, claim: Claim, server: str, *, state: str, result_key: str | None = None,
               sha256: str | None = None, size: int | None = None, duration_s: float | None = None,
               error_code: str | None = None, error_message: str | None = None,
               audit_end: tuple[str, dict[str, Any]] | None = None) -> bool:
        """End the item (completed or failed) if our lease is still the current one; False when it is
        not (its result must not be shown). Settles the batch when it was the last item.
        ``audit_end`` (the attempt's audit entry id and its end values) completes its audit row in the
        same transaction: a crash can never leave a completed item whose row says otherwise."""
        now = self.now()
        with database_errors(), self.engine.begin() as c:
            _lock(c, claim.batch_id)  # (two last items ending at once: the second sees the first's end)
            done = c.execute(_mine(claim, server).values(
                state=state, finished_at=now, lease_until=None, result_key=result_key, sha256=sha256, bytes=size,
                duration_s=duration_s, error_code=error_code, error_message=error_message)).rowcount
            if done:
                _settle(c, claim.batch_id, now)
                if audit_end is not None:  # (no row yet when its start was spooled: the trail's end op completes it)
                    c.execute(audit.update().where(audit.c.entry_id == audit_end[0]).values(**audit_end[1]))
            else:  # (a retry after a commit whose answer was lost finds it done already: that is ours)
                done = c.execute(sa.select(sa.func.count()).where(
                    batch_items.c.id == claim.id, batch_items.c.state == state, batch_items.c.attempts == claim.attempt,
                    batch_items.c.lease_owner == server, batch_items.c.result_key == result_key)).scalar()
        return bool(done)

    def reclaim(self, server_prefix: str) -> int:
        """Items an earlier run of this server left running (it died): queued again at once, without
        waiting for their leases to run out. The number of items."""
        with database_errors(), self.engine.begin() as c:
            return c.execute(batch_items.update().where(
                batch_items.c.state == "running", batch_items.c.lease_owner.startswith(server_prefix, autoescape=True)
            ).values(state="queued", lease_owner=None, lease_until=None)).rowcount

    def release(self, claim: Claim, server: str) -> None:
        """Give a claimed item back unfinished (this server is stopping, a store is down): queued again
        at once, the attempt not counted against batch.max_attempts (only attempts whose server died
        or stalled are). Result keys carry a token of their own: a number used again names another file."""
        with database_errors(), self.engine.begin() as c:
            c.execute(_mine(claim, server).values(state="queued", lease_owner=None, lease_until=None,
                                                  attempts=claim.attempt - 1))

    def items(self, batch_id: str, owner: str, states: tuple[str, ...]) -> Iterator[dict[str, Any]]:
        """The batch's items in these states, in input order (read in pages: a large batch is never all in memory)."""
        self.get(batch_id, owner)
        last = 0
        while True:
            with database_errors(), self.engine.connect() as c:
                page = c.execute(sa.select(batch_items).where(
                    batch_items.c.batch_id == batch_id, batch_items.c.state.in_(states), batch_items.c.line > last
                ).order_by(batch_items.c.line).limit(500)).mappings().all()
            if not page:
                return
            yield from (dict(r) for r in page)
            last = page[-1]["line"]

    def item(self, batch_id: str, owner: str, custom_id: str) -> dict[str, Any]:
        self.get(batch_id, owner)
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(batch_items).where(batch_items.c.batch_id == batch_id,
                                                         batch_items.c.custom_id == custom_id)).mappings().first()
        if row is None:
            raise UnknownBatch(f"batch {batch_id} has no item with that custom_id")
        return dict(row)

    # --- upkeep ----------------------------------------------------------------------------------

    def expire(self) -> int:
        """Upkeep. Items of batches past their completion window that are queued, or running on a lease
        that ran out, expire; items of batches being cancelled that no server runs any more are
        cancelled; such batches with nothing left running are settled. The items expired."""
        now = self.now()
        n = 0
        with database_errors(), self.engine.connect() as c:
            due = c.execute(sa.select(batches.c.id).where(sa.or_(
                batches.c.status == "cancelling", sa.and_(batches.c.status == "in_progress", batches.c.expires_at < now)
            ))).scalars().all()
        for batch_id in due:
            with database_errors(), self.engine.begin() as c:
                _lock(c, batch_id)
                status = c.execute(sa.select(batches.c.status).where(batches.c.id == batch_id)).scalar()
                if status == "cancelling":
                    c.execute(batch_items.update().where(batch_items.c.batch_id == batch_id, _free(now)).values(
                        state="cancelled", finished_at=now, lease_until=None, error_code="cancelled",
                        error_message="the batch was cancelled before this item ran"))
                else:
                    n += c.execute(batch_items.update().where(batch_items.c.batch_id == batch_id, _free(now)).values(
                        state="expired", finished_at=now, lease_until=None, error_code="expired",
                        error_message="the batch's completion window ended before this item was done")).rowcount
                _settle(c, batch_id, now)
        return n

    def ended_before(self, age: timedelta) -> list[str]:
        """Batches that ended more than ``age`` ago (past retention)."""
        when = self.now() - age
        with database_errors(), self.engine.connect() as c:
            return [r[0] for r in c.execute(sa.select(batches.c.id).where(batches.c.ended_at < when))]

    def delete(self, batch_id: str) -> None:
        with database_errors(), self.engine.begin() as c:
            c.execute(batch_items.delete().where(batch_items.c.batch_id == batch_id))
            c.execute(batches.delete().where(batches.c.id == batch_id))

    def load(self) -> dict[str, float]:
        """Server-wide figures for the metrics: items queued and running, and the oldest queued item's age (s)."""
        with database_errors(), self.engine.connect() as c:
            counts = dict(c.execute(sa.select(batch_items.c.state, sa.func.count()).where(
                batch_items.c.state.in_(ACTIVE)).group_by(batch_items.c.state)).all())
            oldest = c.execute(sa.select(sa.func.min(batch_items.c.queued_at)).where(
                batch_items.c.state == "queued")).scalar()
        age = (self.now() - in_utc(oldest)).total_seconds() if oldest is not None else 0.0
        return {"queued": counts.get("queued", 0), "running": counts.get("running", 0), "oldest_s": max(0.0, age)}


def _free(now: datetime) -> Any:
    """Items ready to be claimed: queued, or running on a lease that ran out."""
    return sa.or_(batch_items.c.state == "queued",
                  sa.and_(batch_items.c.state == "running", batch_items.c.lease_until < now))


def _mine(claim: Claim, server: str) -> Any:
    """An UPDATE of the item that applies only while ``server`` holds its current lease."""
    return batch_items.update().where(batch_items.c.id == claim.id, batch_items.c.state == "running",
                                      batch_items.c.lease_owner == server, batch_items.c.attempts == claim.attempt)


def _counts(c: sa.Connection, batch_ids: list[str]) -> dict[str, dict[str, int]]:
    out = {b: dict.fromkeys(ITEM_STATES, 0) for b in batch_ids}
    if batch_ids:
        for batch_id, state, n in c.execute(sa.select(batch_items.c.batch_id, batch_items.c.state, sa.func.count())
                                            .where(batch_items.c.batch_id.in_(batch_ids))
                                            .group_by(batch_items.c.batch_id, batch_items.c.state)):
            out[batch_id][state] = n
    return out


def _lock(c: sa.Connection, batch_id: str) -> None:
    """Hold the batch's row until the transaction ends (PostgreSQL; SQLite's writer lock orders writers already)."""
    if c.dialect.name == "postgresql":
        c.execute(sa.select(batches.c.id).where(batches.c.id == batch_id).with_for_update())


def _settle(c: sa.Connection, batch_id: str, now: datetime) -> None:
    """A batch with no item queued or running ends: cancelled (it was being cancelled), expired (its
    window ended with items undone), else completed."""
    left = c.execute(sa.select(sa.func.count()).select_from(batch_items).where(
        batch_items.c.batch_id == batch_id, batch_items.c.state.in_(ACTIVE))).scalar()
    if left:
        return
    status = c.execute(sa.select(batches.c.status).where(batches.c.id == batch_id)).scalar()
    if status not in ("in_progress", "cancelling"):
        return
    undone = c.execute(sa.select(sa.func.count()).select_from(batch_items).where(
        batch_items.c.batch_id == batch_id, batch_items.c.state == "expired")).scalar()
    final = "cancelled" if status == "cancelling" else "expired" if undone else "completed"
    c.execute(batches.update().where(batches.c.id == batch_id, batches.c.status.in_(("in_progress", "cancelling")))
              .values(status=final, ended_at=now))
