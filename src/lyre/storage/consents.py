"""Consent recordings: rows of the ``voice_consents`` table, owned by accounts (OpenAI's voice
consents). A recording is the speaker saying they agree to their voice being cloned; a voice
created with one names it (``voices.consent_id``).

As in :mod:`lyre.storage.registry`: every lookup is by (id, account), and another account's
recording, a deleted one and an id that is not even well formed all raise the same
:class:`UnknownConsent` (404). Ids are server-generated (``cons_`` + 16 URL-safe characters). A
recording that voices were created with cannot be deleted (:class:`ConsentInUse`, 409): no voice
outlives the evidence of its consent. Its deletion and a voice's creation with it are ordered by
the database (:func:`lyre.storage.registry._hold_consent`), so neither race loses that.

Blocking: run these methods in a worker thread (:class:`lyre.service.consents.Consents` does).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.errors import ConsentInUse, TooManyConsents
from lyre.storage.db import voice_consents, voices
from lyre.storage.registry import CONSENT_ID_PATTERN, check_name, database_errors, in_utc, unknown_consent

LABEL = "a label for the consent recording"


@dataclass(frozen=True)
class ConsentRecording:
    """A consent recording as stored (without its audio)."""

    id: str
    owner: str
    name: str
    language: str
    created_at: datetime
    audio_sha256: str
    upload_sha256: str
    duration_s: float
    address: str | None


def new_id() -> str:
    return "cons_" + secrets.token_urlsafe(12)


class ConsentRegistry:
    def __init__(self, engine: Engine, max_per_account: int):
        self.engine = engine
        self.max_per_account = max_per_account

    def add(self, *, owner: str, name: str, language: str, audio_flac: bytes, audio_sha256: str, upload_sha256: str,
            duration_s: float, address: str | None) -> ConsentRecording:
        row = {"id": new_id(), "owner": owner, "name": check_name(name, LABEL), "language": language,
               "created_at": datetime.now(timezone.utc), "audio_flac": audio_flac, "audio_sha256": audio_sha256,
               "upload_sha256": upload_sha256, "duration_s": duration_s, "address": address}
        with database_errors(), self.engine.begin() as c:
            if c.dialect.name == "postgresql":  # one upload of an account at a time (as voices.add)
                c.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": "consents:" + owner})
            # insert, then count in the same transaction: of two racing uploads the second counts the first
            c.execute(voice_consents.insert().values(**row))
            held = c.execute(sa.select(sa.func.count()).select_from(voice_consents)
                             .where(voice_consents.c.owner == owner)).scalar()
            if held > self.max_per_account:
                raise TooManyConsents(f"this account holds {held - 1} consent recordings, the most allowed "
                                      "(voices.max_per_account); delete one first")
        return _recording(row)

    def get(self, consent_id: Any, account: str) -> ConsentRecording:
        _check_id(consent_id)
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(*_COLUMNS).where(voice_consents.c.id == consent_id,
                                                       voice_consents.c.owner == account)).mappings().first()
        if row is None:
            raise unknown_consent(consent_id)
        return _recording(row)

    def list(self, account: str) -> list[ConsentRecording]:
        """The account's recordings, newest first."""
        with database_errors(), self.engine.connect() as c:
            rows = c.execute(sa.select(*_COLUMNS).where(voice_consents.c.owner == account)
                             .order_by(voice_consents.c.created_at.desc(), voice_consents.c.id.desc()))
            return [_recording(r) for r in rows.mappings()]

    def rename(self, consent_id: Any, account: str, name: Any) -> ConsentRecording:
        _check_id(consent_id)
        name = check_name(name, LABEL)
        with database_errors(), self.engine.begin() as c:
            c.execute(voice_consents.update().where(voice_consents.c.id == consent_id,
                                                    voice_consents.c.owner == account).values(name=name))
            row = c.execute(sa.select(*_COLUMNS).where(voice_consents.c.id == consent_id,
                                                       voice_consents.c.owner == account)).mappings().first()
        if row is None:
            raise unknown_consent(consent_id)
        return _recording(row)

    def delete(self, consent_id: Any, account: str) -> None:
        """Remove the recording; ConsentInUse while voices created with it exist."""
        _check_id(consent_id)
        with database_errors(), self.engine.begin() as c:
            # delete, then look for voices in the same transaction: a voice being created with it holds
            # its row (PostgreSQL) or the write lock (SQLite), so either it is seen here or it sees this
            gone = c.execute(voice_consents.delete().where(voice_consents.c.id == consent_id,
                                                           voice_consents.c.owner == account)).rowcount
            if not gone:
                raise unknown_consent(consent_id)
            users = list(c.execute(sa.select(voices.c.id).where(voices.c.consent_id == consent_id)
                                   .order_by(voices.c.created_at)).scalars())
            if users:
                shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
                raise ConsentInUse(f"consent recording {consent_id} is in use: the voices {shown} were created with "
                                   "it; delete them first (a voice is never kept without its consent recording)")

    def audio(self, consent_id: Any, account: str) -> bytes:
        """The recording as FLAC (24 kHz, normalised)."""
        self.get(consent_id, account)
        with database_errors(), self.engine.connect() as c:
            return c.execute(sa.select(voice_consents.c.audio_flac)
                             .where(voice_consents.c.id == consent_id)).scalar_one()


def _check_id(consent_id: Any) -> None:
    """Ids that are not ours (``../``, ``%2e%2e``, NUL, ...) are unknown before the database is asked."""
    if not isinstance(consent_id, str) or not CONSENT_ID_PATTERN.fullmatch(consent_id):
        raise unknown_consent(consent_id)


_COLUMNS = [c for c in voice_consents.c if c.name != "audio_flac"]


def _recording(row: Any) -> ConsentRecording:
    created = in_utc(row["created_at"])
    return ConsentRecording(id=row["id"], owner=row["owner"], name=row["name"], language=row["language"],
                            created_at=created, audio_sha256=row["audio_sha256"], upload_sha256=row["upload_sha256"],
                            duration_s=row["duration_s"], address=row["address"])
