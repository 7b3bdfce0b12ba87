"""retention: an index of the jobs that still hold audio, by when they ended

Revision ID: 0005_audio_expiry
Revises: 0004_failure_counts
Create Date: 2026-12-01 01:10:00.000000

The retention sweep (app/jobs/retention.py) looks for ended jobs whose audio is past its
time; a partial index keeps that lookup proportional to the audio still stored, not to every
job ever run.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_audio_expiry"
down_revision = "0004_failure_counts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_audio_expiry",
        "jobs",
        ["finished_at"],
        unique=False,
        sqlite_where=sa.text("audio_key IS NOT NULL"),
        postgresql_where=sa.text("audio_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_audio_expiry", table_name="jobs")
