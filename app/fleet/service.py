"""The operators' view of the fleet, per profile and per worker: `/v1/fleet` and `murmur fleet`.

Read-only: profiles from the configuration, what the fleet learned (back-off, errors) and the
workers from the database, queue depths and the last published plan from Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import func, or_, select

from app.config import Profile, Settings
from app.db import Database, as_utc
from app.fleet.boot_policy import boot_estimate
from app.fleet.learned import Learned, compute_learned, read_learned
from app.fleet.liveness import PLAN_KEY
from app.fleet.plan_records import FleetRules
from app.fleet.rules import fleet_rules
from app.models import (
    LIVE_WORKER_STATES,
    Job,
    JobStatus,
    ProfileState,
    Worker,
    WorkerState,
    iso,
    server_gone,
)
from app.observability.store import last_reports
from gpu_worker.protocol.broker import queue_name

__all__ = ["PLAN_KEY", "fleet_overview", "queue_depths", "read_plan"]
# Deleted workers stay listed this long, so an operator sees what just happened.
RECENTLY_DELETED = timedelta(hours=1)
MAX_LISTED_WORKERS = 500
_BILLED = (*LIVE_WORKER_STATES, WorkerState.DELETING.value)
_TIMINGS = (
    ("created", "created_at"),
    ("booted", "booted_at"),
    ("ready", "ready_at"),
    ("first_job", "first_job_at"),
    ("idle", "idle_since"),
    ("delete_requested", "delete_requested_at"),
    ("deleted", "deleted_at"),
)


def _billed(w: Worker) -> bool:
    """Whether a worker still costs its GPU price: until its instance is confirmed gone."""
    return w.state in _BILLED and w.deleted_at is None and not server_gone(w.resources)


def read_plan(client: redis.Redis) -> dict[str, Any] | None:
    """The last plan a reconcile published, or None (no run lately, or Redis unreachable)."""
    try:
        raw = client.get(PLAN_KEY)
    except redis.RedisError:
        return None
    if not raw:
        return None
    try:
        plan: dict[str, Any] = json.loads(raw)
    except ValueError:
        return None
    return plan


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    a, b = as_utc(a), as_utc(b)
    return None if a is None or b is None else round((b - a).total_seconds(), 1)


def queue_depths(client: redis.Redis, names: list[str]) -> dict[str, int | None]:
    """LLEN of each `transcribe.<profile>` list; None when Redis cannot say."""
    try:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.llen(queue_name(name))
        return {n: int(v) for n, v in zip(names, pipe.execute(), strict=True)}
    except redis.RedisError:
        return dict.fromkeys(names)


@dataclass(frozen=True)
class _Rows:
    """What the database says of the fleet: profile state, recent workers, jobs per profile."""

    learned: dict[str, ProfileState]
    workers: list[Worker]
    jobs: dict[str, dict[str, int]]  # profile -> status -> count (dispatched and running)
    waiting: int
    oldest_waiting: datetime | None


def _read_rows(db: Database, now: datetime) -> _Rows:
    with db.reader() as s:
        learned = {r.name: r for r in s.scalars(select(ProfileState))}
        workers = list(
            s.scalars(
                select(Worker)
                .where(
                    or_(Worker.deleted_at.is_(None), Worker.deleted_at >= now - RECENTLY_DELETED)
                )
                .order_by(Worker.requested_at.desc())
                .limit(MAX_LISTED_WORKERS)
            )
        )
        job_rows = s.execute(
            select(Job.profile, Job.status, func.count())
            .where(Job.status.in_([JobStatus.DISPATCHED.value, JobStatus.RUNNING.value]))
            .group_by(Job.profile, Job.status)
        ).all()
        waiting = s.execute(
            select(func.count(), func.min(Job.created_at)).where(
                Job.status == JobStatus.QUEUED.value
            )
        ).one()
    jobs: dict[str, dict[str, int]] = {}
    for profile, status, count in job_rows:
        jobs.setdefault(profile or "", {})[status] = int(count)
    return _Rows(learned, workers, jobs, int(waiting[0] or 0), waiting[1])


def _plan_view(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """The published plan as `/v1/fleet` shows it (None: no recent run, or no Redis)."""
    if not plan:
        return None
    return {
        "at": plan.get("at"),
        "held_back": plan.get("held_back", []),
        "waiting": plan.get("waiting"),
        "actions": plan.get("actions", {}),
        # Which rule decided each new worker and each idle deletion.
        "decisions": plan.get("decisions", []),
    }


def fleet_overview(
    settings: Settings, db: Database, client: redis.Redis | None, now: datetime
) -> dict[str, Any]:
    """The fleet as `/v1/fleet` shows it. `client` None: the broker is known to be out of
    reach, so what only Redis holds (queues, the plan, report ages) is unknown (None)."""
    names = [p.name for p in settings.profiles]
    rows = _read_rows(db, now)
    workers = rows.workers
    # Reports are recorded in Redis only (app/observability/store.py), never on the row.
    if client is None:
        depths: dict[str, int | None] = dict.fromkeys(names)
        reported: dict[str, datetime] = {}
        plan = None
    else:
        depths = queue_depths(client, names)
        reported = last_reports(client, [w.id for w in workers])
        plan = read_plan(client)
    planned: dict[str, Any] = (plan or {}).get("profiles", {})
    # Without Redis (murmur fleet when the broker is unreachable) the figures are computed anew.
    images = {p.name: p.worker_image for p in settings.profiles}
    history = (
        compute_learned(db, now, images)
        if client is None
        else read_learned(db, client, now, images)
    )
    rules = fleet_rules(settings)
    profiles = [
        {
            **_profile(
                p,
                rows.learned.get(p.name),
                workers,
                rows.jobs.get(p.name, {}),
                depths,
                planned,
                now,
            ),
            **_learned(p.name, history, rules),
        }
        for p in settings.profiles
    ]
    current_total = sum(w.hourly_cost_eur for w in workers if _billed(w))
    return {
        "at": iso(now),
        "budget": {
            "max_hourly_eur": settings.budget.max_hourly_eur,
            "current_hourly_eur": round(current_total, 4),
            "planned_hourly_eur": (plan or {}).get("planned_hourly_eur"),
        },
        "waiting_jobs": rows.waiting,
        "oldest_waiting_seconds": _seconds(rows.oldest_waiting, now),
        "plan": _plan_view(plan),
        "profiles": profiles,
        "workers": [_worker(w, reported.get(w.id), now) for w in workers],
    }


def _profile(
    p: Profile,
    st: ProfileState | None,
    workers: list[Worker],
    jobs: dict[str, int],
    depths: dict[str, int | None],
    planned: dict[str, Any],
    now: datetime,
) -> dict[str, Any]:
    """One profile's entry: its settings, what the fleet learned, its workers and jobs."""
    mine = [w for w in workers if w.profile == p.name]
    by_state: dict[str, int] = {}
    for w in mine:
        if w.deleted_at is None:
            by_state[w.state] = by_state.get(w.state, 0) + 1
    current = sum(w.hourly_cost_eur for w in mine if _billed(w))
    backoff = as_utc(st.backoff_until) if st else None
    retry = as_utc(st.retry_at) if st else None
    return {
        "name": p.name,
        "provider": p.provider,
        "zone": p.zone,
        "server_type": p.server_type,
        "enabled": p.enabled,
        "max_workers": p.max_workers,
        "hourly_cost_eur": p.hourly_cost_eur,
        "backoff_until": iso(backoff) if backoff and backoff > now else None,
        "consecutive_stockouts": st.consecutive_stockouts if st else 0,
        # Workers in a row that never became ready (held at fleet.max_failed_boots).
        "consecutive_failed_boots": st.consecutive_failed_boots or 0 if st else 0,
        "retry_at": iso(retry) if retry and retry > now else None,
        "availability": st.availability if st else None,
        "last_error": st.last_error if st else None,
        "last_error_at": iso(st.last_error_at) if st else None,
        "workers": by_state,
        "queue_depth": depths.get(p.name),
        "jobs": {
            "dispatched": jobs.get(JobStatus.DISPATCHED.value, 0),
            "running": jobs.get(JobStatus.RUNNING.value, 0),
        },
        "current_hourly_eur": round(current, 4),
        "planned_hourly_eur": planned.get(p.name, {}).get("hourly_eur"),
    }


def _learned(name: str, history: Learned, rules: FleetRules) -> dict[str, Any]:
    """What the fleet measured of a profile, and the boot estimate (= boot timeout) from it."""
    samples = history.boots.get(name, ())
    return {
        "boot_estimate_seconds": round(boot_estimate(samples, rules), 1),
        "boots_measured": len(samples),
        # Audio seconds per wall second of transcription (None: no finished job yet).
        "speed": history.speed.get(name),
    }


def _worker(w: Worker, last_report: datetime | None, now: datetime) -> dict[str, Any]:
    end = w.deleted_at or now
    seen = as_utc(w.last_seen_at)
    if last_report is not None and (seen is None or last_report > seen):
        seen = last_report
    return {
        "id": w.id,
        "profile": w.profile,
        "provider": w.provider,
        "instance_id": w.instance_id,
        "state": w.state,
        "age_seconds": _seconds(w.requested_at, end),
        # The latest accepted usage report (None: none, or observability is off) ...
        "last_report_age_seconds": _seconds(last_report, now),
        # ... and the latest sign of life of any kind (report, heartbeat, claim, result):
        # what the fleet's dead-worker rule reads (app/fleet/snapshot.py).
        "last_seen_age_seconds": _seconds(seen, now),
        "current_job_id": w.current_job_id,
        "jobs_done": w.jobs_done,
        "hourly_cost_eur": w.hourly_cost_eur,
        "error": w.error,
        "delete_reason": w.delete_reason,
        "requested_at": iso(w.requested_at),
        # Seconds from the request to each lifecycle step (None: not reached).
        "timings": {name: _seconds(w.requested_at, getattr(w, col)) for name, col in _TIMINGS},
    }
