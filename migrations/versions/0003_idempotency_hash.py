"""jobs.idempotency_hash: the fingerprint of the request that used an Idempotency-Key

Revision ID: 0003_idempotency
Revises: 0002_lifecycle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_idempotency"
down_revision = "0002_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: jobs created before the column have no fingerprint and replay as before.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("idempotency_hash")
