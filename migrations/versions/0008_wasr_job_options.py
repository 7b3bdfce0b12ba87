"""jobs: the decoding options a job may set (sampling temperature, VAD on or off)

Revision ID: 0008_wasr_job_options
Revises: 0007_list_indexes
Create Date: 2026-12-05 02:10:00.000000

Issue 31: OpenAI's `temperature` and whisper-asr-webservice's `vad_filter` reach the worker
(gpu_worker/protocol/claim.py). `temperature` is nullable (null: the worker's own decoding
temperatures) and `vad_filter` has a server default of true, so rows from before read as
"the worker's defaults" and no backfill rewrites the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_wasr_job_options"
down_revision = "0007_list_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    added = [
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("vad_filter", sa.Boolean(), nullable=False, server_default=sa.true()),
    ]
    bind = op.get_bind()
    options: dict[str, object] = {}
    if bind.dialect.name == "sqlite":
        # The transcript columns stay last (0007 says why: SQLite walks past every column
        # stored before the one it reads, through a big transcript's overflow pages).
        last = ["transcript_text", "transcript"]
        columns = [c["name"] for c in sa.inspect(bind).get_columns("jobs")]
        order = [c for c in columns if c not in last] + [c.name for c in added] + last
        options = {"recreate": "always", "partial_reordering": [tuple(order)]}
    with op.batch_alter_table("jobs", **options) as batch:
        for column in added:
            batch.add_column(column)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("vad_filter")
        batch.drop_column("temperature")
