"""Carry out a FleetPlan: provider calls, worker rows, profile back-off, job dispatch.

Every step is safe to repeat: rows move by compare-and-set, a teardown picks up where the last
one stopped, and dispatch/requeue go through app.jobs.dispatch. No database transaction is held
open across a provider call. Out-of-stock is the one failure that ends the round early: the
caller re-plans, and the next profile in order gets its chance within the same run. A provider
stock hint of `shortage` is that same out-of-stock, met before anything is created.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.config import FleetSettings, Profile
from app.fleet import broker_users
from app.fleet.cloudinit import worker_environment
from app.fleet.planner import (
    NOT_NEEDED,
    Action,
    Death,
    Delete,
    DeleteOrphan,
    Dispatch,
    FleetPlan,
    MarkBooted,
    MarkDead,
    MarkStarting,
    Provision,
    Requeue,
)
from app.fleet.providers.base import (
    Instance,
    InstanceState,
    OutOfStock,
    Provider,
    ProviderError,
    StockHint,
    Teardown,
)
from app.fleet.served import note_served
from app.fleet.snapshot import Snapshot
from app.jobs import parts
from app.jobs.dispatch import dispatch_job, requeue_job, send_parts, withdraw_messages
from app.jobs.service import announce_finished, fail_job, get_job
from app.models import (
    LIVE_WORKER_STATES,
    SEEN_STARTING_AT,
    SERVER_GONE_AT,
    Job,
    JobStatus,
    ProfileState,
    Worker,
    WorkerState,
    new_id,
    server_gone,
)
from app.observability import forget_worker, record_provision_attempt
from app.services import Services
from app.transitions import move_worker, worker_sources

log = logging.getLogger("murmur.fleet")


def _count_attempt(svc: Services, profile: str, error: ProviderError | None) -> None:
    """One attempt in murmur_provision_attempts_total, by the error's own outcome."""
    outcome = "succeeded" if error is None else error.outcome
    try:
        record_provision_attempt(svc.redis, profile, outcome)
    except redis.RedisError as exc:  # metrics never stop the fleet
        log.warning("fleet: cannot count a provisioning attempt: %s", type(exc).__name__)


def _forget(svc: Services, worker_id: str, reason: str) -> None:
    try:
        death = Death.of(reason)  # after a death an operator may still want its last log lines
        forget_worker(svc.redis, worker_id, keep_log=death is not None and death.keeps_log)
    except redis.RedisError as exc:
        log.warning("fleet: cannot drop worker %s's reports: %s", worker_id, type(exc).__name__)


@dataclass
class Outcome:
    """What applying one plan did; `stocked_out` asks the caller to plan again."""

    stocked_out: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    provisioned: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    dispatched: Counter[str] = field(default_factory=Counter)
    requeued: int = 0


def apply_plan(
    svc: Services,
    snapshot: Snapshot,
    plan: FleetPlan,
    keep_lock: Callable[[], None] = lambda: None,
    torn_down: set[str] | None = None,
) -> Outcome:
    """Apply `plan`'s actions in order.

    `torn_down`: workers whose teardown the run already advanced (filled in here); a re-plan
    in the same run skips them, as a server not gone yet is only confirmed a round later.
    """
    run = _Applying(svc, snapshot, torn_down if torn_down is not None else set())
    run.planned = {p.name: p.dispatched for p in plan.profiles}  # jobs left on each queue
    try:
        for action in plan.actions:
            keep_lock()
            if run.withdraw and not isinstance(action, Requeue):
                _withdraw(svc, run.withdraw)
            _HANDLERS[type(action)](run, action)
    finally:
        # Also when the lease is lost (or anything else stops the run) right after a
        # re-route: the job is queued again, so its old message must not stay behind.
        if run.withdraw:
            _withdraw(svc, run.withdraw)
    for profile, n in sorted(run.out.dispatched.items()):
        log.info("fleet: dispatched %d job(s) to %s", n, profile)
    return run.out


@dataclass
class _Applying:
    """One `apply_plan` run: what it did so far and what stops its later actions."""

    svc: Services
    snapshot: Snapshot
    torn_down: set[str]
    out: Outcome = field(default_factory=Outcome)
    # Set by a stock-out (re-plan: the next profile gets this demand) or another provider
    # error (no fallback): no more provisioning this run.
    provisioning_stopped: bool = False
    held_now: set[str] = field(default_factory=set)  # held after failed boots, this round
    # Re-routed jobs whose old message is still on their old profile's queue. Withdrawn before
    # the next other action, so before any of them is dispatched again.
    withdraw: dict[str, list[str]] = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)

    def mark_booted(self, action: MarkBooted) -> None:
        _mark_booted(self.svc, action.worker_id)

    def mark_starting(self, action: MarkStarting) -> None:
        _mark_starting(self.svc, action.worker_id)

    def mark_dead(self, action: MarkDead) -> None:
        stopped = _mark_dead(self.svc, action)
        resend_parts_of(self.svc, action.worker_id)
        if stopped is not None and action.capacity:
            self.out.stocked_out.append(stopped)
            self.provisioning_stopped = True
        elif stopped is not None:
            self.held_now.add(stopped)

    def requeue(self, action: Requeue) -> None:
        if requeue_job(self.svc.db, action.job_id, action.from_profile):
            self.withdraw.setdefault(action.from_profile, []).append(action.job_id)
            self.out.requeued += 1
            log.info("fleet: re-route job %s: %s", action.job_id, action.reason)

    def dispatch(self, action: Dispatch) -> None:
        svc = self.svc
        if dispatch_job(svc.db, svc.celery, action.job_id, action.profile, now=svc.clock()):
            self.out.dispatched[action.profile] += 1
            owner = self.snapshot.state.owners.get(action.job_id)
            if owner is not None:  # fair dispatch's memory (app/fleet/dispatch_order.py)
                note_served(svc.redis, [owner], svc.clock())

    def provision(self, action: Provision) -> None:
        if self.provisioning_stopped or action.profile in self.held_now:
            return
        result = _provision(self.svc, action)
        if isinstance(result, str):
            self.out.provisioned.append(result)
            return
        self.provisioning_stopped = True
        if result.allows_fallback:
            self.out.stocked_out.append(action.profile)
        else:
            self.out.errors.append(f"{action.profile}: {result.reason}")

    def delete(self, action: Delete) -> None:
        if action.worker_id in self.torn_down:
            return
        self.torn_down.add(action.worker_id)
        if _teardown(self.svc, action.worker_id, action.reason, self.planned):
            self.out.deleted.append(action.worker_id)

    def delete_orphan(self, action: DeleteOrphan) -> None:
        instance = self.snapshot.instances.get((action.provider, action.instance_id))
        worker_id = _adopt_orphan(self.svc, action, instance)
        if worker_id in self.torn_down:
            return
        self.torn_down.add(worker_id)
        if _teardown(self.svc, worker_id, "orphan"):
            self.out.deleted.append(worker_id)


_HANDLERS: dict[type[Action], Callable[[_Applying, Any], None]] = {
    MarkBooted: _Applying.mark_booted,
    MarkStarting: _Applying.mark_starting,
    MarkDead: _Applying.mark_dead,
    Requeue: _Applying.requeue,
    Dispatch: _Applying.dispatch,
    Provision: _Applying.provision,
    Delete: _Applying.delete,
    DeleteOrphan: _Applying.delete_orphan,
}


def _withdraw(svc: Services, jobs_by_profile: dict[str, list[str]]) -> None:
    """Take re-routed jobs' messages off their old queues (they would inflate its depth)."""
    for profile, job_ids in sorted(jobs_by_profile.items()):
        try:
            removed = withdraw_messages(svc.redis, profile, job_ids)
        except redis.RedisError as exc:  # the depth is off until those messages are consumed
            log.warning("fleet: cannot withdraw messages from %s: %s", profile, type(exc).__name__)
            continue
        if removed:
            log.info("fleet: withdrew %d re-routed message(s) from %s", removed, profile)
    jobs_by_profile.clear()


# -- lifecycle marks --------------------------------------------------------------------------


def _mark_booted(svc: Services, worker_id: str) -> None:
    with svc.db.session() as s:
        s.execute(
            update(Worker)
            .where(Worker.id == worker_id, Worker.booted_at.is_(None))
            .values(booted_at=svc.clock())
        )


def _mark_starting(svc: Services, worker_id: str) -> None:
    with svc.db.session() as s:
        row = s.get(Worker, worker_id)
        if row is not None and not (row.resources or {}).get(SEEN_STARTING_AT):
            row.resources = {**(row.resources or {}), SEEN_STARTING_AT: svc.clock().isoformat()}


def resend_parts_of(svc: Services, worker_id: str) -> None:
    """The parts a dead worker held go back on their queue (app/jobs/parts.py): only they are
    transcribed again, not their whole jobs."""
    held = parts.held_parts(svc.db, worker_id, now=svc.clock())
    if not held:
        return
    with svc.db.reader() as s:
        profile = s.execute(select(Worker.profile).where(Worker.id == worker_id)).scalar()
    if profile is not None:
        send_parts(svc.db, svc.celery, held, profile)
        log.warning("fleet: %d part(s) of dead worker %s sent again", len(held), worker_id)


def _mark_dead(svc: Services, action: MarkDead) -> str | None:
    """Mark the worker for deletion; the profile it stops provisioning for, if any.

    A capacity death backs its profile off; a failed boot may hold it (`_failed_boot`).
    """
    now = svc.clock()
    # A worker refused at readiness is already FAILED (app.fleet.readiness.reject); moving it
    # on from there counts its failed boot exactly once.
    states = (*LIVE_WORKER_STATES, WorkerState.FAILED.value) if action.failed_boot else None
    with svc.db.session() as s:
        row = s.get(Worker, action.worker_id)
        profile_name = row.profile if row is not None else None
        moved = move_worker(
            s,
            action.worker_id,
            states or LIVE_WORKER_STATES,
            WorkerState.DELETING,
            Worker.deleted_at.is_(None),
            error=action.reason,
            delete_reason=action.death.value,
            delete_requested_at=func.coalesce(Worker.delete_requested_at, now),
        )
    if moved:
        log.warning("fleet: worker %s is dead (%s); deleting it", action.worker_id, action.reason)
    if moved and action.failed_boot and profile_name is not None:
        confirmed = action.death.confirmed
        return profile_name if _failed_boot(svc, profile_name, action.reason, confirmed) else None
    if not (moved and action.capacity and profile_name is not None):
        return None
    try:
        profile = svc.settings.profile(profile_name)
    except KeyError:
        return None  # a profile removed from the config: nothing to back off
    _stocked_out(svc, profile, OutOfStock(action.reason))
    return profile.name


def _failed_boot(svc: Services, profile: str, reason: str, confirmed: bool = False) -> bool:
    """Count a worker that never became ready; hold its profile after max_failed_boots in a row,
    or at once when the instance itself reported the failure (`confirmed`) (True then).

    The boot is also charged, as one attempt, to the job it would have taken (the oldest one
    dispatched to its profile): a job that waits on a profile that never boots fails after
    fleet.max_attempts such boots instead of waiting forever.
    """
    fleet = svc.settings.fleet
    now = svc.clock()
    with svc.db.session() as s:
        state = _profile_state(s, profile)
        state.consecutive_failed_boots = (state.consecutive_failed_boots or 0) + 1
        boots = state.consecutive_failed_boots
        hold = confirmed or boots >= fleet.max_failed_boots
        if hold:
            seconds = _backoff_seconds(
                fleet, boots if confirmed else boots - fleet.max_failed_boots + 1
            )
            state.retry_at = now + timedelta(seconds=seconds)
            said = f"{boots} workers in a row never became ready (last: {reason})"
            state.last_error = said[:300]
            state.last_error_at = now
        job = s.scalars(
            select(Job)
            .where(Job.profile == profile, Job.status == JobStatus.DISPATCHED.value)
            .order_by(Job.dispatched_at, Job.id)
            .limit(1)
        ).first()
        charged = None
        if job is not None:
            job.attempts = (job.attempts or 0) + 1
            charged = (job.id, job.attempts)
    if hold:
        log.error(
            "fleet: %s: %d workers in a row never became ready; no new worker before %s",
            profile,
            boots,
            (now + timedelta(seconds=seconds)).isoformat(timespec="seconds"),
        )
    if charged is not None and charged[1] >= fleet.max_attempts:
        message = (
            f"no worker of profile {profile} became ready for it: {charged[1]} attempts "
            f"({reason.split(':', 1)[0]})"
        )
        if fail_job(svc.db, charged[0], "worker_boot_failed", message, now=now):
            log.warning("fleet: job %s failed: %s", charged[0], message)
            with contextlib.suppress(Exception):  # the job's state is already final
                announce_finished(svc.redis, svc.celery, get_job(svc.db, charged[0]))
    return hold


# -- provisioning -----------------------------------------------------------------------------


def _profile_state(s: Any, name: str) -> ProfileState:
    row: ProfileState | None = s.get(ProfileState, name)
    if row is None:
        row = ProfileState(
            name=name, consecutive_stockouts=0, consecutive_errors=0, consecutive_failed_boots=0
        )
        s.add(row)
    return row


def _provision(svc: Services, action: Provision) -> str | ProviderError:
    """Create one worker; its id, or the error that stopped it."""
    settings = svc.settings
    profile = settings.profile(action.profile)
    worker_id = action.worker_id or new_id("wrk")
    now = svc.clock()
    with svc.db.session() as s:
        s.add(
            Worker(
                id=worker_id,
                profile=profile.name,
                provider=profile.provider,
                state=WorkerState.REQUESTED.value,
                hourly_cost_eur=profile.hourly_cost_eur,
                requested_at=now,
            )
        )
    try:
        provider = svc.providers[profile.provider]
        _check_stock(svc, provider, profile)
        # Before the server exists, so its user data can carry this worker's own password.
        broker_url = broker_users.worker_broker_url(
            settings, broker_users.provision_user(svc, profile, worker_id)
        )

        def bind(instance_id: str, resources: Mapping[str, Any]) -> Mapping[str, str]:
            # Recorded before the instance can start, so a crash from here on leaks nothing.
            with svc.db.session() as s:
                s.execute(
                    update(Worker)
                    .where(Worker.id == worker_id)
                    .values(
                        instance_id=instance_id, resources=dict(resources), created_at=svc.clock()
                    )
                )
                move_worker(s, worker_id, [WorkerState.REQUESTED], WorkerState.CREATING)
            return worker_environment(settings, profile, worker_id, instance_id, broker_url)

        instance = provider.create(profile, worker_id, bind)
    except ProviderError as exc:
        _creation_failed(svc, worker_id, exc)
        if exc.instance_id is None:  # nothing left that could use it
            broker_users.retire_user(svc, worker_id)
        _count_attempt(svc, profile.name, exc)
        if exc.allows_fallback:
            _stocked_out(svc, profile, exc)
        else:
            _hold(svc, profile, exc)
        return exc
    _created(svc, profile, worker_id, instance)
    _count_attempt(svc, profile.name, None)
    return worker_id


def _check_stock(svc: Services, provider: Provider, profile: Profile) -> None:
    """Record the provider's stock hint; raise `OutOfStock` when it is `shortage`.

    Scaleway's `shortage` means out of stock (the Terraform provider has checked it so since
    2018): creating would only earn an out-of-stock answer, or a server that stops again. Any
    other hint, or none (unknown, or the call failed), lets the create go on.
    """
    hint = provider.availability(profile)
    if hint is None:
        return
    with svc.db.session() as s:
        _profile_state(s, profile.name).availability = hint
    if hint == StockHint.SHORTAGE:
        raise OutOfStock(
            f"{provider.name}: the provider reports a shortage of {profile.server_type} "
            f"in {profile.zone}; nothing was created"
        )


def _created(svc: Services, profile: Profile, worker_id: str, instance: Instance) -> None:
    now = svc.clock()
    with svc.db.session() as s:
        # The worker may already have reported ready (a local process is quick): only move on
        # from the creating states.
        move_worker(
            s, worker_id, [WorkerState.REQUESTED, WorkerState.CREATING], WorkerState.BOOTING
        )
        values: dict[str, Any] = {"resources": dict(instance.resources)}
        if instance.state == InstanceState.STARTING:  # the create's own look after power-on saw it
            values["resources"][SEEN_STARTING_AT] = now.isoformat()
        s.execute(update(Worker).where(Worker.id == worker_id).values(**values))
        if instance.state == InstanceState.RUNNING:
            s.execute(
                update(Worker)
                .where(Worker.id == worker_id, Worker.booted_at.is_(None))
                .values(booted_at=now)
            )
        state = _profile_state(s, profile.name)
        state.consecutive_stockouts = 0
        state.consecutive_errors = 0
        state.backoff_until = None
        state.retry_at = None
    log.info(
        "fleet: provision %s: worker %s on instance %s",
        profile.name,
        worker_id,
        instance.instance_id,
    )


# A worker whose creation failed may already have reported ready (a local process is quick).
_CREATED_OR_LIVE = (
    WorkerState.REQUESTED,
    WorkerState.CREATING,
    WorkerState.BOOTING,
    WorkerState.READY,
)


# Every state a teardown may start from (a deleted row never gets here: deleted_at is set).
_TO_DELETING = tuple(
    state for state in worker_sources(WorkerState.DELETING) if state is not WorkerState.DELETED
)


def _creation_failed(svc: Services, worker_id: str, exc: ProviderError) -> None:
    now = svc.clock()
    with svc.db.session() as s:
        row = s.get(Worker, worker_id)
        if row is None:
            return
        row.error = exc.reason
        stock = exc.allows_fallback
        row.delete_reason = Death.OUT_OF_STOCK.value if stock else "provisioning failed"
        row.delete_requested_at = now
        if exc.instance_id is not None:
            # Something was created and could not be removed yet: the next rounds finish it.
            row.instance_id = exc.instance_id
            row.resources = dict(exc.resources)
            move_worker(s, worker_id, _TO_DELETING, WorkerState.DELETING)
        elif row.state == WorkerState.FAILED.value:  # refused at readiness meanwhile
            row.deleted_at = now
        else:
            move_worker(s, worker_id, _CREATED_OR_LIVE, WorkerState.FAILED, deleted_at=now)


def _backoff_seconds(fleet: FleetSettings, in_a_row: int) -> float:
    """The wait after the `in_a_row`-th failure in a row: doubling from fleet.backoff_seconds,
    capped at fleet.backoff_max_seconds."""
    return min(fleet.backoff_seconds * 2.0 ** (in_a_row - 1), fleet.backoff_max_seconds)


def _stocked_out(svc: Services, profile: Profile, exc: ProviderError) -> None:
    fleet = svc.settings.fleet
    now = svc.clock()
    with svc.db.session() as s:
        state = _profile_state(s, profile.name)
        state.consecutive_stockouts = (state.consecutive_stockouts or 0) + 1
        # Doubles with each stock-out in a row, capped, so a long shortage costs few API calls.
        seconds = _backoff_seconds(fleet, state.consecutive_stockouts)
        state.backoff_until = now + timedelta(seconds=seconds)
        state.last_error = exc.reason
        state.last_error_at = now
        state.availability = StockHint.SHORTAGE.value
    log.warning(
        "fleet: %s out_of_stock (%s); backing off %ds, fallback to the next profile",
        profile.name,
        exc.reason,
        seconds,
    )


def _hold_seconds(fleet: FleetSettings, exc: ProviderError, in_a_row: int) -> float:
    """How long a profile is held after `exc`, the `in_a_row`-th error in a row.

    The provider's own Retry-After wins (capped like every hold); otherwise the hold doubles
    with each error in a row, so an error an operator must fix is not retried every few seconds
    all night.
    """
    if exc.retry_after is not None:
        return min(exc.retry_after, fleet.backoff_max_seconds)
    return _backoff_seconds(fleet, in_a_row)


def _hold(svc: Services, profile: Profile, exc: ProviderError) -> None:
    fleet = svc.settings.fleet
    now = svc.clock()
    with svc.db.session() as s:
        state = _profile_state(s, profile.name)
        in_a_row = (state.consecutive_errors or 0) + 1
        # A rate limit says nothing about the profile: it neither lengthens the next hold nor
        # shows as one more error in a row.
        if exc.counts_in_a_row:
            state.consecutive_errors = in_a_row
        seconds = _hold_seconds(fleet, exc, in_a_row)
        retry = now + timedelta(seconds=seconds)
        state.last_error = exc.reason
        state.last_error_at = now
        state.retry_at = retry
    log.error(
        "fleet: provision %s failed: %s (%s); no fallback to another profile, next attempt at %s",
        profile.name,
        exc.reason,
        type(exc).__name__,
        retry.isoformat(timespec="seconds"),
    )


# -- teardown ---------------------------------------------------------------------------------


def _adopt_orphan(svc: Services, action: DeleteOrphan, instance: Instance | None) -> str:
    """Give an unowned instance a DELETING worker row, so its teardown is tracked and retried."""
    now = svc.clock()
    resources = dict(instance.resources) if instance is not None else {}
    with svc.db.session() as s:
        row = s.get(Worker, action.worker_id) if action.worker_id else None
        if row is None or (row.instance_id not in (None, action.instance_id)):
            row = Worker(
                id=action.worker_id if action.worker_id and row is None else new_id("wrk"),
                profile=(action.profile or "unknown")[:40],
                provider=action.provider,
                requested_at=now,
                state=WorkerState.DELETING.value,  # born deleting: all it has is an instance
            )
            s.add(row)
        row.instance_id = action.instance_id
        row.delete_reason = "orphan"
        row.delete_requested_at = now
        row.resources = {**(row.resources or {}), **resources}
        worker_id = row.id
        if row.state != WorkerState.DELETING.value:
            move_worker(s, worker_id, [row.state], WorkerState.DELETING, deleted_at=None)
    log.warning(
        "fleet: orphan instance %s (%s, worker tag %s): deleting it",
        action.instance_id,
        action.provider,
        action.worker_id,
    )
    return worker_id


def _has_work(session: Session, worker: Worker) -> bool:
    if worker.current_job_id is not None:
        return True
    waiting = session.execute(
        select(Job.id)
        .where(Job.profile == worker.profile, Job.status == JobStatus.DISPATCHED.value)
        .limit(1)
    ).first()
    return waiting is not None


def _more_work_than_planned(session: Session, worker: Worker, planned: Mapping[str, int]) -> bool:
    """A booting worker the plan found unneeded got work since: a job of its own, or more jobs
    on its profile's queue than the plan left there (the API dispatched one meanwhile)."""
    if worker.current_job_id is not None:
        return True
    waiting = session.execute(
        select(func.count())
        .select_from(Job)
        .where(Job.profile == worker.profile, Job.status == JobStatus.DISPATCHED.value)
    ).scalar_one()
    return int(waiting) > planned.get(worker.profile, 0)


def _teardown(
    svc: Services, worker_id: str, reason: str, planned: Mapping[str, int] | None = None
) -> bool:
    """Advance the deletion of a worker's instance; True once the provider confirms it.

    `planned`: jobs the plan left on each profile's queue, for the `not needed` re-check.
    """
    now = svc.clock()
    with svc.db.session() as s:
        row = s.get(Worker, worker_id)
        if row is None or row.deleted_at is not None:
            return False
        if (
            reason == NOT_NEEDED
            and row.state != WorkerState.DELETING.value
            and _more_work_than_planned(s, row, planned or {})
        ):
            log.info("fleet: booting worker %s got work since the plan; keeping it", worker_id)
            return False
        if reason == "idle" and row.state != WorkerState.DELETING.value and _has_work(s, row):
            # The plan saw it idle, but since then a job was claimed by it or dispatched to its
            # profile (the API dispatches at once to a warm profile): keep it.
            log.info("fleet: worker %s is no longer idle; not deleting it", worker_id)
            return False
        if row.state != WorkerState.DELETING.value:
            row.delete_reason = row.delete_reason or reason[:64]
            # From whatever state it is in by now (readiness may have refused it meanwhile):
            # the instance is deleted next, so the row must say so.
            move_worker(s, worker_id, _TO_DELETING, WorkerState.DELETING)
        if row.delete_requested_at is None:
            row.delete_requested_at = now
        instance_id, provider_name = row.instance_id, row.provider
        resources: dict[str, Any] = dict(row.resources or {})
        previous_error = row.error
    if instance_id is None:
        result = Teardown(True)
    else:
        try:
            result = svc.providers[provider_name].delete(instance_id, resources)
        except ProviderError as exc:
            result = Teardown(False, resources, exc.reason)
        except Exception as exc:  # one bad teardown must not stop the others
            log.exception("fleet: teardown of worker %s failed", worker_id)
            result = Teardown(False, resources, f"{type(exc).__name__}")
    with svc.db.session() as s:
        row = s.get(Worker, worker_id)
        if row is None:
            return False
        row.resources = {**resources, **dict(result.resources)}
        if (result.server_gone or result.confirmed) and not server_gone(row.resources):
            # From here on no GPU cost counts against the budget (app.models.SERVER_GONE_AT).
            row.resources = {**row.resources, SERVER_GONE_AT: svc.clock().isoformat()}
        if result.confirmed:
            move_worker(
                s, worker_id, [WorkerState.DELETING], WorkerState.DELETED, deleted_at=svc.clock()
            )
        elif result.detail and (previous_error is None or previous_error.startswith("teardown:")):
            row.error = f"teardown: {result.detail}"
    if result.confirmed:
        _forget(svc, worker_id, reason)
        broker_users.retire_user(svc, worker_id)
        log.info("fleet: deleted worker %s (%s)", worker_id, reason)
    else:
        log.info(
            "fleet: deleting worker %s (%s): %s", worker_id, reason, result.detail or "pending"
        )
    return result.confirmed
