"""One reconcile run: take the Redis lock, read the fleet, plan, apply, publish the plan.

Only one run acts at a time: the lock is a short lease (app.fleet.lease) that a watchdog
thread renews while the run is alive, so a control worker that dies is replaced within one
lease, however long a live run takes; the run checks it still holds the lease before every
action and stops at once if not. After an out-of-stock answer the run reads and plans again, so
the next profile in order is tried within the same run (at most once per profile). A run that
starts, acts and completes records when (app.fleet.liveness, at most once a second while it
acts), which `/readyz` and `/metrics` read: a long run that keeps acting is live. A re-plan
never repeats a teardown this run already sent: a server not gone yet is confirmed next round.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis

from app.fleet import broker_users
from app.fleet.apply import Outcome, apply_plan
from app.fleet.lease import Lease, LeaseLost
from app.fleet.liveness import PLAN_KEY, record_reconciled, record_started
from app.fleet.planner import FleetPlan, plan_fleet
from app.fleet.rules import fleet_rules
from app.fleet.snapshot import read_snapshot
from app.services import Services

log = logging.getLogger("murmur.fleet")

LOCK_KEY = "murmur:fleet:reconcile-lock"
# The name callers knew when the lock was a plain expiring lock.
LockLost = LeaseLost


@dataclass
class ReconcileReport:
    ran: bool
    plans: list[FleetPlan] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def plan(self) -> FleetPlan | None:
        return self.plans[-1] if self.plans else None


def lock_seconds(svc: Services) -> float:
    # How long a slow run may take (a create is a few bounded provider calls); the lock itself
    # is a shorter lease, renewed while the run is alive.
    fleet = svc.settings.fleet
    return max(60.0, 6 * fleet.provider_timeout_seconds + 2 * fleet.reconcile_interval_seconds)


# The fleet's own continuity: {"since": first round after a stop, "last": latest round}.
LISTENING_KEY = "murmur:fleet:listening"


def _stop_threshold(svc: Services) -> timedelta:
    """A gap between rounds longer than this means the fleet was stopped, not just slow.

    Well above the time between ordinary rounds (a slow run holds the lock this long), and
    at least the silence tolerated when nobody is heard: a stop shorter than that is
    already covered by the planner's suspicion of the control plane.
    """
    rules = fleet_rules(svc.settings)
    fleet = svc.settings.fleet
    slow_round = timedelta(seconds=lock_seconds(svc) + 2 * fleet.reconcile_interval_seconds)
    tolerated = [t for t in (rules.heartbeat_timeout, rules.outage_timeout) if t is not None]
    return max([slow_round, *tolerated])


def listening_since(svc: Services, now: datetime) -> datetime:
    """When the fleet last started watching the workers, recording this round.

    A round that follows a stop (see `_stop_threshold`) starts watching afresh: nothing could
    hear the workers meanwhile, so their silence must not get them all deleted the moment
    the control plane is back. A clock that stepped back is not a stop.
    """
    since = now
    raw = svc.redis.get(LISTENING_KEY)
    if raw is not None:
        try:
            record = json.loads(raw)
            last = datetime.fromisoformat(record["last"])
            if now - last <= _stop_threshold(svc):
                since = min(datetime.fromisoformat(record["since"]), now)
        except (ValueError, KeyError, TypeError):
            log.warning("fleet: unreadable %s; watching afresh", LISTENING_KEY)
    svc.redis.set(LISTENING_KEY, json.dumps({"since": since.isoformat(), "last": now.isoformat()}))
    return since


def reconcile(svc: Services) -> ReconcileReport:
    lease = Lease(svc.redis, LOCK_KEY, svc.settings.fleet.reconcile_lease_seconds)
    if not lease.acquire():
        log.debug("fleet: another reconcile is running")
        return ReconcileReport(ran=False)
    progressed = svc.clock()

    def keep_lock() -> None:
        nonlocal progressed
        lease.check()
        # The control plane's liveness is progress, not only completion (app.fleet.liveness).
        now = svc.clock()
        if abs((now - progressed).total_seconds()) >= 1.0:
            progressed = now
            record_reconciled(svc.redis, now)

    report = ReconcileReport(ran=True)
    try:
        record_started(svc.redis, svc.clock())
        since = listening_since(svc, svc.clock())
        torn_down: set[str] = set()  # workers whose teardown this run already advanced
        for _ in range(len(svc.settings.profiles) + 1):
            keep_lock()
            snapshot = read_snapshot(svc, svc.clock(), since)
            plan = plan_fleet(snapshot.state)
            outcome = apply_plan(svc, snapshot, plan, keep_lock, torn_down)
            report.plans.append(plan)
            report.outcomes.append(outcome)
            if not outcome.stocked_out:
                break
        if report.plan is not None:
            keep_lock()
            publish_plan(svc, report.plan)
        keep_lock()
        broker_users.sweep_users(svc)  # users of workers retired by any path, or lost
        keep_lock()
        record_reconciled(svc.redis, svc.clock())
    except LeaseLost:
        # Another run may be acting now; what this one did is consistent (every step is a
        # compare-and-set) and the next run re-reads everything.
        log.warning("fleet: reconcile lease lost mid-run; stopped")
    finally:
        # Only deletes the key if it is still ours: after a loss it may be another run's.
        lease.release()
    return report


# Rules quoted per plan in /v1/fleet (each new worker and each idle deletion says which).
MAX_DECISIONS = 50


def plan_summary(plan: FleetPlan) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for action in plan.actions:
        kinds[type(action).__name__] = kinds.get(type(action).__name__, 0) + 1
    return {
        "at": plan.now.isoformat(),
        "current_hourly_eur": plan.current_hourly_eur,
        "planned_hourly_eur": plan.planned_hourly_eur,
        "held_back": list(plan.held_back),
        "waiting": plan.waiting,
        "actions": kinds,
        "decisions": list(plan.decisions)[:MAX_DECISIONS],
        "profiles": {p.name: asdict(p) for p in plan.profiles},
    }


def publish_plan(svc: Services, plan: FleetPlan) -> None:
    """Keep the latest plan for /v1/fleet and metrics; log the bounds that changed."""
    summary = plan_summary(plan)
    ttl = int(max(60, 10 * svc.settings.fleet.reconcile_interval_seconds))
    try:
        previous = svc.redis.getset(PLAN_KEY, json.dumps(summary))
        svc.redis.expire(PLAN_KEY, ttl)
    except redis.RedisError as exc:
        log.warning("fleet: cannot publish the plan: %s", type(exc).__name__)
        return
    before: list[str] = []
    if previous:
        try:
            before = list(json.loads(previous).get("held_back", []))
        except ValueError:
            before = []
    for reason in plan.held_back:
        if reason not in before:  # say it once, not every few seconds
            log.info("fleet: held back: %s", reason)
