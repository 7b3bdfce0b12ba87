"""A stock-out that clears: new work returns to the preferred profile, the fallback retires.

Through the real SDK, the emulator, real Redis and both databases: the API's routing
(`routable_profile`) and the reconcile agree that new jobs prefer the first profile that can
take them, so no second fallback server is created once the preferred one is back.
"""

from __future__ import annotations

from datetime import timedelta

from app.fleet.planner import Provision
from app.jobs.dispatch import dispatch_job
from app.jobs.service import routable_profile
from app.models import Job, JobStatus, ProfileState, Worker, WorkerState
from tests.fleet.conftest import Fleet, MakeFleet
from tests.fleet.test_reconcile import live, servers_in, settle_teardown


def submit(fleet: Fleet) -> tuple[str, str | None]:
    """A job as the API takes it: routed at once to a warm profile, or left for the reconcile."""
    [job_id] = fleet.add_jobs(1)
    with fleet.db.reader() as s:
        profile = routable_profile(s, fleet.svc.settings, fleet.clock(), "test")
    if profile is not None:
        assert dispatch_job(fleet.db, fleet.svc.celery, job_id, profile, now=fleet.clock())
    return job_id, profile


def job_profile(fleet: Fleet, job_id: str) -> str | None:
    with fleet.db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.profile


def test_after_the_stock_out_clears_new_jobs_go_to_the_preferred_profile(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet()
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "out_of_stock", zone="fr-par-2")

    # The L4 is out of stock: the first job gets a P100, which takes it.
    first, routed = submit(fleet)
    assert routed is None
    fleet.reconcile()
    fleet.reconcile(advance=5)
    assert [w.profile for w in live(fleet)] == ["p100-par1"]
    assert fleet.ready_all() == 1 and fleet.claim_all() == 1
    assert job_profile(fleet, first) == "p100-par1"

    # While the L4 backs off, the API sends new work to the warm fallback: not behind the job
    # it runs (that one waits for the reconcile), at once when it is idle.
    fleet.clock.advance(10)
    behind, routed = submit(fleet)
    assert routed is None
    assert fleet.finish_all() == 1
    fleet.reconcile()
    assert job_profile(fleet, behind) == "p100-par1" and fleet.claim_all() == 1
    assert fleet.finish_all() == 1
    during, routed = submit(fleet)
    assert routed == "p100-par1"
    assert fleet.claim_all() == 1

    # Stock is back and the back-off is over: new work waits for an L4, nothing grows the P100.
    fleet.emulator.clear_faults()
    fleet.clock.advance(60)
    after, routed = submit(fleet)
    assert routed is None
    fleet.reconcile()
    fleet.reconcile(advance=5)
    assert job_profile(fleet, after) == "l4-par2"
    assert sorted(w.profile for w in live(fleet)) == ["l4-par2", "p100-par1"]
    assert len(servers_in(fleet, "fr-par-1")) == 1
    assert fleet.reports[-1].plan is not None
    assert "p100-par1" not in _provisions(fleet)

    # The P100 finishes what it holds...
    assert fleet.finish_all() == 1
    assert job_profile(fleet, during) == "p100-par1"
    fleet.reconcile(advance=5)
    # ...and is retired when idle, while the L4 keeps serving.
    fleet.reconcile(advance=61)
    settle_teardown(fleet)
    assert [w.profile for w in live(fleet)] == ["l4-par2"]
    assert servers_in(fleet, "fr-par-1") == []
    [gone] = fleet.workers(WorkerState.DELETED.value)
    assert (gone.profile, gone.delete_reason) == ("p100-par1", "idle")

    # Once it has run the job it was created for, the next job goes to the preferred
    # profile's warm worker.
    assert fleet.ready_all() == 1
    assert fleet.claim_all() == 1 and fleet.finish_all() == 1
    assert job_profile(fleet, after) == "l4-par2"
    _, routed = submit(fleet)
    assert routed == "l4-par2"


def _busy_fallback(fleet: Fleet) -> None:
    """A P100 fallback worker, ready and running a job of its own."""
    now = fleet.clock()
    with fleet.db.session() as s:
        s.add(
            Worker(
                id="wrk_p100",
                profile="p100-par1",
                provider="scaleway",
                state=WorkerState.READY.value,
                requested_at=now,
                ready_at=now,
                booted_at=now,
                last_seen_at=now,
                current_job_id="job_busy",
                hourly_cost_eur=1.2426,
            )
        )
        s.add(
            Job(
                id="job_busy",
                owner="t",
                source="upload",
                audio_key="x",
                status=JobStatus.RUNNING.value,
                profile="p100-par1",
                worker_id="wrk_p100",
                created_at=now,
                dispatched_at=now,
            )
        )


def _profile_state(fleet: Fleet, **values: object) -> None:
    """What the fleet learned about the L4 profile, as the reconcile would have recorded it."""
    with fleet.db.session() as s:
        row = s.get(ProfileState, "l4-par2")
        if row is None:
            row = ProfileState(
                name="l4-par2",
                consecutive_stockouts=0,
                consecutive_errors=0,
                consecutive_failed_boots=0,
            )
            s.add(row)
        for key, value in values.items():
            setattr(row, key, value)


def _provisions(fleet: Fleet) -> list[str]:
    report = fleet.reports[-1]
    return [a.profile for plan in report.plans for a in plan.actions if isinstance(a, Provision)]


def test_an_idle_preferred_worker_takes_new_work_during_its_back_off(
    make_fleet: MakeFleet,
) -> None:
    """Review of issue 11, H1: a back-off stops new workers of its profile, not new jobs."""
    fleet = make_fleet()
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    assert fleet.ready_all() == 1 and fleet.claim_all() == 1 and fleet.finish_all() == 1
    _profile_state(  # an extra L4 was out of stock meanwhile
        fleet,
        consecutive_stockouts=1,
        backoff_until=fleet.clock() + timedelta(seconds=600),
        last_error="create_server: HTTP 503 out_of_stock",
    )
    _busy_fallback(fleet)

    job, routed = submit(fleet)
    assert routed == "l4-par2"  # the idle L4, not the busy fallback
    # A second job finds no free L4 worker, and the fallback's is busy: it is not queued behind
    # that one's job at submission, the reconcile places it (the stock-out passes it on).
    second, routed = submit(fleet)
    assert routed is None

    fleet.reconcile(advance=1)
    assert fleet.claim_all() == 1
    assert job_profile(fleet, job) == "l4-par2"
    assert _provisions(fleet) == ["p100-par1"]  # the fallback grows for the job
    fleet.reconcile(advance=1)
    assert job_profile(fleet, second) == "p100-par1"  # on the queue of its new worker


def test_a_preferred_profile_held_after_an_error_grows_no_fallback(make_fleet: MakeFleet) -> None:
    """Review of issue 11, H2: no fallback on quota (nor permission, 5xx, invalid argument)."""
    fleet = make_fleet()
    _profile_state(
        fleet,
        consecutive_errors=1,
        retry_at=fleet.clock() + timedelta(seconds=600),
        last_error="create_server: HTTP 403 quotas_exceeded",
    )
    _busy_fallback(fleet)

    job, routed = submit(fleet)
    assert routed is None  # it waits for the L4, not on the busy fallback's queue
    fleet.reconcile(advance=1)
    assert _provisions(fleet) == []
    assert job_profile(fleet, job) is None
    plan = fleet.reports[-1].plan
    assert plan is not None
    assert any(r.startswith("l4-par2: last provisioning failed") for r in plan.held_back)
    assert servers_in(fleet, "fr-par-1") == []
