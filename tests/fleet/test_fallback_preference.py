"""A stock-out that clears: new work returns to the preferred profile, the fallback retires.

Through the real SDK, the emulator, real Redis and both databases: the API's routing
(`routable_profile`) and the reconcile agree that new jobs prefer the first profile that can
take them, so no second fallback server is created once the preferred one is back.
"""

from __future__ import annotations

from app.jobs.service import routable_profile
from app.models import Job, WorkerState
from tasks.dispatch import dispatch_job
from tests.fleet.conftest import Fleet, MakeFleet
from tests.fleet.test_reconcile import live, servers_in, settle_teardown


def submit(fleet: Fleet) -> tuple[str, str | None]:
    """A job as the API takes it: routed at once to a warm profile, or left for the reconcile."""
    [job_id] = fleet.add_jobs(1)
    with fleet.db.reader() as s:
        profile = routable_profile(s, fleet.svc.settings, fleet.clock())
    if profile is not None:
        assert dispatch_job(fleet.db, fleet.svc.celery, job_id, profile)
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

    # While the L4 backs off, the API sends new work to the warm fallback.
    fleet.clock.advance(10)
    during, routed = submit(fleet)
    assert routed == "p100-par1"

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
    assert any("p100-par1: not grown" in r for r in fleet.reports[-1].plan.held_back)

    # The P100 finishes what it holds (the job it runs, then the one on its queue)...
    assert fleet.finish_all() == 1 and fleet.claim_all() == 1
    assert job_profile(fleet, during) == "p100-par1"
    fleet.reconcile(advance=5)
    assert fleet.finish_all() == 1
    # ...and is retired when idle, while the L4 keeps serving.
    fleet.reconcile(advance=61)
    settle_teardown(fleet)
    assert [w.profile for w in live(fleet)] == ["l4-par2"]
    assert servers_in(fleet, "fr-par-1") == []
    [gone] = fleet.workers(WorkerState.DELETED.value)
    assert (gone.profile, gone.delete_reason) == ("p100-par1", "idle")

    # The next job goes to the preferred profile's warm worker.
    assert fleet.ready_all() == 1
    _, routed = submit(fleet)
    assert routed == "l4-par2"
