"""The cloned-voice registry.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "voices",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("transcript", sa.Text, nullable=False),
        sa.Column("audio_flac", sa.LargeBinary, nullable=False),
        sa.Column("audio_sha256", sa.String(64), nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("ref_token_ids", sa.JSON, nullable=False),
        sa.Column("codec_id", sa.String(512), nullable=False),
        sa.Column("model_id", sa.String(512), nullable=False),
        sa.Column("consent", sa.JSON, nullable=False),
        sa.UniqueConstraint("owner", "name", name="uq_voices_owner_name"),
    )


def downgrade() -> None:
    op.drop_table("voices")
