"""The state tables in app/transitions.py: documented, enforced before any SQL, and each move
a compare-and-set on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.db import Database
from app.models import Job, JobStatus, PartStatus, Worker, WorkerState, new_id, utcnow
from app.transitions import (
    JOB_MOVES,
    PART_MOVES,
    WORKER_MOVES,
    IllegalMove,
    move_job,
    move_worker,
)

DOC = Path(__file__).resolve().parents[1] / "docs/worker-protocol.md"


def _documented(entity: str) -> dict[str, set[str]]:
    """The `| <entity> from | to |` table of docs/worker-protocol.md, as a mapping."""
    text = DOC.read_text()
    table = text[text.index(f"| {entity} from | to |") :].split("\n\n", 1)[0]
    moves: dict[str, set[str]] = {}
    for line in table.splitlines()[2:]:
        sources, targets = (cell.strip() for cell in line.strip("|").split("|"))
        to = set() if targets == "(final)" else {t.strip() for t in targets.split(",")}
        for source in re.split(r",\s*", sources):
            moves[source] = to
    return moves


def _table(moves: object) -> dict[str, set[str]]:
    assert isinstance(moves, dict)
    return {k.value: {t.value for t in v} for k, v in moves.items()}


def test_the_documented_tables_are_the_enforced_ones() -> None:
    assert _documented("job") == _table(JOB_MOVES)
    assert _documented("worker") == _table(WORKER_MOVES)
    assert _documented("part") == _table(PART_MOVES)
    assert set(PART_MOVES) == set(PartStatus)
    assert set(JOB_MOVES) == set(JobStatus)
    assert set(WORKER_MOVES) == set(WorkerState)
    assert all(not JOB_MOVES[s] for s in JobStatus if s.finished)


def _job(db: Database, status: JobStatus) -> str:
    job_id = new_id("job")
    with db.session() as s:
        s.add(Job(id=job_id, owner="o", source="upload", status=status.value, created_at=utcnow()))
    return job_id


def _status(db: Database, job_id: str) -> str:
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status


def test_a_move_the_table_does_not_allow_is_refused_before_any_sql(db: Database) -> None:
    job_id = _job(db, JobStatus.SUCCEEDED)
    with db.session() as s, pytest.raises(IllegalMove, match="succeeded -> running"):
        move_job(s, job_id, [JobStatus.SUCCEEDED], JobStatus.RUNNING)
    assert _status(db, job_id) == "succeeded"
    with db.session() as s, pytest.raises(IllegalMove, match="deleting -> ready"):
        move_worker(s, "wrk_x", [WorkerState.DELETING], WorkerState.READY)


def test_a_move_is_a_compare_and_set(db: Database) -> None:
    job_id = _job(db, JobStatus.QUEUED)
    with db.session() as s:
        assert move_job(s, job_id, [JobStatus.QUEUED], JobStatus.DISPATCHED, profile="p")
    # The second mover lost the race: the row is no longer queued, nothing changes.
    with db.session() as s:
        assert not move_job(s, job_id, [JobStatus.QUEUED], JobStatus.CANCELLED)
    assert _status(db, job_id) == "dispatched"
    # Extra conditions are part of the compare: only the holder finishes a running job.
    with db.session() as s:
        assert move_job(s, job_id, ["dispatched"], JobStatus.RUNNING, worker_id="wrk_a")
    with db.session() as s:
        assert not move_job(s, job_id, ["running"], JobStatus.SUCCEEDED, Job.worker_id == "wrk_b")
        assert move_job(s, job_id, ["running"], JobStatus.SUCCEEDED, Job.worker_id == "wrk_a")
    assert _status(db, job_id) == "succeeded"


def test_a_loaded_worker_row_sees_its_move(db: Database) -> None:
    worker_id = new_id("wrk")
    with db.session() as s:
        s.add(
            Worker(
                id=worker_id,
                profile="p",
                provider="local",
                state=WorkerState.BOOTING.value,
                requested_at=utcnow(),
            )
        )
    with db.session() as s:
        row = s.get(Worker, worker_id)
        assert row is not None
        assert move_worker(s, worker_id, [row.state], WorkerState.READY, error=None)
        assert row.state == WorkerState.READY.value
        assert not move_worker(s, worker_id, [WorkerState.BOOTING], WorkerState.DELETING)
    with db.reader() as s:
        again = s.get(Worker, worker_id)
        assert again is not None and again.state == "ready"
