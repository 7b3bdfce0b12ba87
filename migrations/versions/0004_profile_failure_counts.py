"""profile state: consecutive provisioning errors and failed boots

Revision ID: 0004_failure_counts
Revises: 0003_idempotency
Create Date: 2026-12-01 01:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_failure_counts"
down_revision = "0003_idempotency"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("profile_state", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("consecutive_errors", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("consecutive_failed_boots", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("profile_state", schema=None) as batch_op:
        batch_op.drop_column("consecutive_failed_boots")
        batch_op.drop_column("consecutive_errors")
