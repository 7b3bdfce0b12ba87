"""Read the fleet for the planner: profiles, workers, job aggregates, queue depths, inventory.

A job cut into parts (app/jobs/parts.py) is read as its parts: its waiting parts per profile
(`JobCounts.parts_waiting`), its unfinished parts in its owner's work in service.

Jobs are read as aggregates (GROUP BY) plus bounded lists: the head of each owner's queue per
kind of job (a window function, `_queued_heads`) and a sample of the active jobs, so the
planner's input stays bounded whatever the backlog (100,000 jobs: docs/performance.md).
Provider inventories that cannot be read are left out and marked unknown, so the planner
draws no conclusion from their silence.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, case, func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.db import as_utc
from app.fleet.dispatch_order import due_order, fair_order
from app.fleet.learned import Learned, read_learned
from app.fleet.planner import (
    ActiveJob,
    FleetState,
    InstanceSnapshot,
    JobCounts,
    ProfileSnapshot,
    WaitingJob,
    WorkerSnapshot,
)
from app.fleet.providers.base import Instance, ProviderError
from app.fleet.rules import fleet_rules
from app.fleet.served import read_served
from app.fleet.service import queue_depths
from app.jobs import routing
from app.jobs.parts import SPEAKERS_WORK_SHARE
from app.models import (
    SEEN_STARTING_AT,
    Job,
    JobPart,
    JobStatus,
    PartStatus,
    ProfileState,
    Worker,
    server_gone,
)
from app.observability.store import last_reports
from app.services import Services
from gpu_worker.protocol.capabilities import Need
from gpu_worker.protocol.claim import SPEAKERS_PART

log = logging.getLogger("murmur.fleet")

# Dispatched/running jobs examined per round for re-routing (the oldest first).
MAX_ACTIVE_JOBS = 2000
# Queued jobs the scaling policy weighs one by one (in their fair order); a backlog past this
# many already asks for every worker the bounds allow.
MAX_WAITING_JOBS = 500
# Queued jobs read per owner and kind of job (the oldest first), and in all: what the plan may
# dispatch this round and the scaling policy weighs (app/fleet/dispatch_order.py orders them).
MAX_HEAD_JOBS = MAX_WAITING_JOBS
MAX_CANDIDATES = 2000
# The oldest queued jobs ranked per owner and kind of job: past these, only each owner's
# oldest job is read (the cost stays flat whatever the backlog: docs/performance.md).
SCAN_WINDOW = 5000
# Owners whose queue heads are read (API tokens; a deployment has a few, or thousands).
MAX_OWNERS = 10_000


@dataclass(frozen=True)
class Snapshot:
    state: FleetState
    # The provider's own view of each listed instance (resources to tear down, zone).
    instances: dict[tuple[str, str], Instance]


def _latest(a: datetime | None, b: datetime | None) -> datetime | None:
    return max((t for t in (a, b) if t is not None), default=None)


def _due_heads(
    heads: Sequence[Any], learned: Learned, images: dict[str, str], now: datetime
) -> list[str]:
    """The queued heads' ids in due order (app/fleet/dispatch_order.py) at the fastest speed
    learned for a configured profile."""
    speeds = [v for k, v in learned.speed.items() if k in images]
    return due_order(
        ((h.id, as_utc(h.created_at) or now, h.duration) for h in heads),
        max(speeds, default=None),
    )


def read_snapshot(
    svc: Services, now: datetime, listening_since: datetime | None = None
) -> Snapshot:
    """Everything the planner needs, read now; `listening_since` comes from the reconcile."""
    rules = fleet_rules(svc.settings)
    db = _read_rows(svc)
    images = {p.name: p.worker_image for p in svc.settings.profiles}
    learned = read_learned(svc.db, svc.redis, now, images, note=True)
    instances, known = _inventory(svc, db.workers)
    routes = _routes(svc.settings, [h[:1] + h[4:8] for h in db.heads] + list(db.needs))
    owners = {h.id: h.owner for h in db.heads}
    served = read_served(svc.redis) if owners else {}
    heads = _due_heads(db.heads, learned, images, now)
    order = fair_order(heads, owners, db.in_service, served)
    by_id = {h.id: h for h in db.heads}
    state = FleetState(
        now=now,
        rules=rules,
        listening_since=listening_since,
        profiles=_profile_snapshots(svc, db.learned, learned),
        workers=_worker_snapshots(svc, db),
        inventory=tuple(
            InstanceSnapshot(
                provider=prov,
                instance_id=i.instance_id,
                state=i.state,
                worker_id=i.worker_id,
                profile=i.profile,
                detail=i.detail,
            )
            for (prov, _), i in sorted(instances.items())
        ),
        inventory_known=frozenset(known),
        queued=db.queued,
        oldest_queued_at=as_utc(db.oldest_queued_at),
        dispatchable=tuple(heads),
        job_counts=_job_counts(db.counts, db.part_counts),
        active_jobs=tuple(
            ActiveJob(
                id=a.id,
                profile=a.profile,
                status=a.status,
                worker_id=a.worker_id,
                dispatched_at=as_utc(a.dispatched_at),
                audio_seconds=a.duration_seconds,
                submitted_at=as_utc(a.created_at),
                started_at=as_utc(a.started_at),
                parted=a.id in db.parted,
            )
            for a in db.active
        ),
        running_parts=tuple(
            ActiveJob(
                id=pid,
                profile=profile,
                status=JobStatus.RUNNING.value,
                worker_id=worker_id,
                audio_seconds=float(span),
                started_at=as_utc(started),
            )
            for pid, profile, worker_id, span, started in db.running_parts
        ),
        waiting_jobs=tuple(
            WaitingJob(
                id=job_id,
                submitted_at=as_utc(by_id[job_id].created_at) or now,
                audio_seconds=by_id[job_id].duration,
                profiles=None if job_id not in routes else tuple(sorted(routes[job_id])),
                parts=db.head_parts.get(job_id, 0),
            )
            for job_id in order[:MAX_WAITING_JOBS]
        ),
        recent_arrivals=learned.arrivals,
        routes=routes,
        owners=owners,
        in_service=db.in_service,
        last_served=served,
    )
    return Snapshot(state=state, instances=instances)


def _routes(settings: Settings, needs: Sequence[Any]) -> dict[str, frozenset[str]]:
    """The jobs only some profiles can serve, and which (app/jobs/routing.py); oldest first."""
    everyone = frozenset(p.name for p in settings.profiles)
    routes: dict[str, frozenset[str]] = {}
    for job_id, language, task, model, diarize in needs:
        need = Need(
            language=language,
            task="translate" if task == "translate" else "transcribe",
            model=model,
            diarize=bool(diarize),
        )
        allowed = frozenset(p.name for p in routing.serving(settings.profiles, need))
        if allowed != everyone:
            routes[job_id] = allowed
    return routes


@dataclass(frozen=True)
class _Rows:
    """What the database says, read in one session."""

    learned: dict[str, ProfileState]
    workers: list[Worker]
    counts: Sequence[Row[str | None, str, int]]
    queued: int
    oldest_queued_at: datetime | None
    # rows of (id, profile, status, worker_id, dispatched_at, duration_seconds, created_at,
    # started_at)
    active: Sequence[Any]
    # The head of each owner's queue per kind of job, oldest first: rows of (id, owner,
    # duration, created_at, language, task, model, diarize); see `_queued_heads`.
    heads: Sequence[Any] = ()
    # Jobs dispatched or running, per owner (fair dispatch: app/fleet/dispatch_order.py).
    in_service: dict[str, int] = field(default_factory=dict)
    # (id, language, task, model, diarize) of the active sample
    needs: Sequence[Any] = ()
    # Parts of long jobs waiting on each profile's queue: (profile, count, seconds, oldest job)
    part_counts: Sequence[Any] = ()
    # Of the heads, the jobs cut into parts: how many spans each (its speakers part aside).
    head_parts: dict[str, int] = field(default_factory=dict)
    # Of the active sample, the jobs cut into parts.
    parted: frozenset[str] = frozenset()
    # Parts running now: rows of (id, profile, worker_id, seconds, started_at)
    running_parts: Sequence[Any] = ()


_ACTIVE_STATES = (JobStatus.DISPATCHED.value, JobStatus.RUNNING.value)
_OPEN_PARTS = (PartStatus.DISPATCHED.value, PartStatus.RUNNING.value)
_NEED_COLUMNS = (Job.id, Job.language, Job.task, Job.model, Job.diarize)


def _queued_ready() -> ColumnElement[bool]:
    return (Job.status == JobStatus.QUEUED.value) & Job.audio_key.is_not(None)


def _head_columns() -> tuple[Any, ...]:
    return (
        Job.id,
        Job.owner,
        Job.duration_seconds.label("duration"),
        Job.created_at,
        *_NEED_COLUMNS[1:],
    )


def _queued_heads(s: Session) -> Sequence[Any]:
    """The queued jobs the plan may dispatch, oldest first, read from indexes only:

    - among the oldest SCAN_WINDOW queued jobs, the first MAX_HEAD_JOBS of each (owner,
      language, task, model, diarize), every first before any second, MAX_CANDIDATES in all:
      a job only some profiles serve never hides one that others could take;
    - and every owner's oldest queued job, however deep the backlog ahead of it: one index
      seek per owner (a loose scan of the owners, then their queue's head).
    """
    kind = (Job.owner, Job.language, Job.task, Job.model, Job.diarize)
    oldest = (
        select(*_head_columns())
        .where(_queued_ready())
        .order_by(Job.created_at, Job.id)
        .limit(SCAN_WINDOW)
        .subquery()
    )
    by_kind = tuple(oldest.c[c.key] for c in kind)
    rank = func.row_number().over(partition_by=by_kind, order_by=(oldest.c.created_at, oldest.c.id))
    ranked = select(oldest, rank.label("rank")).subquery()
    heads = list(
        s.execute(
            select(*(ranked.c[c.name] for c in oldest.c))
            .where(ranked.c.rank <= MAX_HEAD_JOBS)
            .order_by(ranked.c.rank, ranked.c.created_at, ranked.c.id)
            .limit(MAX_CANDIDATES)
        ).all()
    )
    seen = {h.id for h in heads}
    firsts = [i for i in s.scalars(_owner_heads()) if i is not None and i not in seen]
    if firsts:
        heads.extend(s.execute(select(*_head_columns()).where(Job.id.in_(firsts))).all())
    return sorted(heads, key=lambda h: (as_utc(h.created_at), h.id))


def _owner_heads() -> Any:
    """Each owner's oldest queued job id (None for an owner with none): owners are walked one
    index seek each (`ix_jobs_owner_created`), their head read from
    `ix_jobs_owner_status_created`; no row of the backlog is scanned."""
    first = select(func.min(Job.owner).label("owner")).cte("owners", recursive=True)
    nxt = select(func.min(Job.owner)).where(Job.owner > first.c.owner).scalar_subquery()
    owners = first.union_all(select(nxt).where(first.c.owner.is_not(None)))
    head = (
        select(Job.id)
        .where(Job.owner == owners.c.owner, _queued_ready())
        .order_by(Job.created_at, Job.id)
        .limit(1)
        .scalar_subquery()
    )
    return select(head).where(owners.c.owner.is_not(None)).limit(MAX_OWNERS)


def _active_jobs(s: Session) -> Sequence[Any]:
    return s.execute(
        select(
            Job.id,
            Job.profile,
            Job.status,
            Job.worker_id,
            Job.dispatched_at,
            Job.duration_seconds,
            Job.created_at,
            Job.started_at,
        )
        .where(Job.status.in_(_ACTIVE_STATES))
        .order_by(Job.dispatched_at, Job.id)
        .limit(MAX_ACTIVE_JOBS)
    ).all()


def _part_work() -> Any:
    """A part's work for the planner, in seconds of audio to transcribe: its span, or for a
    speakers part (diarization of the whole file) its share of the whole file's work."""
    span = JobPart.end_seconds - JobPart.start_seconds
    return case((JobPart.kind == SPEAKERS_PART, span * SPEAKERS_WORK_SHARE), else_=span)


def _read_rows(svc: Services) -> _Rows:
    with svc.db.session() as s:
        learned = {r.name: r for r in s.scalars(select(ProfileState))}
        rows = list(s.scalars(select(Worker).where(Worker.deleted_at.is_(None))))
        counts = s.execute(
            select(Job.profile, Job.status, func.count())
            .where(Job.status.in_(_ACTIVE_STATES), ~_has_parts())
            .group_by(Job.profile, Job.status)
        ).all()
        running_parts = s.execute(
            select(
                JobPart.id,
                Job.profile,
                JobPart.worker_id,
                _part_work(),
                JobPart.started_at,
            )
            .select_from(JobPart)
            .join(Job, Job.id == JobPart.job_id)
            .where(JobPart.status == PartStatus.RUNNING.value, Job.status.in_(_ACTIVE_STATES))
            .limit(MAX_ACTIVE_JOBS)
        ).all()
        part_counts = s.execute(
            select(
                Job.profile,
                func.count(),
                func.sum(_part_work()),
                func.min(Job.created_at),
            )
            .select_from(JobPart)
            .join(Job, Job.id == JobPart.job_id)
            .where(JobPart.status == PartStatus.DISPATCHED.value, Job.status.in_(_ACTIVE_STATES))
            .group_by(Job.profile)
        ).all()
        queued, oldest = s.execute(
            select(func.count(), func.min(Job.created_at)).where(_queued_ready())
        ).one()
        heads = _queued_heads(s) if queued else []
        head_parts = _spans_of(s, [h.id for h in heads]) if heads else {}
        active = _active_jobs(s)
        in_service: dict[str, int] = {}
        needs: Sequence[Any] = ()
        parted: frozenset[str] = frozenset()
        if active:
            in_service = _in_service(s)
            ids = [a.id for a in active]
            needs = s.execute(select(*_NEED_COLUMNS).where(Job.id.in_(ids))).all()
            parted = frozenset(
                s.scalars(select(JobPart.job_id).where(JobPart.job_id.in_(ids)).distinct())
            )
    return _Rows(
        learned=learned,
        workers=rows,
        counts=counts,
        queued=int(queued or 0),
        oldest_queued_at=oldest,
        active=active,
        heads=heads,
        in_service=in_service,
        needs=needs,
        part_counts=part_counts,
        head_parts=head_parts,
        parted=parted,
        running_parts=running_parts,
    )


def _spans_of(s: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """The number of spans each of these jobs is cut into, for those that are cut."""
    rows = s.execute(
        select(JobPart.job_id, func.count())
        .where(JobPart.job_id.in_(job_ids), JobPart.kind != SPEAKERS_PART)
        .group_by(JobPart.job_id)
    ).all()
    return {str(job_id): int(n) for job_id, n in rows}


def _has_parts() -> ColumnElement[bool]:
    return select(JobPart.id).where(JobPart.job_id == Job.id).exists()


def _in_service(s: Session) -> dict[str, int]:
    """Each owner's work in service: its active jobs, a job cut into parts counting as its
    unfinished parts (fair dispatch counts parts: app/fleet/dispatch_order.py)."""
    jobs = s.execute(
        select(Job.owner, func.count())
        .where(Job.status.in_(_ACTIVE_STATES), ~_has_parts())
        .group_by(Job.owner)
    )
    parts = s.execute(
        select(Job.owner, func.count())
        .select_from(JobPart)
        .join(Job, Job.id == JobPart.job_id)
        .where(Job.status.in_(_ACTIVE_STATES), JobPart.status.in_(_OPEN_PARTS))
        .group_by(Job.owner)
    )
    counted: dict[str, int] = {}
    for owner, n in [*jobs, *parts]:
        counted[str(owner)] = counted.get(str(owner), 0) + int(n)
    return counted


def _profile_snapshots(
    svc: Services, learned: dict[str, ProfileState], history: Learned
) -> tuple[ProfileSnapshot, ...]:
    profiles = svc.settings.profiles
    depths = queue_depths(svc.redis, [p.name for p in profiles])
    return tuple(
        ProfileSnapshot(
            name=p.name,
            provider=p.provider,
            enabled=p.enabled,
            max_workers=p.max_workers,
            hourly_cost_eur=p.hourly_cost_eur,
            backoff_until=learned[p.name].backoff_until if p.name in learned else None,
            retry_at=learned[p.name].retry_at if p.name in learned else None,
            last_error=learned[p.name].last_error if p.name in learned else None,
            queue_depth=depths.get(p.name),
            boot_samples=history.boots.get(p.name, ()),
            speed=history.speed.get(p.name),
        )
        for p in profiles
    )


def _worker_snapshots(svc: Services, db: _Rows) -> tuple[WorkerSnapshot, ...]:
    running_on = {
        a.worker_id for a in db.active if a.status == JobStatus.RUNNING.value and a.worker_id
    }
    reported = last_reports(svc.redis, [w.id for w in db.workers])
    return tuple(
        WorkerSnapshot(
            id=w.id,
            profile=w.profile,
            provider=w.provider,
            state=w.state,
            requested_at=w.requested_at,
            instance_id=w.instance_id,
            hourly_cost_eur=w.hourly_cost_eur or 0.0,
            busy=w.current_job_id is not None or w.id in running_on,
            created_at=w.created_at,
            booted_at=w.booted_at,
            ready_at=w.ready_at,
            idle_since=w.idle_since,
            last_seen_at=_latest(w.last_seen_at, reported.get(w.id)),
            error=w.error,
            delete_reason=w.delete_reason,
            server_gone=server_gone(w.resources),
            seen_starting=bool((w.resources or {}).get(SEEN_STARTING_AT)),
        )
        for w in db.workers
    )


def _inventory(
    svc: Services, rows: list[Worker]
) -> tuple[dict[tuple[str, str], Instance], set[str]]:
    """Every provider's instances, in every zone a profile or a worker lives in; and the
    providers whose listing answered (an instance missing from another's is not known gone)."""
    scopes: dict[str, set[str]] = {}
    for p in svc.settings.profiles:
        scopes.setdefault(p.provider, set()).add(p.zone)
    for w in rows:
        zone = (w.resources or {}).get("zone")
        scopes.setdefault(w.provider, set()).update([zone] if zone else [])
    instances: dict[tuple[str, str], Instance] = {}
    known: set[str] = set()
    for name, zones in sorted(scopes.items()):
        try:
            listed = svc.providers[name].list_by_tag(frozenset(zones))
        except ProviderError as exc:
            log.warning("fleet: cannot list %s instances: %s", name, exc.reason)
            continue
        known.add(name)
        instances.update({(name, i.instance_id): i for i in listed})
    return instances, known


def _job_counts(
    rows: Sequence[Row[str | None, str, int]], part_rows: Sequence[Any] = ()
) -> tuple[JobCounts, ...]:
    by_profile: dict[str, dict[str, int]] = {}
    for profile, status, count in rows:
        if profile is None:
            continue
        by_profile.setdefault(profile, {})[status] = int(count)
    parts = {str(p): (int(n), float(secs or 0.0), as_utc(since)) for p, n, secs, since in part_rows}
    return tuple(
        JobCounts(
            profile=name,
            dispatched=by_profile.get(name, {}).get(JobStatus.DISPATCHED.value, 0),
            running=by_profile.get(name, {}).get(JobStatus.RUNNING.value, 0),
            parts_waiting=parts.get(name, (0, 0.0, None))[0],
            parts_waiting_seconds=parts.get(name, (0, 0.0, None))[1],
            parts_since=parts.get(name, (0, 0.0, None))[2],
        )
        for name in sorted(set(by_profile) | set(parts))
    )
