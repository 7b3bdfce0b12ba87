"""What the fleet learned is shown: /v1/fleet (fleet_overview) and /metrics, and the plan says
which rule decided each new worker (issue 22 §3, §6)."""

from __future__ import annotations

from datetime import timedelta

from app.fleet.service import fleet_overview
from app.models import Job, JobStatus, Worker, WorkerState
from tests.fleet.conftest import L4, MakeFleet
from tests.fleet.test_fleet_faults import _metric


def test_the_boot_estimate_speed_and_deciding_rule_are_shown(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4], fleet={"boot_timeout_seconds": 900.0})
    now = fleet.clock()
    with fleet.db.session() as s:
        for i, seconds in enumerate((110.0, 120.0, 100.0)):  # three boots measured
            requested = now - timedelta(hours=2, seconds=i)
            s.add(
                Worker(
                    profile="l4-par2",
                    provider="scaleway",
                    state=WorkerState.DELETED.value,
                    requested_at=requested,
                    ready_at=requested + timedelta(seconds=seconds),
                )
            )
        s.add(
            Job(
                owner="t",
                source="upload",
                audio_key="x",
                status=JobStatus.SUCCEEDED.value,
                profile="l4-par2",
                duration_seconds=600.0,
                processing_seconds=24.0,
                created_at=now - timedelta(hours=2),
                finished_at=now - timedelta(hours=2) + timedelta(seconds=30),
            )
        )
        for i in range(3):  # three short jobs waiting: one worker drains them
            s.add(
                Job(
                    owner="t",
                    source="upload",
                    audio_key="x",
                    status=JobStatus.QUEUED.value,
                    duration_seconds=120.0,
                    created_at=now + timedelta(microseconds=i),
                )
            )
    fleet.reconcile()
    assert len(fleet.workers(WorkerState.CREATING.value, WorkerState.BOOTING.value)) == 1
    view = fleet_overview(fleet.svc.settings, fleet.db, fleet.svc.redis, fleet.clock())
    (l4,) = view["profiles"]
    assert l4["boot_estimate_seconds"] == 180.0  # p95 120 s × 1.5
    assert l4["boots_measured"] == 3 and l4["speed"] == 25.0
    assert view["plan"]["decisions"] == ["provision 1 x l4-par2: first worker for the waiting jobs"]
    assert _metric(fleet, "murmur_fleet_profile_boot_estimate_seconds", profile="l4-par2") == 180
    assert _metric(fleet, "murmur_fleet_profile_boots_measured", profile="l4-par2") == 3
    assert _metric(fleet, "murmur_fleet_profile_speed_ratio", profile="l4-par2") == 25.0
