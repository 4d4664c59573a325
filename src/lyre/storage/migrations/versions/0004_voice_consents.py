"""Consent recordings (OpenAI's voice consents, ``/v1/audio/voice_consents``), and the recording a
voice was created with (``voices.consent_id``; null for voices enrolled with a consent record only).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "voice_consents",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("language", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("audio_flac", sa.LargeBinary, nullable=False),
        sa.Column("audio_sha256", sa.String(64), nullable=False),
        sa.Column("upload_sha256", sa.String(64), nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("address", sa.String(128), nullable=True),
    )
    op.create_index("ix_voice_consents_owner", "voice_consents", ["owner"])
    with op.batch_alter_table("voices") as batch:
        batch.add_column(sa.Column("consent_id", sa.String(32), nullable=True))
        batch.create_index("ix_voices_consent_id", ["consent_id"])


def downgrade() -> None:
    with op.batch_alter_table("voices") as batch:
        batch.drop_index("ix_voices_consent_id")
        batch.drop_column("consent_id")
    op.drop_index("ix_voice_consents_owner", "voice_consents")
    op.drop_table("voice_consents")
