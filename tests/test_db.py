"""Database.row_reader: the compiled one-row read that authenticates every worker request."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, text

from app.db import Database
from app.models import Worker, utcnow
from tests.conftest import add_worker

_BY_ID = select(Worker.instance_id, Worker.state, Worker.last_seen_at).where(
    Worker.id == bindparam("worker_id")
)


def test_a_row_comes_back_with_the_columns_own_types(database_url: str) -> None:
    db = Database(database_url)
    try:
        worker = add_worker(db)
        seen = utcnow() - timedelta(seconds=5)
        with db.session() as s:
            s.get(Worker, worker.id).last_seen_at = seen  # type: ignore[union-attr]
        row = db.row_reader(_BY_ID).first(worker_id=worker.id)
        assert row is not None
        instance_id, state, last_seen = row
        assert (instance_id, state) == (worker.instance_id, worker.state)
        # SQLite stores datetimes as text: the column's own conversion still applies.
        assert isinstance(last_seen, datetime)
        assert last_seen.replace(tzinfo=None) == seen.replace(tzinfo=None)
        assert db.row_reader(_BY_ID).first(worker_id="wrk_missing") is None
        assert db.row_reader(_BY_ID) is db.row_reader(_BY_ID)  # compiled once
    finally:
        db.dispose()


def test_a_read_leaves_the_pooled_connection_as_the_orm_expects_it(database_url: str) -> None:
    """PostgreSQL reads run outside a transaction; the next ORM session still gets one."""
    db = Database(database_url)
    try:
        worker = add_worker(db)
        reader = db.row_reader(_BY_ID)
        for _ in range(3):
            assert reader.first(worker_id=worker.id) is not None
        with db.engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert getattr(driver, "autocommit", False) is False
        # A write then a rollback must really roll back (the connection is not in autocommit).
        with db.engine.connect() as conn:
            conn.execute(
                text("UPDATE workers SET state = 'failed' WHERE id = :id"), {"id": worker.id}
            )
            conn.rollback()
        row = reader.first(worker_id=worker.id)
        assert row is not None and row[1] == worker.state
    finally:
        db.dispose()
