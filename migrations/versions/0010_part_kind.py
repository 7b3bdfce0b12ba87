"""job_parts.kind: a diarized long job's speakers part beside its transcription parts

Revision ID: 0010_part_kind
Revises: 0009_job_parts
Create Date: 2026-12-05 17:40:00.000000

Issue 34, point 3: a diarized job is cut like any other; one more part of kind `speakers`
diarizes the whole file while the others transcribe their spans, and the words are assigned to
speakers after the join (app/jobs/parts.py). Existing parts are transcription parts, which the
server default says; a release without the column never wrote a speakers part.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_part_kind"
down_revision = "0009_job_parts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    kind = sa.Column("kind", sa.String(length=16), nullable=False, server_default="transcribe")
    bind = op.get_bind()
    options: dict[str, object] = {}
    if bind.dialect.name == "sqlite":
        # The transcript column stays last (0007 says why: SQLite walks past every column
        # stored before the one it reads, and the planner reads `kind` while parts run).
        columns = [c["name"] for c in sa.inspect(bind).get_columns("job_parts")]
        order = [c for c in columns if c != "transcript"] + ["kind", "transcript"]
        options = {"recreate": "always", "partial_reordering": [tuple(order)]}
    with op.batch_alter_table("job_parts", **options) as batch:
        batch.add_column(kind)


def downgrade() -> None:
    with op.batch_alter_table("job_parts") as batch:
        batch.drop_column("kind")
