"""The cloned-voice registry: rows of the ``voices`` table, owned by accounts.

Every lookup is by (id, account): a voice of another account, a deleted one and an id that is not
even well formed all raise the same :class:`UnknownVoice` (404), so existence never leaks. Ids are
server-generated (``v_`` + 16 URL-safe characters); anything else (``../``, ``%2e%2e``, NUL) is
refused before the database is asked. Names are unique per account: of two concurrent
enrollments with one name, the database's unique constraint lets one win; the other gets
:class:`VoiceExists` (409).

Blocking: run these methods in a worker thread (:class:`lyre.service.voices.Voices` does).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.errors import (
    DatabaseError,
    InvalidRequest,
    TooManyVoices,
    UnknownConsent,
    UnknownVoice,
    VoiceExists,
)
from lyre.storage.db import voice_consents, voices

ID_PATTERN = re.compile(r"v_[A-Za-z0-9_-]{16}")
CONSENT_ID_PATTERN = re.compile(r"cons_[A-Za-z0-9_-]{16}")  # a consent recording's (lyre.storage.consents)
MAX_NAME_CHARS = 64


@dataclass(frozen=True)
class Voice:
    """A cloned voice as stored (without its audio)."""

    id: str
    name: str
    owner: str
    created_at: datetime
    transcript: str
    audio_sha256: str
    duration_s: float
    ref_token_ids: tuple[int, ...] = field(repr=False)
    codec_id: str
    model_id: str
    consent: dict[str, Any]
    consent_id: str | None = None  # the consent recording it was created with (lyre.storage.consents)
    speaker_embedding: bytes | None = field(default=None, repr=False)  # Qwen3-TTS Base: its x-vector (float32)

    def summary(self) -> dict[str, Any]:
        """What ``GET /v1/voices/{id}`` shows (no audio, no tokens, no consent details)."""
        return {"id": self.id, "name": self.name, "type": "cloned", "created_at": self.created_at.isoformat(),
                "transcript": self.transcript, "duration_s": round(self.duration_s, 3),
                "reference_tokens": len(self.ref_token_ids), "audio_sha256": self.audio_sha256,
                "codec_id": self.codec_id, "model_id": self.model_id}


def new_id() -> str:
    return "v_" + secrets.token_urlsafe(12)


def check_name(name: Any, what: str = "a name for the voice") -> str:
    """A voice name (or a consent recording's label: ``what``): 1-64 characters after trimming, no
    control or format characters."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest(f"'name' is required: {what} (1-64 characters)")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"'name' has {len(name)} characters; at most {MAX_NAME_CHARS}")
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")), None)
    if bad is not None:
        raise InvalidRequest(f"'name' contains the control character U+{ord(bad):04X}; use printable characters")
    return name


def unknown_consent(consent_id: Any) -> UnknownConsent:
    """Another account's consent recording, a deleted one and an id not even well formed: one answer."""
    shown = consent_id if isinstance(consent_id, str) and CONSENT_ID_PATTERN.fullmatch(consent_id) else "that id"
    return UnknownConsent(f"no consent recording {shown!s} (consent recordings are visible only to the account "
                          "that uploaded them)")


def _unknown(voice_id: Any) -> UnknownVoice:
    shown = voice_id if isinstance(voice_id, str) and ID_PATTERN.fullmatch(voice_id) else "that id"
    return UnknownVoice(f"no voice {shown!s} (cloned voices are visible only to the account that enrolled them)")


class VoiceRegistry:
    def __init__(self, engine: Engine, max_per_account: int):
        self.engine = engine
        self.max_per_account = max_per_account

    def add(self, *, name: str, owner: str, transcript: str, audio_flac: bytes, audio_sha256: str,
            duration_s: float, ref_token_ids: list[int], codec_id: str, model_id: str,
            consent: dict[str, Any], consent_id: str | None = None, speaker_embedding: bytes | None = None) -> Voice:
        """A new voice of ``owner``; with ``consent_id``, created with that consent recording of
        ``owner``'s, which must still exist when the voice is stored (UnknownConsent otherwise)."""
        row = {"id": new_id(), "owner": owner, "name": check_name(name), "created_at": datetime.now(timezone.utc),
               "transcript": transcript, "audio_flac": audio_flac, "audio_sha256": audio_sha256,
               "duration_s": duration_s, "ref_token_ids": list(ref_token_ids), "codec_id": codec_id,
               "model_id": model_id, "consent": consent, "consent_id": consent_id,
               "speaker_embedding": speaker_embedding}
        try:
            with database_errors(), self.engine.begin() as c:
                if c.dialect.name == "postgresql":  # one enrollment of an account at a time
                    c.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": owner})
                # insert, then count within the same transaction (SQLite holds its write lock from the
                # insert on): of two racing enrollments the second counts the first
                c.execute(voices.insert().values(**row))
                held = c.execute(sa.select(sa.func.count()).select_from(voices).where(voices.c.owner == owner)).scalar()
                if held > self.max_per_account:
                    raise TooManyVoices(f"this account holds {held - 1} cloned voices, the most allowed "
                                        f"(voices.max_per_account); delete one first")
                if consent_id is not None:
                    _hold_consent(c, consent_id, owner)
        except sa.exc.IntegrityError:
            raise VoiceExists(f"this account already has a voice named {row['name']!r}; choose another name or "
                              "delete that voice first") from None
        return _voice(row)

    def get(self, voice_id: Any, account: str) -> Voice:
        if not isinstance(voice_id, str) or not ID_PATTERN.fullmatch(voice_id):
            raise _unknown(voice_id)
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(*_COLUMNS).where(voices.c.id == voice_id, voices.c.owner == account)).mappings().first()
        if row is None:
            raise _unknown(voice_id)
        return _voice(row)

    def list(self, account: str) -> list[Voice]:
        with database_errors(), self.engine.connect() as c:
            rows = c.execute(sa.select(*_COLUMNS).where(voices.c.owner == account).order_by(voices.c.created_at, voices.c.id))
            return [_voice(r) for r in rows.mappings()]

    def audio(self, voice_id: str, account: str) -> bytes:
        """The reference clip as FLAC."""
        self.get(voice_id, account)
        with database_errors(), self.engine.connect() as c:
            return c.execute(sa.select(voices.c.audio_flac).where(voices.c.id == voice_id)).scalar_one()

    def delete(self, voice_id: Any, account: str) -> None:
        if not isinstance(voice_id, str) or not ID_PATTERN.fullmatch(voice_id):
            raise _unknown(voice_id)
        with database_errors(), self.engine.begin() as c:
            gone = c.execute(voices.delete().where(voices.c.id == voice_id, voices.c.owner == account)).rowcount
        if not gone:
            raise _unknown(voice_id)


    def existing(self, voice_ids: set[str]) -> set[str]:
        """Which of ``voice_ids`` still exist (in any account)."""
        with database_errors(), self.engine.connect() as c:
            return set(c.execute(sa.select(voices.c.id).where(voices.c.id.in_(sorted(voice_ids)))).scalars())


@contextlib.contextmanager
def database_errors() -> Iterator[None]:
    """The database failing (locked too long, disk full, server gone) is a DatabaseError (503)."""
    try:
        yield
    except sa.exc.IntegrityError:
        raise
    except sa.exc.SQLAlchemyError as e:
        reason = str(getattr(e, "orig", None) or e).splitlines()[0][:200]
        raise DatabaseError(f"the voices database cannot be used right now: {reason}") from None


def _hold_consent(c: sa.Connection, consent_id: str, owner: str) -> None:
    """The consent recording a voice is being stored with still exists, and stays until the voice's
    transaction ends: PostgreSQL holds a share lock on its row (its deletion waits, then sees the
    voice); SQLite's write lock, taken by the voice's insert, orders the two already."""
    held = c.execute(sa.select(voice_consents.c.id).where(voice_consents.c.id == consent_id,
                                                          voice_consents.c.owner == owner)
                     .with_for_update(read=True)).first()
    if held is None:
        raise unknown_consent(consent_id)


_COLUMNS = [c for c in voices.c if c.name != "audio_flac"]


def in_utc(stored: datetime) -> datetime:
    """A stored time, aware (SQLite gives back naive datetimes: they were stored in UTC)."""
    return stored.replace(tzinfo=timezone.utc) if stored.tzinfo is None else stored


def _voice(row: Any) -> Voice:
    created = in_utc(row["created_at"])
    return Voice(id=row["id"], name=row["name"], owner=row["owner"], created_at=created,
                 transcript=row["transcript"], audio_sha256=row["audio_sha256"], duration_s=row["duration_s"],
                 ref_token_ids=tuple(row["ref_token_ids"]), codec_id=row["codec_id"], model_id=row["model_id"],
                 consent=dict(row["consent"]), consent_id=row["consent_id"],
                 speaker_embedding=row["speaker_embedding"])
