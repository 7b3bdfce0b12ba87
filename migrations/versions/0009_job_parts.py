"""job_parts: the parts a long job is cut into, each dispatched, claimed and retried alone

Revision ID: 0009_job_parts
Revises: 0008_wasr_job_options
Create Date: 2026-12-05 07:10:00.000000

Issue 34: a job whose audio is longer than about 1.5 x `jobs.part_seconds` is cut at pauses
into parts (app/jobs/parts.py). The job's row stays the record; each part is a row of its own
with its state, attempts, worker and times, and the worker's transcript of it until the stitch.
A new table only: no existing row changes, and a release without parts ignores it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_job_parts"
down_revision = "0008_wasr_job_options"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_parts",
        sa.Column("id", sa.String(length=48), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("start_seconds", sa.Float(), nullable=False),
        sa.Column("end_seconds", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("worker_id", sa.String(length=40), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("processing_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("transcript", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "index", name="uq_job_parts_index"),
    )
    op.create_index("ix_job_parts_job_status", "job_parts", ["job_id", "status"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_parts_job_status", table_name="job_parts")
    op.drop_table("job_parts")
