"""The audit trail: one row per synthesis.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("account", sa.String(128), nullable=False),
        sa.Column("voice", sa.String(128), nullable=False),
        sa.Column("protocol", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("audio_seconds", sa.Float, nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=False),
        sa.Column("pcm_sha256", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_time", "audit", ["time"])


def downgrade() -> None:
    op.drop_index("ix_audit_time", "audit")
    op.drop_table("audit")
