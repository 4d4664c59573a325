"""Pronunciation lexicons: rows of the ``lexicons`` table, owned by accounts (as voices are: every
lookup is by (id, account); another account's lexicon, a deleted one and an id not even well formed
all raise the same :class:`UnknownLexicon`, 404). Ids are server-generated (``lex_`` + 16 URL-safe
characters). The PLS document is kept as sent, with its counts.

Blocking: run these methods in a worker thread (:class:`lyre.service.lexicons.Lexicons` does).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lyre.errors import TooManyLexicons, UnknownLexicon
from lyre.storage.db import lexicons
from lyre.storage.registry import database_errors, in_utc

LEXICON_ID_PATTERN = re.compile(r"lex_[A-Za-z0-9_-]{16}")


@dataclass(frozen=True)
class StoredLexicon:
    id: str
    owner: str
    name: str
    language: str
    created_at: datetime
    sha256: str
    aliases: int
    phonemes: int
    default: bool
    pls: str = ""  # (only when asked for)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "language": self.language,
                "created_at": int(self.created_at.timestamp()), "sha256": self.sha256, "aliases": self.aliases,
                "unused_phonemes": self.phonemes, "default": self.default}


def unknown_lexicon(lexicon_id: Any) -> UnknownLexicon:
    shown = lexicon_id if isinstance(lexicon_id, str) and LEXICON_ID_PATTERN.fullmatch(lexicon_id) else "that id"
    return UnknownLexicon(f"no lexicon {shown!s} (lexicons are visible only to the account that created them)")


class LexiconRegistry:
    def __init__(self, engine: Engine, max_per_account: int):
        self.engine = engine
        self.max_per_account = max_per_account

    def add(self, *, owner: str, name: str, language: str, pls: str, sha256: str, aliases: int, phonemes: int,
            default: bool) -> StoredLexicon:
        row = {"id": "lex_" + secrets.token_urlsafe(12), "owner": owner, "name": name, "language": language,
               "created_at": datetime.now(timezone.utc), "pls": pls, "sha256": sha256, "aliases": aliases,
               "phonemes": phonemes, "is_default": default}
        with database_errors(), self.engine.begin() as c:
            if c.dialect.name == "postgresql":  # one creation of an account at a time (as voices.add)
                c.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": "lexicons:" + owner})
            # insert, then count in the same transaction: of two racing creations the second counts the first
            c.execute(lexicons.insert().values(**row))
            held = c.execute(sa.select(sa.func.count()).select_from(lexicons).where(lexicons.c.owner == owner)).scalar()
            if held > self.max_per_account:
                raise TooManyLexicons(f"this account holds {held - 1} lexicons, the most allowed "
                                      "(voices.max_lexicons_per_account); delete one first")
        return _stored(row, with_pls=False)

    def get(self, lexicon_id: Any, account: str, with_pls: bool = False) -> StoredLexicon:
        _check_id(lexicon_id)
        columns = list(lexicons.c) if with_pls else _COLUMNS
        with database_errors(), self.engine.connect() as c:
            row = c.execute(sa.select(*columns).where(lexicons.c.id == lexicon_id,
                                                      lexicons.c.owner == account)).mappings().first()
        if row is None:
            raise unknown_lexicon(lexicon_id)
        return _stored(row, with_pls)

    def list(self, account: str) -> list[StoredLexicon]:
        """The account's lexicons, oldest first (the order defaults apply in)."""
        with database_errors(), self.engine.connect() as c:
            rows = c.execute(sa.select(*_COLUMNS).where(lexicons.c.owner == account)
                             .order_by(lexicons.c.created_at, lexicons.c.id))
            return [_stored(r, False) for r in rows.mappings()]

    def delete(self, lexicon_id: Any, account: str) -> StoredLexicon:
        found = self.get(lexicon_id, account)
        with database_errors(), self.engine.begin() as c:
            gone = c.execute(lexicons.delete().where(lexicons.c.id == lexicon_id, lexicons.c.owner == account)).rowcount
        if not gone:
            raise unknown_lexicon(lexicon_id)
        return found


def _check_id(lexicon_id: Any) -> None:
    """Ids that are not ours are unknown before the database is asked."""
    if not isinstance(lexicon_id, str) or not LEXICON_ID_PATTERN.fullmatch(lexicon_id):
        raise unknown_lexicon(lexicon_id)


_COLUMNS = [c for c in lexicons.c if c.name != "pls"]


def _stored(row: Any, with_pls: bool) -> StoredLexicon:
    return StoredLexicon(id=row["id"], owner=row["owner"], name=row["name"], language=row["language"],
                         created_at=in_utc(row["created_at"]), sha256=row["sha256"], aliases=row["aliases"],
                         phonemes=row["phonemes"], default=bool(row["is_default"]),
                         pls=row["pls"] if with_pls else "")
