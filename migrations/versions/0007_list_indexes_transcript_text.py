"""jobs at scale: the transcript's text beside it, and indexes for listings and the reconcile

Revision ID: 0007_list_indexes
Revises: 0006_job_routing_options
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

revision = "0007_list_indexes"
down_revision = "0006_job_routing_options"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_jobs_owner_created", ["owner", "created_at", "id"]),
    ("ix_jobs_owner_status_created", ["owner", "status", "created_at", "id"]),
    ("ix_jobs_status_created", ["status", "created_at", "id"]),
    ("ix_jobs_status_profile", ["status", "profile"]),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        _upgrade_sqlite(bind)
        return
    op.add_column("jobs", sa.Column("transcript_text", sa.Text(), nullable=True))
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


def _upgrade_sqlite(bind: sa.Connection) -> None:
    """SQLite: the table is rebuilt once with the two transcript columns last.

    SQLite reads a column by walking past the ones stored before it, through the overflow
    pages of a big value: with the transcript mid-row, reading `created_at` of a job with a
    4 MB transcript cost 3.5 ms, so a page of such jobs took a second. PostgreSQL keeps big
    values out of line (TOAST) and needs no rebuild. The rebuild copies the table under
    SQLite's write lock: a deployment with many long transcripts waits for it once.
    """
    columns = [c["name"] for c in sa.inspect(bind).get_columns("jobs")]
    order = [c for c in columns if c != "transcript"] + ["transcript_text", "transcript"]
    with op.batch_alter_table(
        "jobs", recreate="always", partial_reordering=[tuple(order)]
    ) as batch:
        batch.add_column(sa.Column("transcript_text", sa.Text(), nullable=True))
    for name, index_columns in INDEXES:
        op.create_index(name, "jobs", index_columns, unique=False)


def downgrade() -> None:
    for name, _ in reversed(INDEXES):
        op.drop_index(name, table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("transcript_text")
