"""jobs: what a job asks of a profile (task, model, diarize, speakers) and the detected language

Revision ID: 0006_job_routing_options
Revises: 0005_audio_expiry
Create Date: 2026-12-02 04:40:00.000000

Issue 20: a job's task (transcribe | translate), model, diarize flag and speaker bounds route
it to the profiles that can serve it (app/jobs/routing.py); the worker's detected language and
its probability are kept on the row. Every column is nullable or has a server default, so rows
from before read as "transcribe, any model, no diarization".
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_job_routing_options"
down_revision = "0005_audio_expiry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("task", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("model", sa.String(length=64), nullable=True))
        batch.add_column(
            sa.Column("diarize", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("min_speakers", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_speakers", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("detected_language", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("language_probability", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name in (
            "language_probability",
            "detected_language",
            "max_speakers",
            "min_speakers",
            "diarize",
            "model",
            "task",
        ):
            batch.drop_column(name)
