"""The fleet planner: a pure function from a snapshot of the fleet to the actions that fix it.

`plan_fleet(state)` reads frozen dataclasses (profiles in allowlist order, workers, provider
inventory, job aggregates) and returns a `FleetPlan`. It does no I/O and reads no clock: the
snapshot carries `now`. Jobs arrive aggregated (counts per profile, plus a bounded list of the
ids that could be dispatched or re-routed this round), so the work grows with profiles and
workers, never with the backlog.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from app.fleet.providers.base import InstanceState, is_stopped
from app.models import JobStatus, WorkerState

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
_READY = WorkerState.READY.value
_RUNNING = JobStatus.RUNNING.value
_DISPATCHED = JobStatus.DISPATCHED.value
# Words in a provider's state detail that say a stop was for lack of stock.
_STOCK_DETAIL = ("out of stock", "out_of_stock", "shortage")
# Why a booting worker is retired before it is ready: nothing waits for it any more.
NOT_NEEDED = "not needed"


class Death(StrEnum):
    """Why a live worker is declared dead: the head of its reason (`"<death>: <detail>"`), the
    worker's `delete_reason`, and what the fleet does about it."""

    PROVISIONING_INTERRUPTED = "provisioning interrupted"
    INSTANCE_GONE = "instance gone"
    INSTANCE_STOPPED = "instance stopped"
    # The provider stopped it before it ever booted: out of stock, as if create had said so.
    OUT_OF_STOCK = "out of stock"
    BOOT_TIMEOUT = "boot timeout"
    # Refused at readiness (app.fleet.readiness.reject): it booted an image that cannot serve
    # its profile.
    RUNTIME_REJECTED = "runtime rejected"
    NO_HEARTBEAT = "no heartbeat"

    @property
    def capacity(self) -> bool:
        """Backs its profile off and falls back to the next, like an out-of-stock create."""
        return self is Death.OUT_OF_STOCK

    @property
    def failed_boot(self) -> bool:
        """Counts as a failed boot of its profile (enough in a row hold it, see
        fleet.max_failed_boots)."""
        return self in (Death.BOOT_TIMEOUT, Death.RUNTIME_REJECTED)

    @property
    def keeps_log(self) -> bool:
        """The worker may have run: an operator may still want its last log lines."""
        return self is not Death.OUT_OF_STOCK

    def because(self, detail: str) -> str:
        return f"{self.value}: {detail}"

    @classmethod
    def of(cls, reason: str | None) -> Death | None:
        """The death a reason (or a `delete_reason`) names, or None for a retirement."""
        head = (reason or "").split(":", 1)[0]
        try:
            return cls(head)
        except ValueError:
            return None


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
    # A teardown confirmed its instance gone; volumes or IPs may remain (storage, no GPU cost).
    server_gone: bool = False
    # The provider was seen reporting its instance `starting` (see MarkStarting).
    seen_starting: bool = False


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
    # When the fleet last came back from a stop (app.fleet.reconcile.listening_since):
    # nothing could hear the workers before, so their silence counts from here at the earliest.
    listening_since: datetime | None = None
    # Jobs (queued, or active and liable to re-route) that only some profiles can serve: job
    # id -> those profiles' names (language, task, model, diarize; computed outside the planner
    # by app/jobs/routing.py). A job not listed may go to any profile.
    routes: Mapping[str, frozenset[str]] = field(default_factory=dict)


# --- output ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkBooted:
    worker_id: str


@dataclass(frozen=True)
class MarkStarting:
    """The provider reports the booting worker's instance `starting`: record it once, so a
    later fall back to `stopped` is known to follow a power-on (an asynchronous out-of-stock),
    not a read that does not show the power-on yet."""

    worker_id: str


@dataclass(frozen=True)
class MarkDead:
    worker_id: str
    death: Death
    reason: str  # "<death>: <detail>", for the worker's error and the logs

    @property
    def capacity(self) -> bool:
        return self.death.capacity

    @property
    def failed_boot(self) -> bool:
        return self.death.failed_boot


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
    # Chosen by a caller that must find the worker again whatever interrupts it (murmur smoke);
    # None: the apply step picks one.
    worker_id: str | None = None


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


Action = (
    MarkBooted | MarkStarting | MarkDead | Requeue | Dispatch | Provision | Delete | DeleteOrphan
)


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
    """Every action that brings the fleet toward the demand, within every bound.

    The phases run in order on one `_Round`; each reads what the earlier ones decided.
    """
    r = _Round.start(state)
    _lifecycle(r)
    _count(r)
    _reroute(r)
    _dispatch(r)
    _grow_backlogs(r)
    _provision_waiting(r)
    _retire(r)
    return _finish(r, _orphans(state))


@dataclass
class _Round:
    """One planning round's working state (never leaves this module)."""

    state: FleetState
    profiles: dict[str, ProfileSnapshot]
    tallies: dict[str, _Tally]
    dead: dict[str, MarkDead] = field(default_factory=dict)
    booted: list[Action] = field(default_factory=list)
    teardown: list[Action] = field(default_factory=list)
    live_ids: set[str] = field(default_factory=set)
    current_eur: float = 0.0
    requeues: list[Requeue] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    waiting: int = 0  # queued jobs not given a worker slot yet
    spare_slots: int = 0
    reached: set[str] = field(default_factory=set)  # profiles whose ready workers take new jobs
    held_back: list[str] = field(default_factory=list)
    provisions: list[Provision] = field(default_factory=list)
    planned_eur: float = 0.0
    unmet: int = 0  # jobs that still need a new worker
    provisions_left: int = 0
    # Of the waiting jobs, those only some profiles serve: their profiles' names.
    restricted_left: list[frozenset[str]] = field(default_factory=list)

    @classmethod
    def start(cls, state: FleetState) -> _Round:
        return cls(
            state=state,
            profiles={p.name: p for p in state.profiles},
            tallies={p.name: _Tally() for p in state.profiles},
            provisions_left=state.rules.max_provisions,
        )

    def tally(self, name: str) -> _Tally:
        if name not in self.tallies:  # a profile removed from the config with workers/jobs
            self.tallies[name] = _Tally(status="removed")
        return self.tallies[name]

    def enabled(self) -> Iterator[tuple[ProfileSnapshot, _Tally]]:
        return ((p, self.tallies[p.name]) for p in self.state.profiles if p.enabled)


def _lifecycle(r: _Round) -> None:
    """1. Lifecycle facts and dead workers."""
    state = r.state
    instances = {(i.provider, i.instance_id): i for i in state.inventory}
    silence_limit = _silence_limit(state)
    for w in state.workers:
        inst = instances.get((w.provider, w.instance_id)) if w.instance_id else None
        death = _death(w, inst, state, silence_limit)
        if death is not None:
            r.dead[w.id] = MarkDead(w.id, *death)
            continue
        if (
            w.state in _LIVE
            and w.booted_at is None
            and inst is not None
            and inst.state == InstanceState.RUNNING
        ):
            r.booted.append(MarkBooted(w.id))
        elif (
            w.state == WorkerState.BOOTING.value
            and not w.seen_starting
            and inst is not None
            and inst.state == InstanceState.STARTING
        ):
            r.booted.append(MarkStarting(w.id))
        elif w.state == WorkerState.DELETING.value or w.state == WorkerState.FAILED.value:
            # Teardown not confirmed yet (or a worker rejected at readiness): keep at it.
            r.teardown.append(Delete(w.id, w.delete_reason or _short(w.error) or "failed"))


def _count(r: _Round) -> None:
    """What is live and what it costs; jobs per profile."""
    for w in r.state.workers:
        if w.server_gone:
            pass  # its GPU is gone; what is left is storage, negligible against the budget
        elif w.state != WorkerState.FAILED.value or w.instance_id is not None:
            r.current_eur += w.hourly_cost_eur  # billed until the provider confirms deletion
        if w.state in _LIVE and w.id not in r.dead:
            r.live_ids.add(w.id)
            t = r.tally(w.profile)
            t.live += 1
            t.serving += w.state in _SERVING
            t.hourly_eur += w.hourly_cost_eur
            t.workers.append(w)
    for c in r.state.job_counts:
        t = r.tally(c.profile)
        t.dispatched += c.dispatched
        t.running += c.running
    r.planned_eur = r.current_eur


def _reroute(r: _Round) -> None:
    """2. Re-route jobs that lost their worker, whose profile has no live worker left, or whose
    message was lost."""
    state = r.state
    depths = {p.name: p.queue_depth for p in state.profiles}
    for j in state.active_jobs:
        if j.profile is None:
            continue
        t = r.tally(j.profile)
        lost_worker = (
            j.status == _RUNNING and j.worker_id is not None and j.worker_id not in r.live_ids
        )
        no_worker = t.serving == 0 and (j.status == _DISPATCHED or j.worker_id is None)
        lost_message = (
            j.status == _DISPATCHED
            and depths.get(j.profile) == 0
            and j.dispatched_at is not None
            and state.now - j.dispatched_at > state.rules.lost_message_after
        )
        if not (lost_worker or no_worker or lost_message):
            continue
        if lost_worker:
            mark = r.dead.get(j.worker_id or "")
            reason = f"worker {j.worker_id} {mark.reason if mark else 'is gone'}"
        elif no_worker:
            reason = f"profile {j.profile} has no live worker"
        else:
            reason = "its message is no longer on the queue"
        r.requeues.append(Requeue(j.id, j.profile, reason))
        if j.status == _RUNNING:
            t.running = max(0, t.running - 1)
        else:
            t.dispatched = max(0, t.dispatched - 1)


def _serves(state: FleetState, job_id: str, profile: str) -> bool:
    allowed = state.routes.get(job_id)
    return allowed is None or profile in allowed


def _waits_for(r: _Round, profile: str) -> bool:
    """Whether a waiting job could go to `profile`."""
    if r.waiting - len(r.restricted_left) > 0:
        return True
    return any(profile in allowed for allowed in r.restricted_left)


def _dispatch(r: _Round) -> None:
    """3. Dispatch waiting jobs to free worker slots, in profile order.

    A worker runs one job at a time, so a profile takes as many jobs as it has live, idle
    workers not already promised a job; booting workers count, their jobs wait on the queue
    until they are ready. New work prefers the first profile that can take it: past a profile
    that could still get a worker, or one held after an error other than stock (its jobs wait
    for it, as for the walk in `_provision_waiting`), a fallback's ready workers get no new job
    (an idle one is left to retire); only its workers still starting take the jobs they were
    created for, as they are paid.
    """
    state = r.state
    r.waiting = state.queued + len(r.requeues)
    pool = list(dict.fromkeys([q.job_id for q in r.requeues] + list(state.dispatchable)))
    dispatch_left = state.rules.max_dispatch
    # Earlier profiles that could still get a worker (or are held): a job one of them can
    # serve prefers it, so here only workers still starting take it.
    open_before: list[str] = []
    for p, t in r.enabled():
        free = sum(1 for w in t.workers if w.state in _SERVING and not w.busy) - t.dispatched
        booting = sum(1 for w in t.workers if w.state in _SERVING - {_READY} and not w.busy)
        if open_before:
            # Jobs already on its queue go to its ready workers first.
            booting = min(free, booting)
        else:
            r.reached.add(p.name)
        taken: list[str] = []
        for job_id in pool:
            if len(taken) >= min(free, dispatch_left):
                break
            if not _serves(state, job_id, p.name):
                continue
            if any(_serves(state, job_id, q) for q in open_before):
                if booting <= 0:
                    continue
                booting -= 1
            taken.append(job_id)
        n = len(taken)
        r.dispatches.extend(Dispatch(job_id, p.name) for job_id in taken)
        if n:
            chosen = set(taken)
            pool = [job_id for job_id in pool if job_id not in chosen]
        dispatch_left -= n
        r.waiting -= n
        t.dispatched += n
        # Slots left free only because this round offered no more ids: they take jobs next
        # round, so nobody provisions a worker for those jobs.
        offered = min(free, booting + n) if open_before else free
        r.spare_slots += max(0, offered - n)
        if (
            _can_grow(p, t, r.current_eur, state.rules, state.now)
            or _availability(p, state.now) == "held"
        ):
            open_before.append(p.name)
    r.waiting = max(0, r.waiting)
    if state.routes:
        active = {j.id for j in state.active_jobs} - {q.job_id for q in r.requeues}
        dispatched = {d.job_id for d in r.dispatches}
        r.restricted_left = [
            allowed
            for job_id, allowed in state.routes.items()
            if job_id not in active and job_id not in dispatched
        ][: r.waiting]


def _add_workers(r: _Round, p: ProfileSnapshot, want: int) -> int:
    """Up to `want` new workers on `p` within max_workers, budget and the round's limit."""
    rules = r.state.rules
    t = r.tallies[p.name]
    added = 0
    while added < want and r.provisions_left > 0 and t.live + t.new < p.max_workers:
        if r.planned_eur + p.hourly_cost_eur > rules.max_hourly_eur + _BUDGET_EPSILON:
            r.held_back.append(
                f"{p.name}: budget of {rules.max_hourly_eur:.2f} EUR/h reached "
                f"(planned {r.planned_eur:.2f}, one more worker costs {p.hourly_cost_eur:.2f})"
            )
            break
        r.provisions.append(Provision(p.name, p.hourly_cost_eur))
        r.planned_eur += p.hourly_cost_eur
        t.hourly_eur += p.hourly_cost_eur
        t.new += 1
        added += 1
        r.provisions_left -= 1
    if added < want and r.provisions_left == 0:
        r.held_back.append(f"at most {rules.max_provisions} new workers per round; more next round")
    return added


def _grow_backlogs(r: _Round) -> None:
    """4a. Workers for jobs already on a profile's queue beyond its free workers.

    The API dispatches at once to a warm profile, and such jobs need more workers of that same
    profile; they wait otherwise. A fallback grows only while every profile before it is
    unavailable for lack of capacity: once the preferred one can get a worker again, or while
    it is held after another error, the fallback's queue waits for the workers it has.
    """
    state = r.state
    for p in state.profiles:
        r.tallies[p.name].status = _availability(p, state.now)
    preferred: str | None = None  # an earlier profile that could still get a worker
    held: ProfileSnapshot | None = None  # an earlier profile held after a non-capacity error
    for p in state.profiles:
        t = r.tallies[p.name]
        free = sum(1 for w in t.workers if w.state in _SERVING and not w.busy)
        backlog = max(0, t.dispatched - free)
        if backlog and t.status == "ok":
            if preferred is None and held is None:
                _add_workers(r, p, min(backlog, p.max_workers - t.live))
            elif preferred is not None:
                r.held_back.append(
                    f"{p.name}: not grown for the {backlog} job(s) on its queue; "
                    f"{preferred} is preferred and available again"
                )
            elif held is not None:
                r.held_back.append(_held_reason(held))
                r.held_back.append(
                    f"{p.name}: not grown for the {backlog} job(s) on its queue; "
                    f"{held.name} is held after an error, not falling back"
                )
        if (
            preferred is None
            and p.enabled
            and _can_grow(p, t, r.planned_eur, state.rules, state.now)
        ):
            preferred = p.name
        if held is None and preferred is None and t.status == "held":
            held = p


# Why a profile gets no new worker in the walk, for the reasons that move on to the next one.
_SKIPPED = {
    "disabled": "{name}: disabled",
    "no-capacity": "{name}: max_workers is 0",
    "backoff": "{name}: out of stock, backing off until {until}",
}


def _provision_waiting(r: _Round) -> None:
    """4b. Provision for what still waits: the first profile, in order, that can get a worker.

    Capacity reasons (disabled, no capacity, out-of-stock back-off, max_workers, budget) move
    on to the next profile; a profile held after another error stops the walk, because
    falling back there would hide the error behind a different machine type.
    """
    restricted = list(r.restricted_left)
    # Spare slots take the jobs any profile may serve; the others need their own profiles.
    anywhere = max(0, r.waiting - len(restricted) - r.spare_slots)
    r.unmet = anywhere + len(restricted)
    stuck = 0  # jobs that wait for a held profile that could serve them
    for p in r.state.profiles:
        if r.unmet == 0:
            break
        t = r.tallies[p.name]
        if t.status in _SKIPPED:
            until = p.backoff_until.isoformat() if p.backoff_until else "?"
            r.held_back.append(_SKIPPED[t.status].format(name=p.name, until=until))
            continue
        if t.status == "held":
            r.held_back.append(_held_reason(p))
            # What it could serve waits for it; jobs only later profiles serve walk on.
            kept = [allowed for allowed in restricted if p.name not in allowed]
            stuck += anywhere + len(restricted) - len(kept)
            anywhere, restricted = 0, kept
            r.unmet = len(restricted)
            if not restricted:
                break
            continue
        room = p.max_workers - t.live - t.new
        if room <= 0:
            r.held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
            continue
        servable = [i for i, allowed in enumerate(restricted) if p.name in allowed]
        demand = anywhere + len(servable)
        if demand == 0:
            continue
        added = _add_workers(r, p, min(room, demand))
        # The new workers go to the jobs with the fewest choices first.
        covered = set(servable[:added])
        restricted = [allowed for i, allowed in enumerate(restricted) if i not in covered]
        anywhere -= added - len(covered)
        r.unmet = anywhere + len(restricted)
        if r.provisions_left == 0 and r.unmet > 0:
            break
        if r.unmet > 0 and added == room:
            r.held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
    r.unmet += stuck
    if r.unmet > 0:
        r.held_back.append(f"{r.unmet} job(s) waiting with no worker slot")


def _retire(r: _Round) -> None:
    """5. Tear down free workers that are drained, idle too long, or serve a profile that is
    disabled or gone, keeping enough of them to take the jobs already on their queue.

    A booting worker costs as much as a ready one: once nothing waits for it (its job was
    cancelled, other workers took the work) it is retired now, not at the boot timeout.
    """
    for name, t in r.tallies.items():
        prof = r.profiles.get(name)
        usable = prof is not None and prof.enabled
        _retire_unneeded_boots(r, name, t, usable)
        starting_free = sum(
            1 for w in t.workers if w.state in _SERVING and w.state != _READY and not w.busy
        )
        need = t.dispatched - starting_free
        free_ready = sorted(
            (w for w in t.workers if not w.busy and w.state in _REPORTING),
            key=_idle_ref,
            reverse=True,  # keep the most recently idle ones
        )
        for w in free_ready:
            if w.state == WorkerState.DRAINING.value:
                r.teardown.append(Delete(w.id, "drained"))
                continue
            if need > 0:
                need -= 1
                continue
            if not usable:
                r.teardown.append(
                    Delete(w.id, "profile disabled" if prof is not None else "profile removed")
                )
            elif (not _waits_for(r, name) or name not in r.reached) and (
                r.state.now - _idle_ref(w) >= r.state.rules.idle_timeout
            ):
                r.teardown.append(Delete(w.id, "idle"))


def _retire_unneeded_boots(r: _Round, name: str, t: _Tally, usable: bool) -> None:
    """Free booting workers beyond the jobs on their queue go (the oldest, nearest to ready,
    stay). While jobs wait unassigned a free booting worker takes one next round, so all stay;
    a disabled profile's worker gets none of them."""
    free_ready_count = sum(1 for w in t.workers if w.state == _READY and not w.busy)
    booting_free = sorted(
        (w for w in t.workers if w.state == WorkerState.BOOTING.value and not w.busy),
        key=lambda w: (w.requested_at, w.id),
    )
    if usable and _waits_for(r, name):
        return
    wanted = max(0, t.dispatched - free_ready_count)
    if len(booting_free) > wanted:
        retired = {w.id for w in booting_free[wanted:]}
        r.teardown.extend(Delete(w.id, NOT_NEEDED) for w in booting_free[wanted:])
        t.workers = [w for w in t.workers if w.id not in retired]


def _orphans(state: FleetState) -> list[Action]:
    """6. Instances nobody owns: unknown worker, or a worker that no longer claims them.

    Only an instance that names its worker (providers list only those) can be an orphan: one
    without a worker id was not made by the fleet, and is never deleted.
    """
    owned = {(w.provider, w.instance_id) for w in state.workers if w.instance_id}
    starting = {w.id for w in state.workers if w.state in _STARTING and w.instance_id is None}
    return [
        DeleteOrphan(i.provider, i.instance_id, i.worker_id, i.profile)
        for i in state.inventory
        if i.worker_id
        and i.provider in state.inventory_known
        and (i.provider, i.instance_id) not in owned
        and i.worker_id not in starting
    ]


def _finish(r: _Round, orphans: list[Action]) -> FleetPlan:
    """The actions in the order apply must run them, and the per-profile summary."""
    deaths = [Delete(wid, _short(mark.reason) or "dead") for wid, mark in r.dead.items()]
    actions: tuple[Action, ...] = (
        *r.booted,
        *r.dead.values(),
        *r.requeues,
        *r.dispatches,
        *r.provisions,
        *deaths,
        *r.teardown,
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
        for name, t in r.tallies.items()
    )
    return FleetPlan(
        now=r.state.now,
        actions=actions,
        held_back=tuple(dict.fromkeys(r.held_back)),
        profiles=summaries,
        current_hourly_eur=round(r.current_eur, 6),
        planned_hourly_eur=round(r.planned_eur, 6),
        waiting=r.unmet,
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


def stock_detail(detail: str) -> bool:
    """Whether a provider's state detail says the instance stopped for lack of stock."""
    return any(word in detail.lower() for word in _STOCK_DETAIL)


def _held_reason(p: ProfileSnapshot) -> str:
    """Why a profile held after an error other than stock gets no worker, nor a fallback."""
    until = p.retry_at.isoformat() if p.retry_at else "?"
    return (
        f"{p.name}: last provisioning failed ({p.last_error or 'error'}); next attempt "
        f"at {until}; not falling back to another profile"
    )


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
) -> tuple[Death, str] | None:
    """Why a live worker must be declared dead (and its jobs re-routed), or None."""
    now, rules = state.now, state.rules
    if w.state == WorkerState.FAILED.value and Death.of(w.error) is Death.RUNTIME_REJECTED:
        # Refused at readiness and not counted yet (counting moves it to DELETING).
        return Death.RUNTIME_REJECTED, w.error or Death.RUNTIME_REJECTED.value
    if w.state in _STARTING:
        age = _age(now, w.requested_at)
        if age is not None and age > rules.create_timeout:
            return _died(Death.PROVISIONING_INTERRUPTED, f"still {w.state} after {_fmt(age)}")
        return None
    if w.state not in _LIVE:
        return None
    if w.instance_id is not None and w.provider in state.inventory_known and inst is None:
        return _died(Death.INSTANCE_GONE, "the provider no longer lists it")
    if inst is not None and is_stopped(inst.state) and w.booted_at is not None:
        return _died(Death.INSTANCE_STOPPED, f"the provider reports it {inst.state}")
    if (
        inst is not None
        and is_stopped(inst.state)
        and w.state == WorkerState.BOOTING.value
        and w.ready_at is None
        and (w.seen_starting or stock_detail(inst.detail))
    ):
        # Powered on, never booted, stopped again: Scaleway's asynchronous out-of-stock. Only
        # when the provider says so, or after it was seen starting: right after an accepted
        # power-on a read may still show `stopped`, and that server is on its way up.
        said = f"{inst.state}, {inst.detail}" if inst.detail else inst.state
        return _died(Death.OUT_OF_STOCK, f"the provider stopped it before it booted ({said})")
    if w.state == WorkerState.BOOTING.value:
        age = _age(now, w.requested_at)
        if age is not None and age > rules.boot_timeout:
            seen = f" (the provider reports it {inst.state})" if inst is not None else ""
            return _died(Death.BOOT_TIMEOUT, f"not ready {_fmt(age)} after it was requested{seen}")
        return None
    if silence_limit is not None:
        silent = now - _last_heard(w, state)
        if silent > silence_limit:
            return _died(Death.NO_HEARTBEAT, f"silent for {_fmt(silent)}")
    return None


def _died(death: Death, detail: str) -> tuple[Death, str]:
    return death, death.because(detail)
