"""Control-queue task of the fleet: the beat-driven reconcile, the only work the control
worker takes (app/celery_config.py routes everything that waits on a peer to `io`)."""

from __future__ import annotations

from typing import Any

from app.celery_config import RECONCILE
from app.fleet.liveness import started_within
from app.fleet.reconcile import reconcile as reconcile_fleet
from app.services import Services
from tasks import context
from tasks.celery_app import celery_app


def due(svc: Services) -> bool:
    """Whether a reconcile is due: not if one started within half an interval.

    Two beats (an orphaned one and its replacement) send twice per interval; the second send
    then costs one Redis read instead of a full round. Counted from the start, not the end, of
    the last run: a run longer than half an interval must not make the next tick skip. Runs
    never overlap either way: the reconcile lease allows one at a time.
    """
    half = svc.settings.fleet.reconcile_interval_seconds / 2
    return not started_within(svc.redis, svc.clock(), half)


@celery_app.task(name=RECONCILE.name, ignore_result=True)
def reconcile() -> dict[str, Any]:
    """Plan and apply one fleet step; a no-op while another run holds the lock."""
    svc = context.services()
    if not due(svc):
        return {"ran": False, "actions": 0, "planned_hourly_eur": None}
    report = reconcile_fleet(svc)
    plan = report.plan
    return {
        "ran": report.ran,
        "actions": len(plan.actions) if plan else 0,
        "planned_hourly_eur": plan.planned_hourly_eur if plan else None,
    }
