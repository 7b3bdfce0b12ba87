"""Every state change of a job, a job's part or a worker: one table of allowed moves per
entity, and one compare-and-set helper per entity that makes a move.

A move names the states it may start from and the state it goes to. The helper checks each
pair against the entity's table before any SQL (a move the table does not allow is a bug in
the caller, raised as `IllegalMove`), then updates the row only while it is still in one of
those states and meets the caller's extra conditions (the worker holding the job, the claim's
attempt number...). It returns whether the row moved: False means another process moved it
first, and the caller's word is ignored. Nothing else in the code base writes `Job.status`,
`JobPart.status` or `Worker.state`, apart from a row being created.

docs/worker-protocol.md "States" shows both tables; tests/test_transitions.py holds them to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session

from app.db import rows_changed
from app.models import Job, JobPart, JobStatus, PartStatus, Worker, WorkerState

_J = JobStatus
JOB_MOVES: Mapping[JobStatus, frozenset[JobStatus]] = {
    # dispatched to a profile's queue; cancelled by its client; failed by the control plane
    # (URL fetch, no profile can take it)
    _J.QUEUED: frozenset({_J.DISPATCHED, _J.CANCELLED, _J.FAILED}),
    # claimed by a worker; back to queued when the send failed or its profile lost its
    # workers; too many attempts
    _J.DISPATCHED: frozenset({_J.RUNNING, _J.QUEUED, _J.CANCELLED, _J.FAILED}),
    # finished by its worker; claimed again by a new worker after its holder died (RUNNING);
    # handed back by a draining worker (DISPATCHED); re-routed by the fleet (QUEUED)
    _J.RUNNING: frozenset(
        {_J.SUCCEEDED, _J.FAILED, _J.CANCELLED, _J.RUNNING, _J.DISPATCHED, _J.QUEUED}
    ),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset(),
    _J.CANCELLED: frozenset(),
}

_P = PartStatus
PART_MOVES: Mapping[PartStatus, frozenset[PartStatus]] = {
    # sent with its job; the job cancelled before it was
    _P.QUEUED: frozenset({_P.DISPATCHED, _P.CANCELLED, _P.FAILED}),
    # claimed by a worker; back to queued with its re-routed job
    _P.DISPATCHED: frozenset({_P.RUNNING, _P.QUEUED, _P.CANCELLED, _P.FAILED}),
    # done; retried (DISPATCHED: a failure, a release, a dead holder); claimed again after its
    # holder died (RUNNING); its job re-routed (QUEUED), cancelled, or failed
    _P.RUNNING: frozenset(
        {_P.SUCCEEDED, _P.DISPATCHED, _P.RUNNING, _P.QUEUED, _P.CANCELLED, _P.FAILED}
    ),
    _P.SUCCEEDED: frozenset(),
    _P.FAILED: frozenset(),
    _P.CANCELLED: frozenset(),
}

_W = WorkerState
WORKER_MOVES: Mapping[WorkerState, frozenset[WorkerState]] = {
    # The provider call: bound to an instance (creating), created (booting), or failed. A quick
    # worker may report ready before the create call returns.
    _W.REQUESTED: frozenset({_W.CREATING, _W.BOOTING, _W.READY, _W.FAILED, _W.DELETING}),
    _W.CREATING: frozenset({_W.BOOTING, _W.READY, _W.FAILED, _W.DELETING}),
    # Ready when its report passes readiness; refused there (failed); dead or not needed.
    _W.BOOTING: frozenset({_W.READY, _W.FAILED, _W.DELETING}),
    _W.READY: frozenset({_W.DRAINING, _W.FAILED, _W.DELETING}),
    _W.DRAINING: frozenset({_W.DELETING}),
    # A worker refused at readiness is torn down like any other.
    _W.FAILED: frozenset({_W.DELETING}),
    # Teardown confirmed by the provider.
    _W.DELETING: frozenset({_W.DELETED}),
    # An orphan adopted again: its instance is still listed.
    _W.DELETED: frozenset({_W.DELETING}),
}


def worker_sources(to: WorkerState) -> tuple[WorkerState, ...]:
    """Every state a worker may move to `to` from, in the table's order."""
    return tuple(state for state in WorkerState if to in WORKER_MOVES[state])


class IllegalMove(ValueError):
    """A caller asked for a state change its entity's table does not allow."""


_S = TypeVar("_S", JobStatus, PartStatus, WorkerState)


def _sources(
    kind: str, moves: Mapping[_S, frozenset[_S]], sources: Iterable[_S | str], to: _S
) -> list[str]:
    checked = [type(to)(s) for s in sources]
    for source in checked:
        if to not in moves[source]:
            raise IllegalMove(f"{kind}: {source.value} -> {to.value} is not a move")
    return [s.value for s in checked]


def move_job(
    s: Session,
    job_id: str,
    sources: Iterable[JobStatus | str],
    to: JobStatus,
    *where: ColumnElement[bool],
    **values: Any,
) -> bool:
    """Move the job to `to` if it is in one of `sources` (and meets `where`); whether it moved."""
    allowed = _sources("job", JOB_MOVES, sources, to)
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.status.in_(allowed), *where)
        .values(status=to.value, **values)
    )
    return rows_changed(s, statement) > 0


def move_part(
    s: Session,
    part_id: str,
    sources: Iterable[PartStatus | str],
    to: PartStatus,
    *where: ColumnElement[bool],
    **values: Any,
) -> bool:
    """Move a job's part to `to` if it is in one of `sources` (and meets `where`); whether it
    moved."""
    allowed = _sources("part", PART_MOVES, sources, to)
    statement = (
        update(JobPart)
        .where(JobPart.id == part_id, JobPart.status.in_(allowed), *where)
        .values(status=to.value, **values)
    )
    return rows_changed(s, statement) > 0


def move_worker(
    s: Session,
    worker_id: str,
    sources: Iterable[WorkerState | str],
    to: WorkerState,
    *where: ColumnElement[bool],
    **values: Any,
) -> bool:
    """Move the worker to `to` if it is in one of `sources` (and meets `where`); whether it
    moved. Loaded rows in the session see the new values."""
    allowed = _sources("worker", WORKER_MOVES, sources, to)
    statement = (
        update(Worker)
        .where(Worker.id == worker_id, Worker.state.in_(allowed), *where)
        .values(state=to.value, **values)
        .execution_options(synchronize_session="fetch")
    )
    return rows_changed(s, statement) > 0
