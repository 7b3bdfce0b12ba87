"""Issue 34: the snapshot reads a job cut into parts as its parts (SQLite and PostgreSQL).

Its waiting parts are its profile's queued work (`JobCounts.parts_waiting`, with their audio),
it is no longer counted as one dispatched job, and its unfinished parts count in its owner's
work in service, so fair dispatch counts parts.
"""

from __future__ import annotations

from datetime import timedelta

from app.fleet.snapshot import read_snapshot
from app.jobs.parts import part_id
from app.models import Job, JobPart, JobStatus, PartStatus
from tests.fleet.conftest import L4, MakeFleet

PROFILE = {**L4, "max_workers": 4}


def test_a_job_in_parts_is_read_as_its_parts(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([PROFILE])
    now = fleet.clock()
    with fleet.db.session() as s:
        long_job = Job(
            owner="token-a",
            source="upload",
            audio_key="x",
            status=JobStatus.RUNNING.value,
            profile=PROFILE["name"],
            duration_seconds=900.0,
            created_at=now - timedelta(seconds=30),
            dispatched_at=now - timedelta(seconds=30),
        )
        whole = Job(
            owner="token-b",
            source="upload",
            audio_key="x",
            status=JobStatus.DISPATCHED.value,
            profile=PROFILE["name"],
            duration_seconds=60.0,
            created_at=now - timedelta(seconds=10),
            dispatched_at=now - timedelta(seconds=10),
        )
        s.add_all([long_job, whole])
        s.flush()
        states = [PartStatus.SUCCEEDED, PartStatus.RUNNING, PartStatus.DISPATCHED]
        s.add_all(
            JobPart(
                id=part_id(long_job.id, i),
                job_id=long_job.id,
                index=i,
                start_seconds=300.0 * i,
                end_seconds=300.0 * (i + 1),
                status=status.value,
                attempts=1 if status != PartStatus.DISPATCHED else 0,
                created_at=now,
            )
            for i, status in enumerate(states)
        )
        long_id, whole_id = long_job.id, whole.id

    state = read_snapshot(fleet.svc, now, now).state
    (counts,) = state.job_counts
    assert (counts.dispatched, counts.running) == (1, 0)  # the whole job only
    assert counts.parts_waiting == 1 and counts.parts_waiting_seconds == 300.0
    assert counts.parts_since is not None
    assert state.in_service == {"token-a": 2, "token-b": 1}
    parted = {a.id: a.parted for a in state.active_jobs}
    assert parted == {long_id: True, whole_id: False}
