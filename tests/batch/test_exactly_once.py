"""Every batch item is done exactly once, through crashes and across replicas, checked by sha256:

- SQLite: a server SIGKILLed mid-batch and started again finishes the batch; each item has one
  output line whose audio matches its sha256, one file, and one completed audit row;
- PostgreSQL: two replicas drain one batch together while a third, which claimed items and died
  holding them, has them taken by the others once their leases run out; no item is done twice (the
  replicas run in this process: a process killed mid-batch is the SQLite test's)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import sqlalchemy as sa

from lyre.storage.batches import BatchStore
from lyre.storage.db import audit, batch_items
from tests.batch.conftest import audio_matches, items, lines, submit, wait_final
from tests.support.postgres import fresh_schema
from tests.support.servers import restart_server, serve_in_process, start_server
from tests.support.waiting import until

TEXT = "Item number {i} of a campaign, read in full so that the batch is still running when it is cut."


def progress(srv, batch_id: str) -> dict:
    import requests

    return requests.get(f"{srv.http}/v1/batches/{batch_id}", timeout=30).json()["request_counts"]


def check_exactly_once(http: str, batch: dict, database_url: str, results: Path, n: int) -> int:
    """Each of the ``n`` items: one output line, its audio matching, one file, one completed audit
    row; the attempts made (more than ``n`` when some were cut and run again)."""
    done = wait_final(http, batch["id"])
    assert done["status"] == "completed" and done["request_counts"]["completed"] == n, done
    out = lines(http, done["output_url"])
    assert sorted(line["custom_id"] for line in out) == sorted(f"r{i}" for i in range(n))
    digests = {line["sha256"] for line in out}
    for line in out:
        audio_matches(http, line)
    files = [p for p in (results / batch["id"]).iterdir()]
    assert len(files) == n and {hashlib.sha256(p.read_bytes()).hexdigest() for p in files} == digests
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as c:
            completed = c.execute(sa.select(audit.c.trace, sa.func.count()).where(
                audit.c.trace.like(batch["id"] + "/%"), audit.c.outcome == "completed").group_by(audit.c.trace)).all()
            attempts = c.execute(sa.select(sa.func.sum(batch_items.c.attempts)).where(
                batch_items.c.batch_id == batch["id"])).scalar()
    finally:
        engine.dispose()
    assert len(completed) == n and all(count == 1 for _, count in completed)
    return attempts


def test_a_server_killed_mid_batch_finishes_it_after_a_restart_each_item_once(demo_dir):
    n = 8
    srv = start_server("batch.poll_s=0.2", "batch.max_running=4")
    try:
        batch = submit(srv.http, items(n, text=TEXT)).json()
        until(lambda: progress(srv, batch["id"])["completed"] >= 2, 120, "two items to complete", interval=0.05)
        srv.proc.kill()  # SIGKILL mid-batch: items running, files half-written, leases held
        srv.proc.wait()
        assert progress_left(srv, batch["id"]) > 0  # (it was cut with items not done)
        srv = restart_server(srv)
        attempts = check_exactly_once(srv.http, batch, f"sqlite:///{srv.data_dir}/lyre.db",
                                      Path(srv.data_dir) / "batches", n)
        assert attempts > n  # the items cut were run again (and their first attempts never shown)
        assert not list((Path(srv.data_dir) / "batches" / ".partial").rglob("*.part"))
    finally:
        srv.stop()


def progress_left(srv, batch_id: str) -> int:
    """Items not completed, read from the stopped server's database."""
    engine = sa.create_engine(f"sqlite:///{srv.data_dir}/lyre.db")
    try:
        with engine.connect() as c:
            return c.execute(sa.select(sa.func.count()).where(batch_items.c.batch_id == batch_id,
                                                              batch_items.c.state != "completed")).scalar()
    finally:
        engine.dispose()


def test_two_replicas_drain_one_batch_and_take_a_dead_ones_items_each_once(postgres, tmp_path):
    url = fresh_schema(postgres.url)
    shared = tmp_path / "results"
    common = (f"voices.database_url={url}", f"batch.results_url={shared}", "batch.poll_s=0.2", "batch.lease_s=2",
              "batch.max_running=2")
    n = 12
    with serve_in_process(*common) as a, serve_in_process(*common) as b:
        batch = submit(a.http, items(n, text=TEXT)).json()
        # a third replica claims two items and dies holding them (its leases are never renewed)
        store = BatchStore(sa.create_engine(url))
        dead = [store.claim("dead-host:0/1", 2.0, "default", 5) for _ in range(2)]
        assert all(claim is not None for claim in dead)

        def both_working() -> bool:
            with store.engine.connect() as c:
                owners = c.execute(sa.select(batch_items.c.lease_owner).where(
                    batch_items.c.batch_id == batch["id"], batch_items.c.state == "running")).scalars().all()
            return len({o.split("/")[0] for o in owners if o and not o.startswith("dead-host")}) == 2

        until(both_working, 120, "both replicas to run items of the batch", interval=0.05)
        attempts = check_exactly_once(b.http, batch, url, shared, n)
        assert attempts >= n + 2  # the dead replica's two items were run again by a live one
        assert not any(store.finish(claim, "dead-host:0/1", state="completed", result_key="k") for claim in dead)
        store.engine.dispose()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
