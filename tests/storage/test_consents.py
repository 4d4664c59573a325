"""Consent recordings on a real database, SQLite and PostgreSQL: ownership, ids, labels, the
account limit, and that no voice outlives the recording it was created with, also when the
recording's deletion races the voice's creation."""

from __future__ import annotations

import threading

import pytest

from lyre.errors import ConsentInUse, InvalidRequest, TooManyConsents, UnknownConsent
from lyre.storage import db
from lyre.storage.consents import ConsentRegistry
from lyre.storage.registry import VoiceRegistry
from tests.storage.test_registry import voice_row


def consent_row(name: str = "Ann's consent", owner: str = "alice") -> dict:
    return {"owner": owner, "name": name, "language": "en-US", "audio_flac": b"fLaC...", "audio_sha256": "a" * 64,
            "upload_sha256": "b" * 64, "duration_s": 4.5, "address": "127.0.0.1"}


@pytest.fixture
def registries(database_url) -> tuple[ConsentRegistry, VoiceRegistry]:
    """On SQLite and on PostgreSQL: the recordings and the voices, in one database."""
    engine = db.open_database(database_url)
    return ConsentRegistry(engine, max_per_account=3), VoiceRegistry(engine, max_per_account=100)


def test_a_consent_recording_is_visible_only_to_its_account(registries):
    consents, _ = registries
    c = consents.add(**consent_row())
    assert c.id.startswith("cons_") and len(c.id) == 21 and c.created_at.tzinfo is not None
    assert consents.get(c.id, "alice") == c and consents.audio(c.id, "alice") == b"fLaC..."
    assert consents.list("alice") == [c] and consents.list("bob") == []
    for call in (lambda: consents.get(c.id, "bob"), lambda: consents.rename(c.id, "bob", "Mine"),
                 lambda: consents.delete(c.id, "bob"), lambda: consents.audio(c.id, "bob")):
        with pytest.raises(UnknownConsent) as other:
            call()
    with pytest.raises(UnknownConsent) as missing:
        consents.get("cons_" + "x" * 16, "alice")
    assert str(other.value).replace(c.id, "ID") == str(missing.value).replace("cons_" + "x" * 16, "ID")
    assert consents.get(c.id, "alice").name == "Ann's consent"  # bob's rename changed nothing
    assert consents.rename(c.id, "alice", "  Ann  ").name == "Ann" and consents.get(c.id, "alice").name == "Ann"
    consents.delete(c.id, "alice")
    for call in (lambda: consents.get(c.id, "alice"), lambda: consents.delete(c.id, "alice")):
        with pytest.raises(UnknownConsent):
            call()


@pytest.mark.parametrize("bad", ["../etc/passwd", "%2e%2e", "cons_abc\0def", "cons_" + "a" * 16 + "/..", "", None,
                                 7, "v_" + "a" * 16, "cons_" + "a" * 15])
def test_ids_that_are_not_consent_ids_are_unknown_before_the_database_is_asked(registries, bad):
    consents, _ = registries
    with pytest.raises(UnknownConsent, match="no consent recording that id"):
        consents.get(bad, "alice")


def test_labels_are_checked_and_recordings_listed_newest_first(registries):
    consents, _ = registries
    for bad, message in [("", "required: a label"), ("x" * 65, "at most 64"), ("A\u202en", "U\\+202E")]:
        with pytest.raises(InvalidRequest, match=message):
            consents.add(**consent_row(bad))
    made = [consents.add(**consent_row("Same")).id for _ in range(2)]  # a label need not be unique
    assert [c.id for c in consents.list("alice")] == made[::-1]


def test_an_account_holds_at_most_max_per_account_recordings(registries):
    consents, _ = registries
    for i in range(3):
        consents.add(**consent_row(f"c{i}"))
    with pytest.raises(TooManyConsents, match="holds 3 consent recordings"):
        consents.add(**consent_row("c3"))
    assert len(consents.list("alice")) == 3 and consents.add(**consent_row("c0", owner="bob"))


def test_a_recording_in_use_stays_and_a_deleted_one_authorises_nothing(registries):
    consents, voices = registries
    c = consents.add(**consent_row())
    v = voices.add(**voice_row("Ann"), consent_id=c.id)
    assert voices.get(v.id, "alice").consent_id == c.id
    with pytest.raises(ConsentInUse, match=f"the voices {v.id} were created with it"):
        consents.delete(c.id, "alice")
    assert consents.get(c.id, "alice") == c  # the refusal deleted nothing
    with pytest.raises(UnknownConsent):  # another account's recording authorises none of bob's voices
        voices.add(**voice_row("Bob's", owner="bob"), consent_id=c.id)
    voices.delete(v.id, "alice")  # deleting the voice keeps the recording
    assert consents.get(c.id, "alice") == c
    consents.delete(c.id, "alice")
    with pytest.raises(UnknownConsent):
        voices.add(**voice_row("Late"), consent_id=c.id)
    assert voices.list("alice") == [] and voices.list("bob") == []


def race(consents: ConsentRegistry, voices: VoiceRegistry, consent_id: str, name: str) -> dict:
    """A voice created with ``consent_id`` while the recording is deleted, at once: each side's result."""
    barrier, results = threading.Barrier(2), {}

    def create() -> None:
        barrier.wait()
        try:
            results["voice"] = voices.add(**voice_row(name), consent_id=consent_id).id
        except UnknownConsent as e:
            results["voice"] = e

    def delete() -> None:
        barrier.wait()
        try:
            consents.delete(consent_id, "alice")
            results["deleted"] = True
        except ConsentInUse as e:
            results["deleted"] = e

    threads = [threading.Thread(target=create), threading.Thread(target=delete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_recording_deleted_while_a_voice_is_created_with_it_never_leaves_the_voice_without_it(registries):
    """Either the voice is stored and the deletion refused, or the deletion wins and the voice is not
    stored: never a voice whose recording is gone (the database orders the two)."""
    consents, voices = registries
    for i in range(6):
        c = consents.add(**consent_row(f"race{i}"))
        results = race(consents, voices, c.id, f"racer{i}")
        stored = isinstance(results["voice"], str)
        assert stored == isinstance(results["deleted"], ConsentInUse), results
        if stored:
            assert voices.get(results["voice"], "alice").consent_id == consents.get(c.id, "alice").id
            voices.delete(results["voice"], "alice")
            consents.delete(c.id, "alice")
        else:
            assert voices.list("alice") == []
    assert consents.list("alice") == [] and voices.list("alice") == []
