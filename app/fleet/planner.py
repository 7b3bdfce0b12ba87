"""The fleet planner: a pure function from a snapshot of the fleet to the actions that fix it.

`plan_fleet(state)` reads frozen dataclasses (profiles in allowlist order, workers, provider
inventory, job aggregates) and returns a `FleetPlan`. It does no I/O and reads no clock: the
snapshot carries `now`. Jobs arrive aggregated (counts per profile, plus a bounded list of the
ids that could be dispatched or re-routed this round), so the work grows with profiles and
workers, never with the backlog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.models import WorkerState

_LIVE = frozenset(
    {
        WorkerState.REQUESTED.value,
        WorkerState.CREATING.value,
        WorkerState.BOOTING.value,
        WorkerState.READY.value,
        WorkerState.DRAINING.value,
    }
)
# States in which a worker takes new jobs from its profile's queue (or will once booted).
_SERVING = _LIVE - {WorkerState.DRAINING.value}
_STARTING = frozenset({WorkerState.REQUESTED.value, WorkerState.CREATING.value})
# States in which a worker reports (or sends bare heartbeats), so silence means something.
_REPORTING = frozenset({WorkerState.READY.value, WorkerState.DRAINING.value})
# Provider states meaning "powered off"; the Go SDK spells one of them with spaces.
STOPPED_STATES = frozenset({"stopped", "stopped in place", "stopped_in_place"})
# The head of a death reason that is a capacity failure (see MarkDead.capacity).
STOPPED_BEFORE_BOOT = "out of stock"
# Why a booting worker is retired before it is ready: nothing waits for it any more.
NOT_NEEDED = "not needed"
# The head of the death reason of a worker that never became ready (see MarkDead.failed_boot).
BOOT_TIMEOUT = "boot timeout"
_BUDGET_EPSILON = 1e-9


# --- input -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetRules:
    """The bounds and timeouts the plan obeys (built from `Settings.fleet` and `.budget`)."""

    idle_timeout: timedelta
    boot_timeout: timedelta
    # A worker still REQUESTED/CREATING after this was left behind by an interrupted reconcile.
    create_timeout: timedelta
    # Silence (no report, no heartbeat) after which a worker is dead; None disables the rule.
    heartbeat_timeout: timedelta | None
    max_hourly_eur: float
    # The silence tolerated while no ready worker at all was heard within heartbeat_timeout:
    # then the control plane (or the path to it) is the likelier failure, and deleting every
    # worker would lose their jobs and, in a shortage, their GPUs. None: heartbeat_timeout.
    outage_timeout: timedelta | None = None
    max_dispatch: int = 200
    max_provisions: int = 10
    # A job still `dispatched` this long after its message was sent, while its profile's queue
    # is empty, lost that message (a crash between commit and send): route it again.
    lost_message_after: timedelta = timedelta(seconds=120)


@dataclass(frozen=True)
class ProfileSnapshot:
    """One allowlisted profile as configured, plus what the fleet learned about it."""

    name: str
    provider: str
    enabled: bool
    max_workers: int
    hourly_cost_eur: float
    backoff_until: datetime | None = None
    retry_at: datetime | None = None
    last_error: str | None = None
    queue_depth: int | None = None  # LLEN of transcribe.<name>; may include stale messages


@dataclass(frozen=True)
class WorkerSnapshot:
    """A worker row that still owns (or may own) provider resources."""

    id: str
    profile: str
    provider: str
    state: str
    requested_at: datetime
    instance_id: str | None = None
    hourly_cost_eur: float = 0.0
    busy: bool = False  # a job is claimed or running on it
    created_at: datetime | None = None
    booted_at: datetime | None = None
    ready_at: datetime | None = None
    idle_since: datetime | None = None
    last_seen_at: datetime | None = None
    error: str | None = None
    delete_reason: str | None = None


@dataclass(frozen=True)
class InstanceSnapshot:
    """A tagged instance the provider reports, whoever created it."""

    provider: str
    instance_id: str
    state: str
    worker_id: str | None = None
    profile: str | None = None
    detail: str = ""  # the provider's word on the state (e.g. "out of stock")


@dataclass(frozen=True)
class JobCounts:
    """Jobs already committed to a profile's queue: waiting there, or running on its workers."""

    profile: str
    dispatched: int = 0
    running: int = 0


@dataclass(frozen=True)
class ActiveJob:
    """A dispatched or running job, for the re-route rules (a bounded sample, oldest first)."""

    id: str
    profile: str | None
    status: str  # "dispatched" | "running"
    worker_id: str | None = None
    dispatched_at: datetime | None = None


@dataclass(frozen=True)
class FleetState:
    now: datetime
    rules: FleetRules
    profiles: tuple[ProfileSnapshot, ...]  # allowlist order = preference order
    workers: tuple[WorkerSnapshot, ...] = ()
    inventory: tuple[InstanceSnapshot, ...] = ()
    # Providers whose inventory was read this round; absence proves nothing for the others.
    inventory_known: frozenset[str] = frozenset()
    queued: int = 0  # jobs waiting for any profile (queued, audio stored)
    oldest_queued_at: datetime | None = None
    dispatchable: tuple[str, ...] = ()  # oldest queued job ids, at most a few hundred
    job_counts: tuple[JobCounts, ...] = ()
    active_jobs: tuple[ActiveJob, ...] = ()
    # When the fleet last came back from a stop (tasks.fleet.reconcile.listening_since):
    # nothing could hear the workers before, so their silence counts from here at the earliest.
    listening_since: datetime | None = None


# --- output ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkBooted:
    worker_id: str


@dataclass(frozen=True)
class MarkDead:
    worker_id: str
    reason: str
    # The provider stopped it before it ever booted: out of stock, as if create had said so
    # (back-off of its profile, fallback to the next).
    capacity: bool = False
    # It never became ready within the boot timeout: a failed boot of its profile (counted;
    # enough in a row hold the profile, see fleet.max_failed_boots).
    failed_boot: bool = False


@dataclass(frozen=True)
class Requeue:
    job_id: str
    from_profile: str
    reason: str


@dataclass(frozen=True)
class Dispatch:
    job_id: str
    profile: str


@dataclass(frozen=True)
class Provision:
    profile: str
    hourly_cost_eur: float


@dataclass(frozen=True)
class Delete:
    worker_id: str
    reason: str


@dataclass(frozen=True)
class DeleteOrphan:
    provider: str
    instance_id: str
    worker_id: str | None
    profile: str | None


Action = MarkBooted | MarkDead | Requeue | Dispatch | Provision | Delete | DeleteOrphan


@dataclass(frozen=True)
class ProfilePlan:
    """What the plan means for one profile, for `/v1/fleet` and the logs."""

    name: str
    status: str  # ok | disabled | no-capacity | backoff | held | removed
    live_workers: int
    new_workers: int
    hourly_eur: float  # live + new workers of this profile
    dispatched: int  # jobs on its queue after this plan
    running: int


@dataclass(frozen=True)
class FleetPlan:
    now: datetime
    actions: tuple[Action, ...]
    # Why demand was not fully met: a cost bound, a back-off, a held profile, ...
    held_back: tuple[str, ...]
    profiles: tuple[ProfilePlan, ...]
    current_hourly_eur: float
    planned_hourly_eur: float
    waiting: int  # queued jobs left without a worker slot after this plan


# --- the planner -----------------------------------------------------------------------------


@dataclass
class _Tally:
    """Mutable per-profile bookkeeping while planning (never leaves this module)."""

    live: int = 0  # live workers not marked dead this round
    serving: int = 0  # live, not draining
    dispatched: int = 0
    running: int = 0
    new: int = 0
    hourly_eur: float = 0.0
    status: str = "ok"
    workers: list[WorkerSnapshot] = field(default_factory=list)


def _age(now: datetime, since: datetime | None) -> timedelta | None:
    return None if since is None else now - since


def _fmt(td: timedelta) -> str:
    return f"{int(td.total_seconds())}s"


def plan_fleet(state: FleetState) -> FleetPlan:
    """Every action that brings the fleet toward the demand, within every bound."""
    now, rules = state.now, state.rules
    profiles = {p.name: p for p in state.profiles}
    instances = {(i.provider, i.instance_id): i for i in state.inventory}
    tallies: dict[str, _Tally] = {p.name: _Tally() for p in state.profiles}

    def tally(name: str) -> _Tally:
        if name not in tallies:  # a profile removed from the config that still has workers/jobs
            tallies[name] = _Tally(status="removed")
        return tallies[name]

    booted: list[Action] = []
    dead: dict[str, str] = {}
    teardown: list[Action] = []
    silence_limit = _silence_limit(state)

    # 1. Lifecycle facts and dead workers.
    for w in state.workers:
        inst = instances.get((w.provider, w.instance_id)) if w.instance_id else None
        reason = _death(w, inst, state, silence_limit)
        if reason is not None:
            dead[w.id] = reason
            continue
        if (
            w.state in _LIVE
            and w.booted_at is None
            and inst is not None
            and inst.state == "running"
        ):
            booted.append(MarkBooted(w.id))
        elif w.state == WorkerState.DELETING.value or w.state == WorkerState.FAILED.value:
            # Teardown not confirmed yet (or a worker rejected at readiness): keep at it.
            teardown.append(Delete(w.id, w.delete_reason or _short(w.error) or "failed"))

    live_ids: set[str] = set()
    current_eur = 0.0
    for w in state.workers:
        if w.state != WorkerState.FAILED.value or w.instance_id is not None:
            current_eur += w.hourly_cost_eur  # billed until the provider confirms deletion
        if w.state in _LIVE and w.id not in dead:
            live_ids.add(w.id)
            t = tally(w.profile)
            t.live += 1
            t.serving += w.state in _SERVING
            t.hourly_eur += w.hourly_cost_eur
            t.workers.append(w)

    for c in state.job_counts:
        t = tally(c.profile)
        t.dispatched += c.dispatched
        t.running += c.running

    # 2. Re-route jobs that lost their worker, whose profile has no live worker left, or whose
    # message was lost.
    depths = {p.name: p.queue_depth for p in state.profiles}
    requeues: list[Requeue] = []
    for j in state.active_jobs:
        if j.profile is None:
            continue
        t = tally(j.profile)
        lost_worker = (
            j.status == "running" and j.worker_id is not None and j.worker_id not in live_ids
        )
        no_worker = t.serving == 0 and (j.status == "dispatched" or j.worker_id is None)
        lost_message = (
            j.status == "dispatched"
            and depths.get(j.profile) == 0
            and j.dispatched_at is not None
            and state.now - j.dispatched_at > rules.lost_message_after
        )
        if not (lost_worker or no_worker or lost_message):
            continue
        if lost_worker:
            reason = f"worker {j.worker_id} {dead.get(j.worker_id or '', 'is gone')}"
        elif no_worker:
            reason = f"profile {j.profile} has no live worker"
        else:
            reason = "its message is no longer on the queue"
        requeues.append(Requeue(j.id, j.profile, reason))
        if j.status == "running":
            t.running = max(0, t.running - 1)
        else:
            t.dispatched = max(0, t.dispatched - 1)

    # 3. Dispatch waiting jobs to free worker slots, in profile order. A worker runs one job at
    # a time, so a profile takes as many jobs as it has live, idle workers not already promised
    # a job; booting workers count, their jobs wait on the queue until they are ready.
    # New work prefers the first profile that can take it: past a profile that could still get
    # a worker, a fallback's ready workers get no new job (an idle one is left to retire); only
    # its workers still starting take the jobs they were created for, as they are paid anyway.
    waiting = state.queued + len(requeues)
    pool = list(dict.fromkeys([r.job_id for r in requeues] + list(state.dispatchable)))
    dispatches: list[Dispatch] = []
    dispatch_left = rules.max_dispatch
    spare_slots = 0
    reached: set[str] = set()  # profiles whose ready workers may take new jobs this round
    preferred_open = False  # a profile before this one could still get a worker
    for p in state.profiles:
        t = tallies[p.name]
        if not p.enabled:
            continue
        free = sum(1 for w in t.workers if w.state in _SERVING and not w.busy) - t.dispatched
        if preferred_open:
            # Jobs already on its queue go to its ready workers first.
            booting = sum(1 for w in t.workers if w.state in _SERVING - {"ready"} and not w.busy)
            free = min(free, booting)
        else:
            reached.add(p.name)
        n = max(0, min(free, len(pool), dispatch_left))
        dispatches.extend(Dispatch(job_id, p.name) for job_id in pool[:n])
        del pool[:n]
        dispatch_left -= n
        waiting -= n
        t.dispatched += n
        # Slots left free only because this round offered no more ids: they take jobs next
        # round, so nobody provisions a worker for those jobs.
        spare_slots += max(0, free - n)
        preferred_open = preferred_open or _can_grow(p, t, current_eur, rules, now)
    waiting = max(0, waiting)

    # 4. Provision for what still waits: the first profile, in order, that can get a worker.
    # Capacity reasons (disabled, no capacity, out-of-stock back-off, max_workers, budget) move
    # on to the next profile; a profile held after another error stops the walk, because
    # falling back there would hide the error behind a different machine type.
    for p in state.profiles:
        tallies[p.name].status = _availability(p, now)
    held_back: list[str] = []
    provisions: list[Provision] = []
    planned_eur = current_eur
    unmet = max(0, waiting - spare_slots)
    provisions_left = rules.max_provisions

    def add_workers(p: ProfileSnapshot, want: int) -> int:
        """Up to `want` new workers on `p` within max_workers, budget and the round's limit."""
        nonlocal planned_eur, provisions_left
        t = tallies[p.name]
        added = 0
        while added < want and provisions_left > 0 and t.live + t.new < p.max_workers:
            if planned_eur + p.hourly_cost_eur > rules.max_hourly_eur + _BUDGET_EPSILON:
                held_back.append(
                    f"{p.name}: budget of {rules.max_hourly_eur:.2f} EUR/h reached "
                    f"(planned {planned_eur:.2f}, one more worker costs {p.hourly_cost_eur:.2f})"
                )
                break
            provisions.append(Provision(p.name, p.hourly_cost_eur))
            planned_eur += p.hourly_cost_eur
            t.hourly_eur += p.hourly_cost_eur
            t.new += 1
            added += 1
            provisions_left -= 1
        if added < want and provisions_left == 0:
            held_back.append(
                f"at most {rules.max_provisions} new workers per round; more next round"
            )
        return added

    # Jobs already on a profile's queue (the API dispatches at once to a warm profile) beyond
    # its free workers need more workers of that same profile; they wait otherwise. A fallback
    # grows only while every profile before it is unavailable: once the preferred one can get
    # a worker again, the fallback's queue waits for the workers it has.
    preferred: str | None = None  # an earlier profile that could still get a worker
    for p in state.profiles:
        t = tallies[p.name]
        free = sum(1 for w in t.workers if w.state in _SERVING and not w.busy)
        backlog = max(0, t.dispatched - free)
        if backlog and t.status == "ok":
            if preferred is None:
                add_workers(p, min(backlog, p.max_workers - t.live))
            else:
                held_back.append(
                    f"{p.name}: not grown for the {backlog} job(s) on its queue; "
                    f"{preferred} is preferred and available again"
                )
        if preferred is None and p.enabled and _can_grow(p, t, planned_eur, rules, now):
            preferred = p.name

    for p in state.profiles:
        if unmet == 0:
            break
        t = tallies[p.name]
        if t.status == "disabled":
            held_back.append(f"{p.name}: disabled")
            continue
        if t.status == "no-capacity":
            held_back.append(f"{p.name}: max_workers is 0")
            continue
        if t.status == "backoff":
            until = p.backoff_until.isoformat() if p.backoff_until else "?"
            held_back.append(f"{p.name}: out of stock, backing off until {until}")
            continue
        if t.status == "held":
            until = p.retry_at.isoformat() if p.retry_at else "?"
            held_back.append(
                f"{p.name}: last provisioning failed ({p.last_error or 'error'}); next attempt "
                f"at {until}; not falling back to another profile"
            )
            break
        room = p.max_workers - t.live - t.new
        if room <= 0:
            held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
            continue
        added = add_workers(p, min(room, unmet))
        unmet -= added
        if provisions_left == 0 and unmet > 0:
            break
        if unmet > 0 and added == room:
            held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
    if unmet > 0:
        held_back.append(f"{unmet} job(s) waiting with no worker slot")

    # 5. Tear down free workers that are drained, idle too long, or serve a profile that is
    # disabled or gone, keeping enough of them to take the jobs already on their queue.
    # A booting worker costs as much as a ready one: once nothing waits for it (its job was
    # cancelled, other workers took the work) it is retired now, not at the boot timeout.
    for name, t in tallies.items():
        prof = profiles.get(name)
        usable = prof is not None and prof.enabled
        free_ready_count = sum(1 for w in t.workers if w.state == "ready" and not w.busy)
        booting_free = sorted(
            (w for w in t.workers if w.state == WorkerState.BOOTING.value and not w.busy),
            key=lambda w: (w.requested_at, w.id),  # keep the oldest: nearest to ready
        )
        # While jobs wait unassigned, a free booting worker takes one next round (keep it);
        # a disabled profile's worker gets none of them.
        wanted = max(0, t.dispatched - free_ready_count) if waiting == 0 or not usable else None
        if wanted is not None and len(booting_free) > wanted:
            retired = {w.id for w in booting_free[wanted:]}
            teardown.extend(Delete(w.id, NOT_NEEDED) for w in booting_free[wanted:])
            t.workers = [w for w in t.workers if w.id not in retired]
        starting_free = sum(
            1 for w in t.workers if w.state in _SERVING and w.state != "ready" and not w.busy
        )
        need = t.dispatched - starting_free
        free_ready = sorted(
            (w for w in t.workers if not w.busy and w.state in ("ready", "draining")),
            key=_idle_ref,
            reverse=True,  # keep the most recently idle ones
        )
        for w in free_ready:
            if w.state == WorkerState.DRAINING.value:
                teardown.append(Delete(w.id, "drained"))
                continue
            if need > 0:
                need -= 1
                continue
            if not usable:
                teardown.append(
                    Delete(w.id, "profile disabled" if prof is not None else "profile removed")
                )
            elif (waiting == 0 or name not in reached) and now - _idle_ref(w) >= rules.idle_timeout:
                teardown.append(Delete(w.id, "idle"))

    # 6. Instances nobody owns: unknown worker, or a worker that no longer claims them.
    owned = {(w.provider, w.instance_id) for w in state.workers if w.instance_id}
    starting = {w.id for w in state.workers if w.state in _STARTING and w.instance_id is None}
    orphans: list[Action] = [
        DeleteOrphan(i.provider, i.instance_id, i.worker_id, i.profile)
        for i in state.inventory
        if i.provider in state.inventory_known
        and (i.provider, i.instance_id) not in owned
        and i.worker_id not in starting
    ]

    marks: list[Action] = [
        MarkDead(
            wid,
            reason,
            capacity=reason.startswith(STOPPED_BEFORE_BOOT),
            failed_boot=reason.startswith(BOOT_TIMEOUT),
        )
        for wid, reason in dead.items()
    ]
    deaths: list[Action] = [Delete(wid, _short(reason) or "dead") for wid, reason in dead.items()]
    actions: tuple[Action, ...] = (
        *booted,
        *marks,
        *requeues,
        *dispatches,
        *provisions,
        *deaths,
        *teardown,
        *orphans,
    )
    summaries = tuple(
        ProfilePlan(
            name=name,
            status=t.status,
            live_workers=t.live,
            new_workers=t.new,
            hourly_eur=round(t.hourly_eur, 6),
            dispatched=t.dispatched,
            running=t.running,
        )
        for name, t in tallies.items()
    )
    return FleetPlan(
        now=now,
        actions=actions,
        held_back=tuple(dict.fromkeys(held_back)),
        profiles=summaries,
        current_hourly_eur=round(current_eur, 6),
        planned_hourly_eur=round(planned_eur, 6),
        waiting=unmet,
    )


def _availability(p: ProfileSnapshot, now: datetime) -> str:
    """Whether a profile may get a new worker now, and if not, why."""
    if not p.enabled:
        return "disabled"
    if p.max_workers == 0:
        return "no-capacity"
    if p.backoff_until is not None and now < p.backoff_until:
        return "backoff"
    if p.retry_at is not None and now < p.retry_at:
        return "held"
    return "ok"


def _can_grow(
    p: ProfileSnapshot, t: _Tally, hourly_eur: float, rules: FleetRules, now: datetime
) -> bool:
    """Whether `p` could get one more worker now: available, under max_workers and budget."""
    return (
        _availability(p, now) == "ok"
        and t.live + t.new < p.max_workers
        and hourly_eur + p.hourly_cost_eur <= rules.max_hourly_eur + _BUDGET_EPSILON
    )


def _idle_ref(w: WorkerSnapshot) -> datetime:
    return w.idle_since or w.ready_at or w.created_at or w.requested_at


def _short(reason: str | None) -> str | None:
    """The head of a reason, short enough for `Worker.delete_reason`."""
    if not reason:
        return None
    return reason.split(":", 1)[0][:64]


def _last_heard(w: WorkerSnapshot, state: FleetState) -> datetime:
    seen = w.last_seen_at or w.ready_at or w.created_at or w.requested_at
    if state.listening_since is not None and state.listening_since > seen:
        return state.listening_since
    return seen


def _silence_limit(state: FleetState) -> timedelta | None:
    """How long a ready worker may be silent before it is dead, this round."""
    rules = state.rules
    if rules.heartbeat_timeout is None or rules.outage_timeout is None:
        return rules.heartbeat_timeout
    ready = [w for w in state.workers if w.state in _REPORTING]
    if any(state.now - _last_heard(w, state) <= rules.heartbeat_timeout for w in ready):
        return rules.heartbeat_timeout  # others are heard: the silent ones are the problem
    return max(rules.outage_timeout, rules.heartbeat_timeout)


def _death(
    w: WorkerSnapshot,
    inst: InstanceSnapshot | None,
    state: FleetState,
    silence_limit: timedelta | None,
) -> str | None:
    """Why a live worker must be declared dead (and its jobs re-routed), or None."""
    now, rules = state.now, state.rules
    if w.state in _STARTING:
        age = _age(now, w.requested_at)
        if age is not None and age > rules.create_timeout:
            return f"provisioning interrupted: still {w.state} after {_fmt(age)}"
        return None
    if w.state not in _LIVE:
        return None
    if w.instance_id is not None and w.provider in state.inventory_known and inst is None:
        return "instance gone: the provider no longer lists it"
    if inst is not None and inst.state in STOPPED_STATES and w.booted_at is not None:
        return f"instance stopped: the provider reports it {inst.state}"
    if (
        inst is not None
        and inst.state in STOPPED_STATES
        and w.state == WorkerState.BOOTING.value
        and w.ready_at is None
    ):
        # Powered on, never booted, stopped again: Scaleway's asynchronous out-of-stock.
        said = f"{inst.state}, {inst.detail}" if inst.detail else inst.state
        return f"{STOPPED_BEFORE_BOOT}: the provider stopped it before it booted ({said})"
    if w.state == WorkerState.BOOTING.value:
        age = _age(now, w.requested_at)
        if age is not None and age > rules.boot_timeout:
            seen = f" (the provider reports it {inst.state})" if inst is not None else ""
            return f"{BOOT_TIMEOUT}: not ready {_fmt(age)} after it was requested{seen}"
        return None
    if silence_limit is not None:
        silent = now - _last_heard(w, state)
        if silent > silence_limit:
            return f"no heartbeat: silent for {_fmt(silent)}"
    return None
