"""The audit trail through the library API: one row per synthesis with the hashes of what was said
and delivered; a database that cannot be written refuses new syntheses and loses no row; old rows
are pruned; ``lyre audit export`` reads them back."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import sqlalchemy as sa

from lyre.config import AuditConfig
from lyre.errors import DatabaseError, SynthesisCancelled
from lyre.storage.db import audit, open_database
from lyre.trust.audit import AuditTrail, row_outcome, rows
from lyre.trust.audit_spool import Spool
from tests.support.paths import REPO_ROOT
from tests.support.services import run, service
from tests.support.waiting import until

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def all_rows(tts) -> list[dict]:
    assert tts.audit.flush()
    return list(rows(tts.database, EPOCH))


def test_every_synthesis_leaves_one_row_with_the_hashes_of_its_text_and_audio():
    async def go():
        async with service() as tts:
            a = await tts.synthesize("Audit me, please.", voice="leo", account="alice")
            stream = tts.stream("I will be cut short.", voice="ash")  # an alias: recorded as its voice
            async for _ in stream:
                break
            await stream.aclose()
            utterance = tts.utterance("mia", account="bob", protocol="ws")
            utterance.append("First part. ")
            utterance.append("Second part.")
            utterance.end()
            pcm = np.concatenate([c.pcm async for c in utterance])
            return a, pcm, all_rows(tts)

    a, utterance_pcm, got = run(go())
    assert len(got) == 3
    first, cut, utt = got
    assert (first["account"], first["voice"], first["protocol"], first["outcome"], first["reason"]) == (
        "alice", "leo", "library", "completed", "length")  # (how generation stopped: the tests' max_tokens)
    assert first["text_sha256"] == hashlib.sha256(b"Audit me, please.").hexdigest()
    assert first["pcm_sha256"] == hashlib.sha256(a.pcm.astype("<i2").tobytes()).hexdigest()
    assert abs(first["audio_seconds"] - a.seconds) < 1e-9
    assert (cut["voice"], cut["account"], cut["outcome"], cut["reason"]) == ("leo", "default", "cancelled", "")
    assert 0 < cut["audio_seconds"] < a.seconds
    assert (utt["account"], utt["protocol"], utt["voice"], utt["outcome"], utt["reason"]) == (
        "bob", "ws", "mia", "completed", "length")  # (an utterance's: the worst of its pieces')
    assert all(r["ended"] is not None and r["ended"] >= r["time"] for r in got)
    assert utt["text_sha256"] == hashlib.sha256(b"First part. Second part.").hexdigest()  # as appended
    assert utt["pcm_sha256"] == hashlib.sha256(utterance_pcm.astype("<i2").tobytes()).hexdigest()
    assert datetime.fromisoformat(first["time"]) <= datetime.fromisoformat(utt["time"])


def test_a_synthesis_the_server_ends_is_recorded_with_its_reason():
    async def go():
        async with service() as tts:
            stream = tts.stream("Nobody reads me fast enough.")
            await anext(stream)
            await tts.on_engine_thread(lambda: tts.scheduler.cancel(stream.session_id, "slow_consumer"))
            with pytest.raises(SynthesisCancelled):
                async for _ in stream:
                    pass
            return all_rows(tts)

    assert [(r["outcome"], r["reason"]) for r in run(go())] == [("slow_consumer", "slow_consumer")]


def test_a_database_that_cannot_be_written_refuses_new_syntheses_and_loses_no_row(monkeypatch):
    """What cannot reach the database goes to the fsynced spool, new syntheses are refused meanwhile
    (audit.required), and the spool is written once the database takes rows again."""
    async def go():
        async with service() as tts:
            write = tts.audit._write

            def full(ops, once=False):
                raise sa.exc.OperationalError("INSERT INTO audit", {}, Exception("database or disk is full"))

            monkeypatch.setattr(tts.audit, "_write", full)
            await tts.synthesize("Written while the disk is full.")
            assert await asyncio.to_thread(tts.audit.flush, 10.0)  # taken: into the spool
            spooled = [json.loads(line)["op"] for line in tts.audit.spool.path.read_text().splitlines()]
            with pytest.raises(DatabaseError, match="audit trail cannot be written .*disk is full"):
                tts.stream("Refused: it would go unrecorded.")
            with pytest.raises(DatabaseError):
                tts.utterance()
            monkeypatch.setattr(tts.audit, "_write", write)  # space again: the spool goes in
            await asyncio.to_thread(until, lambda: not tts.audit.spool.waiting and tts.audit.error is None,
                                    what="the spool to be written")
            await tts.synthesize("Accepted again.")
            return spooled, all_rows(tts)

    spooled, got = run(go())
    assert spooled == ["start", "end"]
    assert [(r["text_sha256"], r["outcome"]) for r in got] == [(hashlib.sha256(t).hexdigest(), "completed") for t in (
        b"Written while the disk is full.", b"Accepted again.")]


def test_a_row_is_open_while_its_synthesis_runs_and_written_before_its_first_audio():
    async def go():
        async with service(**{"sampling.max_tokens": 420, "sampling.min_tokens": 420}) as tts:
            stream = tts.stream("A long one.")
            await anext(stream)  # the first chunk came out only once its row was written
            with tts.database.connect() as c:
                during = [dict(r) for r in c.execute(sa.select(audit.c.outcome, audit.c.ended)).mappings()]
            await stream.aclose()
            return during, all_rows(tts)

    during, after = run(go())
    assert during == [{"outcome": "started", "ended": None}]
    assert [r["outcome"] for r in after] == ["cancelled"]


def test_a_spool_a_crash_left_is_written_and_open_rows_closed_as_interrupted_at_the_next_start(tmp_path, database_url):
    """A server that died while the database was away: its spool goes in at the next start, and its
    rows left open (started, never ended) are closed as interrupted; another server's stay open."""
    engine = open_database(database_url)
    spool = tmp_path / "audit-spool.jsonl"
    started = {"time": datetime.now(timezone.utc), "account": "a", "voice": "tara", "protocol": "rest",
               "outcome": "started", "reason": "", "audio_seconds": 0.0, "text_sha256": "t" * 64,
               "pcm_sha256": "p" * 64, "ended": None}
    ended = {"outcome": "completed", "reason": "", "audio_seconds": 2.0, "text_sha256": "t" * 64,
             "pcm_sha256": "q" * 64, "ended": datetime.now(timezone.utc)}
    Spool(spool).append([{"op": "start", "row": {**started, "entry_id": "e1", "instance": "me"}},
                         {"op": "end", "entry_id": "e1", "values": ended},
                         {"op": "start", "row": {**started, "entry_id": "e2", "instance": "me"}}])
    with open(spool, "a") as f:
        f.write('{"op": "start", "row": {"ti')  # the crash cut the last line short
    with engine.begin() as c:
        c.execute(audit.insert(), [{**started, "entry_id": "e3", "instance": "another"}])
    trail = AuditTrail(engine, AuditConfig(), spool=spool, instance="me")
    assert trail.flush()
    trail.close()
    with engine.connect() as c:
        got = {r.entry_id: (r.outcome, r.audio_seconds) for r in c.execute(sa.select(audit))}
    assert got == {"e1": ("completed", 2.0), "e2": ("interrupted", 0.0), "e3": ("started", 0.0)}
    assert spool.read_text() == ""


@pytest.mark.parametrize("outcome, reason, row", [
    ("finished", None, ("completed", "")), ("finished", "end_of_speech", ("completed", "end_of_speech")),
    ("cancelled", "cancelled", ("cancelled", "")),
    ("cancelled", "slow_consumer", ("slow_consumer", "slow_consumer")), ("cancelled", "timeout", ("timeout", "timeout")),
    ("cancelled", "shutdown", ("shutdown", "shutdown")), ("failed", "engine error", ("error", "engine error")),
    ("cancelled", "delivery_failed", ("error", "delivery_failed"))])
def test_every_ending_has_its_own_outcome(outcome, reason, row):
    assert row_outcome(outcome, reason) == row


def test_rows_older_than_the_retention_are_pruned(database_url):
    engine = open_database(database_url)
    now = datetime.now(timezone.utc)
    old = {"account": "a", "voice": "tara", "protocol": "rest", "outcome": "completed", "reason": "",
           "audio_seconds": 1.0, "text_sha256": "t" * 64, "pcm_sha256": "p" * 64}
    with engine.begin() as c:
        c.execute(audit.insert(), [{**old, "time": now - timedelta(days=91)}, {**old, "time": now - timedelta(days=89)}])
    trail = AuditTrail(engine, AuditConfig(retention_days=90))  # prunes at start
    assert trail.flush()
    trail.close()
    assert [r["time"][:10] for r in rows(engine, EPOCH)] == [(now - timedelta(days=89)).date().isoformat()]


def test_export_writes_csv_and_json_lines_for_an_investigation(tmp_path, database_url, capsys):
    from lyre.tools.audit import main

    database = {} if database_url.startswith("sqlite") else {"voices.database_url": database_url}

    async def go():
        async with service(data_dir=str(tmp_path), **database) as tts:
            await tts.synthesize("One.", voice="tara")
            await tts.synthesize("Two.", voice="zac", account="bob")
            tts.audit.flush()

    run(go())

    def export(*args: str) -> tuple[int, str, str]:
        where = [f"voices.database_url={database_url}"] if database else []
        capsys.readouterr()
        try:
            code = main(["export", "--set", f"data_dir={tmp_path}", *[x for w in where for x in ("--set", w)], *args])
        except SystemExit as e:  # argparse's refusals
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    today = datetime.now(timezone.utc).date().isoformat()
    code, out, err = export("--since", today, "--format", "jsonl")
    assert code == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [r["voice"] for r in got] == ["tara", "zac"] and "2 rows" in err
    code, _, _ = export("--since", today, "--voice", "zac", "--output", str(tmp_path / "zac.csv"))
    assert code == 0 and (tmp_path / "zac.csv").read_text().splitlines()[0].startswith("time,ended,account,voice")
    assert len((tmp_path / "zac.csv").read_text().splitlines()) == 2
    assert export("--since", "2999-01-01")[1].splitlines() == ["time,ended,account,voice,protocol,outcome,reason,"
                                                               "audio_seconds,text_sha256,pcm_sha256,trace"]
    code, _, err = export("--since", "last tuesday")
    assert code == 2 and "is not a date" in err


def test_the_audit_command_runs_as_a_user_runs_it(tmp_path):
    """The one ``lyre audit`` process of the suite: the installed command runs and exits 0."""
    out = subprocess.run([sys.executable, "-m", "lyre", "audit", "export", "--since", "2000-01-01",
                          "--set", f"data_dir={tmp_path}"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("time,ended,account,voice") and "0 rows" in out.stderr


def test_a_start_whose_recovery_fails_tries_again_instead_of_refusing_for_ever(tmp_path, monkeypatch):
    """The database blinks while the trail starts: it refuses (audit.required) only until its
    recovery is tried again and works."""
    import lyre.trust.audit as trail_module

    engine = open_database(f"sqlite:///{tmp_path / 'lyre.db'}")
    real, calls = trail_module.close_open_rows, []

    def blink(c, instance, **kwargs):
        calls.append(instance)
        if len(calls) == 1:
            raise sa.exc.OperationalError("UPDATE audit", {}, Exception("database is locked"))
        return real(c, instance, **kwargs)

    monkeypatch.setattr(trail_module, "close_open_rows", blink)
    trail = AuditTrail(engine, AuditConfig(), spool=tmp_path / "spool.jsonl", instance="me")
    try:
        until(lambda: len(calls) >= 2 and trail.error is None, what="the recovery to be tried again")
        assert not trail.refusing
    finally:
        trail.close()


def _start(entry_id: str) -> dict:
    return {"op": "start", "row": {"time": datetime.now(timezone.utc), "account": "a", "voice": "tara",
                                   "protocol": "rest", "outcome": "started", "reason": "", "audio_seconds": 0.0,
                                   "text_sha256": "t" * 64, "pcm_sha256": "p" * 64, "ended": None,
                                   "entry_id": entry_id, "instance": "me"}}


def test_the_spool_is_replayed_a_chunk_at_a_time_in_order_and_a_torn_line_spoils_no_later_op(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([_start("e1")])
    with open(spool.path, "a") as f:
        f.write('{"op": "start", "row": {"ti')  # a crash cut this append short
    spool.append([_start(f"e{i}") for i in (2, 3, 4)])  # the next start appends after it
    written = []

    def write(ops):
        written.append([op["row"]["entry_id"] for op in ops])

    assert spool.replay(write, most=2) == 2 and spool.waiting  # e1 and e2 (the torn line skipped)
    assert spool.replay(write, most=2) == 2 and not spool.waiting
    assert written == [["e1", "e2"], ["e3", "e4"]]

    spool.append([_start("e5")])

    def fail(ops):
        raise sa.exc.OperationalError("INSERT", {}, Exception("database is locked"))

    with pytest.raises(sa.exc.OperationalError):
        spool.replay(fail, most=1)
    assert spool.replay(write) == 1 and written[-1] == ["e5"]  # a failed replay kept it


def test_while_the_spool_goes_in_new_rows_join_it_and_their_first_audio_does_not_wait(tmp_path):
    """After an outage, the spool's replay can be long: a new synthesis's row is appended behind it
    (fsynced, so as safe) and its first audio goes on, while the spool is written a chunk at a time."""
    import threading

    engine = open_database(f"sqlite:///{tmp_path / 'lyre.db'}")
    trail = AuditTrail(engine, AuditConfig(), spool=tmp_path / "spool.jsonl", instance="me")
    try:
        assert trail.flush()  # its start's recovery is done
        trail.spool.append([_start("e1"), _start("e2")])  # what an outage left
        release, real = threading.Event(), trail._write

        def slow(ops, once=False):
            assert release.wait(60)
            real(ops, once)

        trail._write = slow  # the database is slow to take the spool
        taken = threading.Event()
        trail.record(_start("e3"), taken.set)
        assert taken.wait(30) and not release.is_set()  # taken while the spool was still being written
        release.set()
        until(lambda: not trail.spool.waiting, what="the spool to be written")
        assert trail.flush()
    finally:
        trail.close()
    with engine.connect() as c:
        assert [r.entry_id for r in c.execute(sa.select(audit).order_by(audit.c.id))] == ["e1", "e2", "e3"]


def test_two_servers_on_one_data_dir_take_turns_with_the_spool(tmp_path):
    """An append waits while another process holds the spool (its replay, say), then lands whole."""
    import fcntl
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.locks import someone_waits_on

    spool = Spool(tmp_path / "spool.jsonl")
    spool.append([_start("e1")])
    with open(tmp_path / "spool.jsonl.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the other server's replay would
        appending = ThreadPoolExecutor(1).submit(spool.append, [_start("e2")])
        until(lambda: someone_waits_on(lock), what="the append to wait for the lock")
        assert not appending.done()
    appending.result(timeout=60)
    assert [json.loads(line)["row"]["entry_id"] for line in spool.path.read_text().splitlines()] == ["e1", "e2"]
