"""A cloned voice's speaker embedding (Qwen3-TTS Base: its clip's x-vector, float32 bytes; null
for voices of models that need none).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("voices") as batch:
        batch.add_column(sa.Column("speaker_embedding", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("voices") as batch:
        batch.drop_column("speaker_embedding")
