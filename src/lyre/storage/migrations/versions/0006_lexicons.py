"""Pronunciation lexicons (W3C PLS), per account.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lexicons",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("language", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pls", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("aliases", sa.Integer, nullable=False),
        sa.Column("phonemes", sa.Integer, nullable=False),
        sa.Column("is_default", sa.Boolean, nullable=False),
    )
    op.create_index("ix_lexicons_owner", "lexicons", ["owner"])


def downgrade() -> None:
    op.drop_index("ix_lexicons_owner", "lexicons")
    op.drop_table("lexicons")
