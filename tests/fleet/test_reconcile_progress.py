"""A long but working reconcile stays live, never repeats a teardown, never skips the next tick.

Review of issue 11, M4 and L1: the control plane's liveness is its progress (app.fleet.liveness),
a re-plan after a stock-out does not send the same teardowns again, and the beat's duplicate
check counts from the start of the last run. Real Redis, a real database, the emulator; the
fake clock stands in for slow provider answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from app.config import Profile
from app.fleet.liveness import control_plane_problem, last_reconciled
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.base import Bind, Instance, Provider, Teardown
from app.models import Worker, WorkerState
from tasks.control import due
from tests.fleet.conftest import L4, P100, Fleet, MakeFleet


class _SlowProvider:
    """The emulator's provider, with calls that take `seconds` of fake time each.

    Teardowns of the instances in `stuck` stay pending (a server that is not gone yet).
    """

    def __init__(self, fleet: Fleet, inner: Provider, seconds: dict[str, float]) -> None:
        self.fleet = fleet
        self.inner = inner
        self.seconds = seconds
        self.stuck: set[str] = set()
        self.deletes: list[str] = []
        self.worst_age = 0.0  # the largest liveness age seen while the run was busy

    def _take(self, op: str) -> None:
        self.fleet.clock.advance(self.seconds.get(op, 0.0))
        last = last_reconciled(self.fleet.svc.redis)
        if last is not None:
            age = self.fleet.clock().timestamp() - last
            self.worst_age = max(self.worst_age, age)

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        self._take("create")
        return self.inner.create(profile, worker_id, bind)

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        return self.inner.get(instance_id, resources)

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        self._take("list")
        return self.inner.list_by_tag(scopes)

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        self._take("delete")
        self.deletes.append(instance_id)
        if instance_id in self.stuck:
            return Teardown(False, resources, "server stopping")
        return self.inner.delete(instance_id, resources)

    def availability(self, profile: Profile) -> str | None:
        return self.inner.availability(profile)


def _slow(fleet: Fleet, **seconds: float) -> _SlowProvider:
    inner = fleet.svc.providers["scaleway"]
    probe = _SlowProvider(fleet, inner, seconds)
    providers = ProviderRegistry(fleet.svc.settings, {"scaleway": probe})
    fleet.svc = replace(fleet.svc, providers=providers)
    return probe


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
    probe = _slow(fleet, delete=5.0)
    assert fleet.reconcile().ran  # the control plane was live before
    probe.stuck.update(_pending_teardowns(fleet, 12))
    stale = fleet.svc.settings.fleet.reconcile_stale_seconds
    fleet.clock.advance(1)
    started = fleet.clock()

    report = fleet.reconcile()

    assert report.ran
    assert len(probe.deletes) == 12
    assert fleet.clock() - started >= timedelta(seconds=60)  # a minute of provider time
    assert probe.worst_age <= 5.0 + 1.0
    now = fleet.clock().timestamp()
    assert control_plane_problem(fleet.svc.redis, now, now, stale) is None


def test_a_re_plan_after_a_stock_out_does_not_repeat_teardowns(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4, P100])
    assert fleet.emulator is not None
    probe = _slow(fleet)
    pending = _pending_teardowns(fleet, 3)
    probe.stuck.update(pending)
    fleet.emulator.inject("create", "out_of_stock", commercial_type="L4-1-24G")
    fleet.add_jobs(1)

    report = fleet.reconcile()

    assert len(report.plans) == 2  # L4 out of stock, then P100 in the same run
    assert sorted(w.profile for w in fleet.workers(WorkerState.BOOTING.value)) == ["p100-par1"]
    assert sorted(probe.deletes) == pending  # each pending teardown sent once, not per plan

    fleet.reconcile(advance=5)
    assert sorted(probe.deletes) == sorted(pending * 2)  # and again the next round


def test_a_run_longer_than_half_an_interval_does_not_skip_the_next_tick(
    make_fleet: MakeFleet,
) -> None:
    fleet = make_fleet([L4])  # reconcile every 5 s
    _slow(fleet, list=3.0)  # reading the provider takes 3 s: more than half an interval
    assert fleet.reconcile().ran
    fleet.clock.advance(2.0)  # the next beat tick, 5 s after the run started
    assert due(fleet.svc)
    assert fleet.reconcile().ran
