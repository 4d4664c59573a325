"""The voice registry on a real SQLite database: migrations, ownership, names, limits, errors."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from lyre.errors import DatabaseError, InvalidRequest, TooManyVoices, UnknownVoice, VoiceExists
from lyre.storage import db
from lyre.storage.registry import VoiceRegistry


def voice_row(name: str = "Ann", owner: str = "alice") -> dict:
    return {"name": name, "owner": owner, "transcript": "Hello there.", "audio_flac": b"fLaC...", "audio_sha256": "a" * 64,
            "duration_s": 4.2, "ref_token_ids": [128266, 132362], "codec_id": "snac-sha256:x", "model_id": "demo",
            "consent": {"granted": True, "speaker": "Ann", "source": "self_recorded"}}


@pytest.fixture
def registry(database_url) -> VoiceRegistry:
    """On SQLite and on PostgreSQL."""
    return VoiceRegistry(db.open_database(database_url), max_per_account=3)


def test_migrations_build_exactly_the_tables_the_code_uses_and_run_once(database_url, tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'lyre.db'}" if database_url.startswith("sqlite") else database_url
    engine = db.open_database(url)  # (a SQLite file's folder is created)
    with engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), db.metadata) == []
        assert c.execute(sa.text("select version_num from alembic_version")).scalar() is not None
    db.open_database(url)  # current already: nothing to do, nothing fails


def test_a_voice_is_visible_only_to_its_account(registry):
    v = registry.add(**voice_row())
    assert v.id.startswith("v_") and len(v.id) == 18 and v.created_at.tzinfo is not None
    assert registry.get(v.id, "alice").ref_token_ids == (128266, 132362)
    assert [x.id for x in registry.list("alice")] == [v.id] and registry.list("bob") == []
    for call in (lambda: registry.get(v.id, "bob"), lambda: registry.delete(v.id, "bob")):
        with pytest.raises(UnknownVoice) as other:
            call()
    with pytest.raises(UnknownVoice) as missing:
        registry.get("v_" + "x" * 16, "alice")
    assert str(other.value).replace(v.id, "ID") == str(missing.value).replace("v_" + "x" * 16, "ID")  # nothing leaks
    registry.delete(v.id, "alice")
    with pytest.raises(UnknownVoice):
        registry.get(v.id, "alice")
    with pytest.raises(UnknownVoice):
        registry.delete(v.id, "alice")


@pytest.mark.parametrize("bad", ["../etc/passwd", "%2e%2e", "v_abc\0def", "v_" + "a" * 16 + "/..", "", None, 7,
                                 "V_" + "a" * 16, "v_" + "a" * 15])
def test_ids_that_are_not_ours_are_unknown_before_the_database_is_asked(registry, bad):
    with pytest.raises(UnknownVoice, match="no voice that id"):
        registry.get(bad, "alice")


def test_names_are_unique_per_account_and_checked(registry):
    registry.add(**voice_row("Ann"))
    registry.add(**voice_row("Ann", owner="bob"))  # another account may use the name
    with pytest.raises(VoiceExists):
        registry.add(**voice_row("Ann"))
    with pytest.raises(VoiceExists, match="already has a voice named 'Ann'"):
        registry.add(**voice_row(" Ann "))
    for bad, message in [("", "required"), ("x" * 65, "at most 64"), ("An\u0007n", "control character U\\+0007"),
                         ("A\u202en", "U\\+202E")]:
        with pytest.raises(InvalidRequest, match=message):
            registry.add(**voice_row(bad))


def test_two_concurrent_enrollments_with_one_name_one_wins(registry):
    barrier, results = threading.Barrier(4), []

    def enroll():
        barrier.wait()
        try:
            results.append(registry.add(**voice_row("Same")).id)
        except (VoiceExists, TooManyVoices) as e:
            results.append(e)

    threads = [threading.Thread(target=enroll) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, str) for r in results) == 1 and sum(isinstance(r, VoiceExists) for r in results) == 3
    assert len(registry.list("alice")) == 1


def test_racing_enrollments_never_pass_the_account_limit(registry):
    barrier, results = threading.Barrier(6), []

    def enroll(i: int):
        barrier.wait()
        try:
            results.append(registry.add(**voice_row(f"racer{i}")).id)
        except TooManyVoices as e:
            results.append(e)

    threads = [threading.Thread(target=enroll, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, str) for r in results) == 3 and len(registry.list("alice")) == 3


def test_an_account_holds_at_most_max_per_account_voices(registry):
    for i in range(3):
        registry.add(**voice_row(f"v{i}"))
    with pytest.raises(TooManyVoices, match="holds 3 cloned voices"):
        registry.add(**voice_row("v3"))
    assert len(registry.list("alice")) == 3 and registry.add(**voice_row("v0", owner="bob"))


def test_a_read_only_database_is_a_clear_error_naming_the_file(tmp_path):
    path = tmp_path / "ro.db"
    sqlite3.connect(path).close()  # an empty database file
    with pytest.raises(DatabaseError, match=f"cannot open the database file {path}: .*read-only"):
        db.open_database(f"sqlite:///file:{path}?mode=ro&uri=true")


def test_a_locked_database_is_a_clear_error_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(db, "LOCK_WAIT_S", 0.2)
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DatabaseError, match=f"cannot open the database file {path}.*another process holds a lock"):
            db.open_database(f"sqlite:///{path}")
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_path_that_cannot_be_a_database_is_a_clear_error(tmp_path):
    (tmp_path / "adir.db").mkdir()
    with pytest.raises(DatabaseError, match=f"cannot open the database file {tmp_path / 'adir.db'}"):
        db.open_database(f"sqlite:///{tmp_path / 'adir.db'}")
