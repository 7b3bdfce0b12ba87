"""jobs at scale: the transcript's text beside it, and indexes for listings and the reconcile

Revision ID: 0006_list_indexes
Revises: 0005_audio_expiry
Create Date: 2026-12-02 05:00:00.000000

A listing reads `limit` rows in index order instead of sorting every job of its owner, and
the reconcile's snapshot counts and orders jobs from indexes. `transcript_text` lets a job's
JSON show its text without reading the transcript (null on older rows: read from the
transcript then, so no backfill rewrites the table).

Safe on a live table: the column is nullable (no rewrite); on PostgreSQL each index is built
with CREATE INDEX CONCURRENTLY outside a transaction, so writers are never blocked. A build
that failed leaves an invalid index, which the next run drops and builds again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_list_indexes"
down_revision = "0005_audio_expiry"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_jobs_owner_created", ["owner", "created_at", "id"]),
    ("ix_jobs_owner_status_created", ["owner", "status", "created_at", "id"]),
    ("ix_jobs_status_created", ["status", "created_at", "id"]),
    ("ix_jobs_status_profile", ["status", "profile"]),
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("transcript_text", sa.Text(), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        for name, columns in INDEXES:
            op.create_index(name, "jobs", columns, unique=False)
        return
    with op.get_context().autocommit_block():
        for name, columns in INDEXES:
            invalid = bind.execute(
                sa.text(
                    "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE c.relname = :name AND NOT i.indisvalid"
                ),
                {"name": name},
            ).first()
            if invalid is not None:
                op.drop_index(name, table_name="jobs", postgresql_concurrently=True)
            op.create_index(
                name,
                "jobs",
                columns,
                unique=False,
                postgresql_concurrently=True,
                if_not_exists=True,
            )


def downgrade() -> None:
    for name, _ in reversed(INDEXES):
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("transcript_text")
