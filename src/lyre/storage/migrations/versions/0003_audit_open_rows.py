"""The audit row is written when a synthesis starts and completed when it ends: its entry id (the
row's name before the database numbers it), the server instance that opened it (so that the next
start of that instance closes its open rows as interrupted) and when it ended (null while open).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:  # (SQLite rebuilds the table; PostgreSQL alters it)
        batch.add_column(sa.Column("entry_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("instance", sa.String(128), nullable=True))
        batch.add_column(sa.Column("ended", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_audit_entry_id", ["entry_id"], unique=True)
        batch.create_index("ix_audit_outcome", ["outcome"])


def downgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.drop_index("ix_audit_outcome")
        batch.drop_index("ix_audit_entry_id")
        batch.drop_column("ended")
        batch.drop_column("instance")
        batch.drop_column("entry_id")
