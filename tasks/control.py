"""Control-queue tasks of the fleet: the beat-driven reconcile."""

from __future__ import annotations

from typing import Any

from tasks.celery_app import celery_app
from tasks.fleet.reconcile import reconcile as reconcile_fleet
from tasks.fleet.services import process_services


@celery_app.task(name="murmur.control.reconcile", ignore_result=True)
def reconcile() -> dict[str, Any]:
    """Plan and apply one fleet step; a no-op while another run holds the lock."""
    report = reconcile_fleet(process_services())
    plan = report.plan
    return {
        "ran": report.ran,
        "actions": len(plan.actions) if plan else 0,
        "planned_hourly_eur": plan.planned_hourly_eur if plan else None,
    }
