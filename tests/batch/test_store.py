"""The batch store on each real database (SQLite, PostgreSQL): only the current lease's holder ends an
item; a lost lease is taken by another server and the first one's result refused; attempts are never
reused and an item tried batch.max_attempts times fails; a cancelled batch whose items nobody runs
any more settles; two servers claiming at once never take the same item; the attempt whose result
is the item's has its audit row completed in the item's own transaction."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import numpy as np
import sqlalchemy as sa

from lyre.storage.batches import BatchStore
from lyre.storage.db import audit, batch_items, batches, open_database
from lyre.trust.audit_entry import AuditEntry
from lyre.trust.audit_spool import apply


def make(database_url: str, n: int = 3, owner: str = "acme") -> tuple[BatchStore, str]:
    store = BatchStore(open_database(database_url))
    row, created = store.create(owner=owner, items=[{"line": i + 1, "custom_id": f"r{i}", "request": {"text": "x"}}
                                                    for i in range(n)],
                                input_sha256="0" * 64, input_bytes=10, completion_window="24h", window_s=86400.0,
                                meta={}, idempotency_key=None, max_items=1000)
    assert created
    return store, row["id"]


def age_leases(store: BatchStore, seconds: float) -> None:
    """Leases as if ``seconds`` had passed (the store reads time from the clock: move the rows instead)."""
    with store.engine.begin() as c:
        held = c.execute(sa.select(batch_items.c.id, batch_items.c.lease_until)
                         .where(batch_items.c.lease_until.is_not(None))).all()
        for item_id, until in held:
            c.execute(batch_items.update().where(batch_items.c.id == item_id)
                      .values(lease_until=until - timedelta(seconds=seconds)))


def test_only_the_current_leases_holder_ends_an_item(database_url):
    store, batch_id = make(database_url, n=1)
    first = store.claim("a/1", 30.0, "acme", 5)
    assert first is not None and first.attempt == 1
    assert store.claim("b/1", 30.0, "acme", 5) is None  # held
    age_leases(store, 60)  # a's lease ran out (it stalled, or died)
    second = store.claim("b/1", 30.0, "acme", 5)
    assert second is not None and second.id == first.id and second.attempt == 2
    assert store.renew("a/1", [first], 30.0) == {first.id}  # a learns it lost the item
    assert not store.finish(first, "a/1", state="completed", result_key="k1", sha256="1" * 64, size=1, duration_s=1.0)
    assert store.finish(second, "b/1", state="completed", result_key="k2", sha256="2" * 64, size=2, duration_s=1.0)
    [row] = list(store.items(batch_id, "acme", ("completed",)))
    assert row["result_key"] == "k2" and row["attempts"] == 2
    assert store.get(batch_id, "acme")["status"] == "completed"


def test_an_item_whose_servers_die_too_often_fails_but_give_backs_do_not_count(database_url):
    store, batch_id = make(database_url, n=1)
    for _ in range(3):  # given back (its server stopping, a store down): not counted
        claim = store.claim("a/1", 30.0, "acme", 2)
        assert claim.attempt == 1
        store.release(claim, "a/1")
    for attempt in (1, 2):  # its server dies holding it: counted
        assert store.claim("a/1", 30.0, "acme", 2).attempt == attempt
        age_leases(store, 60)
    assert store.claim("a/1", 30.0, "acme", 2) is None  # a third try: it fails instead
    [row] = list(store.items(batch_id, "acme", ("failed",)))
    assert row["error_code"] == "gave_up" and "batch.max_attempts" in row["error_message"]
    assert store.get(batch_id, "acme")["status"] == "completed"  # (every item ended; the error file has it)


def test_a_replica_whose_clock_runs_ahead_does_not_take_live_leases(postgres):
    """Leases are on PostgreSQL's clock: a replica ten minutes ahead sees another's 30 s lease as held."""
    from tests.support.postgres import fresh_schema

    store, batch_id = make(fresh_schema(postgres.url), n=1)
    ahead = BatchStore(store.engine, clock=lambda: datetime.now(timezone.utc) + timedelta(minutes=10))
    assert store.claim("a/1", 30.0, "acme", 5) is not None
    assert ahead.claim("b/1", 30.0, "acme", 5) is None
    assert abs(ahead.now() - store.now()) < timedelta(seconds=5)
    age_leases(store, 60)  # (a stalled: the lease ran out on the database's clock)
    assert ahead.claim("b/1", 30.0, "acme", 5).attempt == 2


def test_no_item_is_claimed_once_its_batchs_window_has_closed(database_url):
    """(Before the upkeep has expired them: their batch still says in_progress.)"""
    store, batch_id = make(database_url, n=2)
    assert store.claim("a/1", 30.0, "acme", 5) is not None
    with store.engine.begin() as c:
        c.execute(batches.update().where(batches.c.id == batch_id).values(
            expires_at=sa.select(batches.c.created_at).where(batches.c.id == batch_id).scalar_subquery()))
    assert store.claim("a/1", 30.0, "acme", 5) is None


def test_a_retried_end_whose_first_commit_went_through_is_ours(database_url):
    store, batch_id = make(database_url, n=1)
    claim = store.claim("a/1", 30.0, "acme", 5)
    values = dict(state="completed", result_key="k1", sha256="1" * 64, size=1, duration_s=1.0)
    assert store.finish(claim, "a/1", **values)
    assert store.finish(claim, "a/1", **values)  # (its answer was lost: the retry must not disown the result)
    assert not store.finish(claim, "a/1", **{**values, "result_key": "k2"})


class Held:
    """An audit trail whose writer never runs (the server is killed before it writes the end)."""

    instance = "host:0"

    def __init__(self):
        self.ops = []

    def record(self, op, taken=None):
        self.ops.append(op)


def test_the_audit_row_of_the_attempt_that_completes_an_item_is_completed_with_it(database_url):
    store, batch_id = make(database_url, n=1)
    trail = Held()
    attempts = []
    for owner in ("a/1", "b/1"):
        claim = store.claim(owner, 30.0, "acme", 5)
        entry = AuditEntry(trail, "acme", "tara", "batch", trace=f"{batch_id}/r0")
        entry.begin()
        apply(store.engine, [trail.ops[-1]])  # its start row was written before its audio
        entry.add_pcm(np.ones(2400, dtype=np.int16))
        attempts.append((owner, claim, entry))
        age_leases(store, 60)  # (a stalls: b takes the item over)
    for owner, claim, entry in attempts:  # a's end is refused; b's completes the item and its audit row at once
        store.finish(claim, owner, state="completed", result_key=owner, sha256="1" * 64, size=1, duration_s=0.1,
                     audit_end=(entry.entry_id, entry.ending("finished")))
    with store.engine.connect() as c:
        rows = dict(c.execute(sa.select(audit.c.entry_id, audit.c.outcome).where(audit.c.trace == f"{batch_id}/r0")).all())
        seconds = c.execute(sa.select(audit.c.audio_seconds).where(audit.c.entry_id == attempts[1][2].entry_id)).scalar()
    assert rows == {attempts[0][2].entry_id: "started", attempts[1][2].entry_id: "completed"}
    assert seconds == 0.1  # (2,400 samples at 24 kHz)


def test_a_cancelled_batch_whose_running_item_lost_its_server_settles(database_url):
    store, batch_id = make(database_url, n=2)
    running = store.claim("a/1", 30.0, "acme", 5)
    assert store.cancel(batch_id, "acme")["status"] == "cancelling"  # one item still runs
    age_leases(store, 60)  # its server died
    store.expire()  # the upkeep
    done = store.get(batch_id, "acme")
    assert done["status"] == "cancelled" and done["counts"]["cancelled"] == 2
    assert not store.finish(running, "a/1", state="completed", result_key="k")


def test_servers_claiming_at_once_never_take_the_same_item(database_url):
    store, batch_id = make(database_url, n=40)
    taken: list[int] = []
    lock = threading.Lock()

    def server(name: str) -> None:
        while (claim := store.claim(name, 30.0, "acme", 5)) is not None:
            with lock:
                taken.append(claim.id)

    threads = [threading.Thread(target=server, args=(f"s{i}/1",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(taken) == sorted(set(taken)) and len(taken) == 40
    with store.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).where(batch_items.c.attempts != 1)).scalar() == 0
        assert c.execute(sa.select(batches.c.status).where(batches.c.id == batch_id)).scalar() == "in_progress"
