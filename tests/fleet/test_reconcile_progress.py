"""A long but working reconcile stays live, never repeats a teardown, never skips the next tick.

Review of issue 11, M4 and L1: the control plane's liveness is its progress (app.fleet.liveness),
a re-plan after a stock-out does not send the same teardowns again, and the beat's duplicate
check counts from the start of the last run. Real Redis, a real database, the fake provider
(app/fleet/providers/fake.py) whose calls step the fake clock, for slow provider answers.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from app.fleet.liveness import control_plane_problem, last_reconciled
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.fake import FakeProvider
from app.models import Worker, WorkerState
from tasks.control import due
from tests.fleet.conftest import L4, P100, Fleet, MakeFleet


class _Slow:
    """Provider calls that take `seconds` of fake time each (the fake provider's `on_call`),
    and the largest age of the control plane's liveness seen while the run was busy."""

    def __init__(self, fleet: Fleet, seconds: dict[str, float]) -> None:
        self.fleet = fleet
        self.seconds = seconds
        self.worst_age = 0.0

    def __call__(self, operation: str) -> None:
        self.fleet.clock.advance(self.seconds.get(operation, 0.0))
        last = last_reconciled(self.fleet.svc.redis)
        if last is not None:
            age = self.fleet.clock().timestamp() - last
            self.worst_age = max(self.worst_age, age)


def _slow(fleet: Fleet, **seconds: float) -> tuple[FakeProvider, _Slow]:
    slow = _Slow(fleet, seconds)
    provider = FakeProvider("scaleway", on_call=slow)
    providers = ProviderRegistry(fleet.svc.settings, {"scaleway": provider})
    fleet.svc = replace(fleet.svc, providers=providers)
    return provider, slow


def _pending_teardowns(fleet: Fleet, n: int) -> list[str]:
    ids = [f"srv-pending-{i:02d}" for i in range(n)]
    with fleet.db.session() as s:
        for i, instance_id in enumerate(ids):
            s.add(
                Worker(
                    id=f"wrk_pending_{i:02d}",
                    profile="l4-par2",
                    provider="scaleway",
                    state=WorkerState.DELETING.value,
                    instance_id=instance_id,
                    hourly_cost_eur=0.0,
                    requested_at=fleet.clock(),
                    delete_requested_at=fleet.clock(),
                    delete_reason="idle",
                )
            )
    return ids


def test_a_long_run_of_teardowns_stays_live(make_fleet: MakeFleet) -> None:
    """12 teardowns of 5 s each outlast nothing: the age never passes one teardown's time."""
    fleet = make_fleet([L4])
    probe, slow = _slow(fleet, delete=5.0)
    assert fleet.reconcile().ran  # the control plane was live before
    probe.stuck.update(_pending_teardowns(fleet, 12))
    stale = fleet.svc.settings.fleet.reconcile_stale_seconds
    fleet.clock.advance(1)
    started = fleet.clock()

    report = fleet.reconcile()

    assert report.ran
    assert len(probe.targets("delete")) == 12
    assert fleet.clock() - started >= timedelta(seconds=60)  # a minute of provider time
    assert slow.worst_age <= 5.0 + 1.0
    now = fleet.clock().timestamp()
    assert control_plane_problem(fleet.svc.redis, now, now, stale) is None


def test_a_re_plan_after_a_stock_out_does_not_repeat_teardowns(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4, P100])
    probe, _ = _slow(fleet)
    pending = _pending_teardowns(fleet, 3)
    probe.stuck.update(pending)
    probe.out_of_stock.add("l4-par2")
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert len(report.plans) == 2  # L4 out of stock, then P100 in the same run
    assert sorted(w.profile for w in fleet.workers(WorkerState.BOOTING.value)) == ["p100-par1"]
    assert sorted(probe.targets("delete")) == pending  # each sent once, not per plan

    fleet.reconcile(advance=5)
    assert sorted(probe.targets("delete")) == sorted(pending * 2)  # and again the next round


def test_a_run_longer_than_half_an_interval_does_not_skip_the_next_tick(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet([L4])  # reconcile every 5 s
    _slow(fleet, list=3.0)  # reading the provider takes 3 s: more than half an interval
    assert fleet.reconcile().ran
    fleet.clock.advance(2.0)  # the next beat tick, 5 s after the run started
    assert due(fleet.svc)
    assert fleet.reconcile().ran
