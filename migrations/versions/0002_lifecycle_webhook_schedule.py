"""webhook schedule: attempts and next attempt time on the job row

The database, not Redis, holds every webhook's delivery state: the sweep finds due webhooks
by (webhook_status, webhook_next_at) and claims an attempt by bumping webhook_attempts.

Revision ID: 0002_lifecycle
Revises: 0001
Create Date: 2026-12-01 01:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_lifecycle"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("webhook_attempts", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("webhook_next_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.create_index(
            "ix_jobs_webhook_due", ["webhook_status", "webhook_next_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_webhook_due")
        batch_op.drop_column("webhook_next_at")
        batch_op.drop_column("webhook_attempts")
