"""The database behind cloned voices and the audit trail: its tables, opening it, migrating it.

SQLAlchemy 2 Core over any URL it supports: ``sqlite:///data/lyre.db`` by default (the file and
its folder are created), ``postgresql+psycopg://...`` for replicas sharing one registry. The
schema is created and changed only by Alembic migrations (``lyre/voices/migrations``), run to
``head`` when the database is opened; ``tests/storage/test_registry.py`` checks that the migrations
build exactly the tables defined here.

Every call here blocks: the service runs them in worker threads, never on the event loop or the
engine thread.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from lyre.errors import DatabaseError

log = logging.getLogger("lyre.voices")

LOCK_WAIT_S = 5.0  # how long SQLite waits for another writer's lock before giving up

metadata = sa.MetaData()

voices = sa.Table(
    "voices", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("transcript", sa.Text, nullable=False),
    sa.Column("audio_flac", sa.LargeBinary, nullable=False),  # the normalised 24 kHz reference clip
    sa.Column("audio_sha256", sa.String(64), nullable=False),
    sa.Column("duration_s", sa.Float, nullable=False),
    # the clip's codes: Orpheus audio token ids, frame by frame; Qwen3-TTS: 16 codes a frame (none: x-vector mode)
    sa.Column("ref_token_ids", sa.JSON, nullable=False),
    sa.Column("codec_id", sa.String(512), nullable=False),  # the codec weights the codes were made with
    sa.Column("speaker_embedding", sa.LargeBinary, nullable=True),  # Qwen3-TTS Base: the clip's x-vector (float32)
    sa.Column("model_id", sa.String(512), nullable=False),  # the checkpoint served at enrollment
    sa.Column("consent", sa.JSON, nullable=False),
    # the consent recording (voice_consents) the voice was created with; null: a consent record in ``consent`` only
    sa.Column("consent_id", sa.String(32), nullable=True, index=True),
    sa.UniqueConstraint("owner", "name", name="uq_voices_owner_name"),
)

# consent recordings (OpenAI's voice consents): the speaker saying they agree, kept as evidence; a
# voice created with one names it (voices.consent_id), and it cannot be deleted while one does
voice_consents = sa.Table(
    "voice_consents", metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False, index=True),
    sa.Column("name", sa.String(128), nullable=False),  # the label given at upload
    sa.Column("language", sa.String(64), nullable=False),  # BCP 47 tag of the consent phrase
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("audio_flac", sa.LargeBinary, nullable=False),  # the recording, normalised to 24 kHz like a voice's clip
    sa.Column("audio_sha256", sa.String(64), nullable=False),
    sa.Column("upload_sha256", sa.String(64), nullable=False),  # of the file as uploaded
    sa.Column("duration_s", sa.Float, nullable=False),
    sa.Column("address", sa.String(128), nullable=True),  # the client address it was uploaded from
)

# pronunciation lexicons (W3C PLS), owned by accounts like voices; the document is kept as sent
lexicons = sa.Table(
    "lexicons",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False, index=True),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("language", sa.String(64), nullable=False),  # its xml:lang
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("pls", sa.Text, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("aliases", sa.Integer, nullable=False),  # lexemes with an alias (applied)
    sa.Column("phonemes", sa.Integer, nullable=False),  # lexemes with phonemes only (kept, unused)
    sa.Column("is_default", sa.Boolean, nullable=False),  # applied to every request of the account that names none
)

audit = sa.Table(
    "audit", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("time", sa.DateTime(timezone=True), nullable=False, index=True),  # when the synthesis started (UTC)
    sa.Column("account", sa.String(128), nullable=False),
    sa.Column("voice", sa.String(128), nullable=False),  # a built-in voice's name or a cloned voice's id
    sa.Column("protocol", sa.String(16), nullable=False),  # rest, ws, grpc, riva, library
    # started (open: the synthesis runs, or its server died: interrupted at its next start), completed,
    # cancelled (by the client), slow_consumer, timeout, shutdown, error, interrupted (rows from before
    # migration 0003: finished, cancelled, failed)
    sa.Column("outcome", sa.String(16), nullable=False, index=True),
    sa.Column("reason", sa.String(64), nullable=False),  # what went wrong ("" when completed)
    sa.Column("audio_seconds", sa.Float, nullable=False),
    sa.Column("text_sha256", sa.String(64), nullable=False),
    sa.Column("pcm_sha256", sa.String(64), nullable=False),  # of the 24 kHz int16 PCM delivered
    sa.Column("entry_id", sa.String(32), nullable=True, unique=True, index=True),  # null: rows before 0003
    sa.Column("instance", sa.String(128), nullable=True),  # the server (host name) that opened the row
    sa.Column("ended", sa.DateTime(timezone=True), nullable=True),  # null while open
    sa.Column("trace", sa.String(320), nullable=True),  # a batch item's "<batch id>/<custom_id>" (null: live)
)

# batch jobs (lyre.storage.batches): one row per batch, one per item; items are claimed with leases
batches = sa.Table(
    "batches", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("owner", sa.String(128), nullable=False, index=True),
    sa.Column("status", sa.String(16), nullable=False),  # in_progress, cancelling, completed, cancelled, expired
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("input_sha256", sa.String(64), nullable=False),
    sa.Column("input_bytes", sa.BigInteger, nullable=False),
    sa.Column("total", sa.Integer, nullable=False),
    sa.Column("completion_window", sa.String(16), nullable=False),
    sa.Column("meta", sa.JSON, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("cancelling_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),  # completed, cancelled or expired
    sa.UniqueConstraint("owner", "idempotency_key", name="uq_batches_owner_idempotency_key"),
)

batch_items = sa.Table(
    "batch_items", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("batch_id", sa.String(40), nullable=False),
    sa.Column("owner", sa.String(128), nullable=False),
    sa.Column("line", sa.Integer, nullable=False),  # of the input (1-based)
    sa.Column("custom_id", sa.String(256), nullable=False),
    sa.Column("request", sa.JSON, nullable=False),  # text, voice, response_format and options, as validated
    # queued, running (leased), completed, failed, cancelled, expired
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("lease_owner", sa.String(160), nullable=True),
    sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("result_key", sa.String(512), nullable=True),  # where its audio is in the results store
    sa.Column("sha256", sa.String(64), nullable=True),  # of the audio file
    sa.Column("bytes", sa.Integer, nullable=True),
    sa.Column("duration_s", sa.Float, nullable=True),
    sa.Column("error_code", sa.String(64), nullable=True),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_items_custom_id"),
    sa.Index("ix_batch_items_batch_id", "batch_id", "state"),  # a batch's counts, its files in order
    sa.Index("ix_batch_items_state", "state", "owner"),  # what is there to claim, whose
)


DATABASE_URL_ENV = "LYRE_DATABASE_URL"  # the URL from the environment: a secret stays out of files and argv


def default_url(data_dir: str | Path) -> str:
    return f"sqlite:///{Path(data_dir) / 'lyre.db'}"


def database_url(configured: str | None, data_dir: str | Path) -> str:
    """``voices.database_url``; unset, the environment's LYRE_DATABASE_URL; unset too, SQLite in ``data_dir``."""
    return configured or os.environ.get(DATABASE_URL_ENV) or default_url(data_dir)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for other databases and for ``:memory:``)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.database.startswith("file:"):  # a SQLite URI filename (uri=true): file:path?mode=ro
        return Path(u.database.removeprefix("file:").split("?", 1)[0])
    return Path(u.database)


def open_database(url: str) -> Engine:
    """An engine for ``url`` with the schema migrated to the newest version. Raises DatabaseError
    naming the file (SQLite) or the server when it cannot be created, opened, locked or written."""
    path = sqlite_path(url)
    where = f"the database file {path}" if path else f"the database at {make_url(url).render_as_string()}"
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = _engine(url)
        migrate(engine)
    except (sa.exc.SQLAlchemyError, OSError) as e:
        reason = getattr(e, "orig", None) or e
        hint = ""
        if path is not None and "readonly" in str(reason).replace(" ", "").lower():
            hint = " (it, or its folder, is read-only for this user)"
        elif "locked" in str(reason).lower():
            hint = " (another process holds a lock on it)"
        raise DatabaseError(f"cannot open {where}: {reason}{hint}") from None
    log.info("voices database: %s", where)
    return engine


def _engine(url: str) -> Engine:
    if sqlite_path(url) is not None or make_url(url).get_backend_name() == "sqlite":
        engine = sa.create_engine(url, connect_args={"timeout": LOCK_WAIT_S, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:  # noqa: ANN001 - SQLAlchemy's hook signature
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
            cursor.execute(f"PRAGMA busy_timeout={int(LOCK_WAIT_S * 1000)}")
            cursor.close()

        return engine
    # pool_pre_ping: a restarted server is reconnected to at the next request; a database that does
    # not answer (a partition) fails a connection after 5 s instead of the OS's ~2 minutes
    connect_args = {"connect_timeout": 5} if make_url(url).get_backend_name() == "postgresql" else {}
    return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def migrate(engine: Engine) -> None:
    """Run every Alembic migration up to ``head`` on ``engine`` (nothing when it is current)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
