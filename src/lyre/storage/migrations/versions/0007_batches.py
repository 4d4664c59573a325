"""Batch jobs and their items; the audit trail's trace column.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit", sa.Column("trace", sa.String(320), nullable=True))
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("input_sha256", sa.String(64), nullable=False),
        sa.Column("input_bytes", sa.BigInteger, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cancelling_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_batches_owner_idempotency_key"),
    )
    op.create_index("ix_batches_owner", "batches", ["owner"])
    op.create_table(
        "batch_items",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("batch_id", sa.String(40), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("custom_id", sa.String(256), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(160), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_key", sa.String(512), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("bytes", sa.Integer, nullable=True),
        sa.Column("duration_s", sa.Float, nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.UniqueConstraint("batch_id", "custom_id", name="uq_batch_items_custom_id"),
    )
    op.create_index("ix_batch_items_batch_id", "batch_items", ["batch_id", "state"])
    op.create_index("ix_batch_items_state", "batch_items", ["state", "owner"])


def downgrade() -> None:
    op.drop_index("ix_batch_items_state", "batch_items")
    op.drop_index("ix_batch_items_batch_id", "batch_items")
    op.drop_table("batch_items")
    op.drop_index("ix_batches_owner", "batches")
    op.drop_table("batches")
    with op.batch_alter_table("audit") as b:
        b.drop_column("trace")
