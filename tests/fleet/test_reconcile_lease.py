"""The reconcile lock is a short lease renewed while its run is alive (real Redis, real processes).

A control worker SIGKILLed mid-run is replaced within about one lease; a slow run that is
alive keeps its lock past the lease length; two schedulers firing reconciles at once never run
two of them together and never provision twice for the same jobs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from app.config import Profile
from app.fleet.lease import Lease, LeaseLost
from app.fleet.liveness import RECONCILED_KEY, last_reconciled
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.base import Bind, Instance, Provider, Teardown
from app.fleet.providers.scaleway import ScalewayProvider
from app.fleet.reconcile import LOCK_KEY, reconcile
from app.models import WorkerState
from app.services import Services, utc_clock
from tasks.control import due
from tests.conftest import REDIS_URL
from tests.fleet.conftest import (
    ACCESS_KEY,
    L4,
    P100,
    PROJECT_ID,
    SECRET_KEY,
    SIGNING_KEY,
    Fleet,
    MakeFleet,
)
from tests.fleet.test_reconcile import live, servers_in

ROOT = Path(__file__).resolve().parents[2]
# Long enough that a loaded test machine does not starve the watchdog (it renews every third).
LEASE = 2.0


def _holder_settings(fleet: Fleet) -> dict[str, Any]:
    """The raw settings of `fleet`, for a reconcile in another process (same DB, Redis, API)."""
    settings = fleet.svc.settings
    return {
        "redis_url": REDIS_URL,
        "database_url": fleet.db.url,
        "profiles": [L4, P100],
        "security_groups": {
            name: {"id": g.id, "zone": g.zone} for name, g in settings.security_groups.items()
        },
        "fleet": {**settings.fleet.model_dump(), "provider_timeout_seconds": 60.0},
        "scaleway": {"api_url": settings.scaleway.api_url, "project_id": PROJECT_ID},
        "scaleway_access_key": ACCESS_KEY,
        "scaleway_secret_key": SECRET_KEY,
        "signing_key": SIGNING_KEY,
    }


@pytest.mark.serial  # bounds a replacement in lease periods of wall time
def test_a_killed_control_worker_is_replaced_within_a_lease(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(fleet={"reconcile_lease_seconds": LEASE})
    assert fleet.emulator is not None
    # The holder's create hangs: it is mid-run, alive, for as long as the test needs.
    fleet.emulator.inject("create", "slow", zone="fr-par-2", delay=20.0, times=1)
    fleet.add_jobs(1)
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.fleet.reconcile_holder", json.dumps(_holder_settings(fleet))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 20
        while fleet.svc.redis.get(LOCK_KEY) is None:
            assert holder.poll() is None, holder.stdout.read() if holder.stdout else ""
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.02)

        # Alive and slow: the lock outlives the lease several times over.
        held_until = time.monotonic() + 3 * LEASE
        while time.monotonic() < held_until:
            assert fleet.reconcile().ran is False
            time.sleep(0.1)
        assert holder.poll() is None

        holder.send_signal(signal.SIGKILL)
        holder.wait(5)
        killed = time.monotonic()
        while True:
            taker = Lease(fleet.svc.redis, LOCK_KEY, LEASE)
            if taker.acquire():
                took = time.monotonic() - killed
                taker.release()
                break
            assert time.monotonic() - killed < 10 * LEASE, "the dead holder's lock never expired"
            time.sleep(0.02)
        assert fleet.reconcile().ran  # and the next reconcile runs
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(5)
        if holder.stdout is not None:
            holder.stdout.close()
    # Its last renewal was at most a third of a lease before the kill.
    assert took <= 1.5 * LEASE, f"a dead holder was replaced after {took:.2f} s"


def test_a_slow_live_run_keeps_its_lock_and_completes(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(fleet={"reconcile_lease_seconds": LEASE, "provider_timeout_seconds": 10.0})
    assert fleet.emulator is not None
    fleet.emulator.inject("create", "slow", zone="fr-par-2", delay=3 * LEASE, times=1)
    fleet.add_jobs(1)
    other = replace(fleet.svc, redis=redis.Redis.from_url(REDIS_URL))
    result: dict[str, Any] = {}
    run = threading.Thread(target=lambda: result.update(report=reconcile(fleet.svc)))
    run.start()
    try:
        deadline = time.monotonic() + 10
        while fleet.svc.redis.get(LOCK_KEY) is None and run.is_alive():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        refused = 0
        while run.is_alive():
            refused += reconcile(other).ran is False
            time.sleep(0.1)
    finally:
        run.join(30)
        other.redis.close()
    report = result["report"]
    assert report.ran and refused >= 20  # 3 leases long, refused every 0.1 s
    assert [w.profile for w in live(fleet)] == ["l4-par2"]  # the slow create was not abandoned
    assert len(servers_in(fleet, "fr-par-2")) == 1
    assert fleet.svc.redis.get(LOCK_KEY) is None  # released at the end
    assert last_reconciled(fleet.svc.redis) == fleet.clock().timestamp()


def test_a_lease_lost_to_another_owner_stops_the_holder(clean_redis: redis.Redis) -> None:
    lease = Lease(clean_redis, LOCK_KEY, LEASE)
    assert lease.acquire()
    try:
        lease.check()
        clean_redis.set(LOCK_KEY, "someone else", px=10_000)  # as after an expiry and takeover
        deadline = time.monotonic() + 3 * LEASE
        lost = False
        while not lost and time.monotonic() < deadline:
            try:
                lease.check()
                time.sleep(0.05)
            except LeaseLost:
                lost = True
        assert lost
    finally:
        lease.release()
    # Neither renewal nor release touched the other owner's lease.
    assert clean_redis.get(LOCK_KEY) == b"someone else"
    assert clean_redis.pttl(LOCK_KEY) > 5_000


class _Probe:
    """A provider that counts how many reconcile runs call it at the same time."""

    def __init__(self, inner: Provider) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.active = 0
        self.most = 0
        self.creates = 0

    def _enter(self) -> None:
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.02)  # widen the window in which an overlap would show

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1

    def create(self, profile: Profile, worker_id: str, bind: Bind) -> Instance:
        self._enter()
        try:
            self.creates += 1
            return self._inner.create(profile, worker_id, bind)
        finally:
            self._leave()

    def get(self, instance_id: str, resources: Mapping[str, Any]) -> Instance | None:
        self._enter()
        try:
            return self._inner.get(instance_id, resources)
        finally:
            self._leave()

    def list_by_tag(self, scopes: frozenset[str]) -> list[Instance]:
        self._enter()
        try:
            return self._inner.list_by_tag(scopes)
        finally:
            self._leave()

    def delete(self, instance_id: str, resources: Mapping[str, Any]) -> Teardown:
        self._enter()
        try:
            return self._inner.delete(instance_id, resources)
        finally:
            self._leave()

    def availability(self, profile: Profile) -> str | None:
        return self._inner.availability(profile)


def test_two_schedulers_never_run_two_reconciles_nor_provision_twice(
    make_fleet: MakeFleet,
) -> None:
    """Two beats (an orphan and its replacement) each send the task every interval."""
    fleet = make_fleet(fleet={"reconcile_lease_seconds": LEASE, "reconcile_interval_seconds": 0.2})
    settings = fleet.svc.settings
    probe = _Probe(ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0))
    providers = ProviderRegistry(settings, {"scaleway": probe})
    fleet.add_jobs(3)
    fleet.svc.redis.delete(RECONCILED_KEY)
    schedulers = [
        replace(fleet.svc, providers=providers, clock=utc_clock),
        replace(
            fleet.svc,
            providers=providers,
            clock=utc_clock,
            redis=redis.Redis.from_url(REDIS_URL),
        ),
    ]
    ran = [0, 0]
    skipped = [0, 0]

    def beat(i: int, svc: Services) -> None:
        stop = time.monotonic() + 3.0
        for _ in range(300):  # bounded in count and time
            if time.monotonic() > stop:
                return
            if not due(svc):  # the task's duplicate-send check
                skipped[i] += 1
            elif reconcile(svc).ran:
                ran[i] += 1
            time.sleep(0.005)

    threads = [threading.Thread(target=beat, args=(i, s)) for i, s in enumerate(schedulers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    schedulers[1].redis.close()

    assert sum(ran) >= 5 and sum(skipped) >= 5, (ran, skipped)
    assert probe.most == 1  # never two runs calling the provider at once
    assert probe.creates == 3  # one server per job, L4 first: nothing provisioned twice
    assert sorted(w.profile for w in live(fleet)) == ["l4-par2"] * 3
    assert len(servers_in(fleet, "fr-par-2")) == 3
    assert fleet.workers(WorkerState.FAILED.value) == []


def test_a_duplicate_send_right_after_a_run_is_skipped(make_fleet: MakeFleet) -> None:
    fleet = make_fleet()  # reconcile every 5 s
    fleet.svc.redis.delete(RECONCILED_KEY)
    assert due(fleet.svc)
    assert fleet.reconcile().ran
    assert not due(fleet.svc)
    fleet.clock.advance(2.4)
    assert not due(fleet.svc)
    fleet.clock.advance(0.2)
    assert due(fleet.svc)
