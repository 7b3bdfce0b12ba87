"""Control-queue tasks of the fleet: the beat-driven reconcile."""

from __future__ import annotations

from typing import Any

from app.fleet.liveness import reconciled_within
from tasks.celery_app import celery_app
from tasks.fleet.reconcile import reconcile as reconcile_fleet
from tasks.fleet.services import FleetServices, process_services


def due(svc: FleetServices) -> bool:
    """Whether a reconcile is due: not if one completed within half an interval.

    Two beats (an orphaned one and its replacement) send twice per interval; the second send
    then costs one Redis read instead of a full round. Runs never overlap either way: the
    reconcile lease allows one at a time.
    """
    half = svc.settings.fleet.reconcile_interval_seconds / 2
    return not reconciled_within(svc.redis, svc.clock(), half)


@celery_app.task(name="murmur.control.reconcile", ignore_result=True)
def reconcile() -> dict[str, Any]:
    """Plan and apply one fleet step; a no-op while another run holds the lock."""
    svc = process_services()
    if not due(svc):
        return {"ran": False, "actions": 0, "planned_hourly_eur": None}
    report = reconcile_fleet(svc)
    plan = report.plan
    return {
        "ran": report.ran,
        "actions": len(plan.actions) if plan else 0,
        "planned_hourly_eur": plan.planned_hourly_eur if plan else None,
    }
