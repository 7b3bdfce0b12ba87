"""The planner's records: the frozen snapshot it reads, the actions and plan it returns, and
the working state of one round that its policies share.

Everything here is plain data and small pure helpers; the rules live in the policy modules
(app/fleet/boot_policy.py, scaling_policy.py, idle_policy.py) that app/fleet/planner.py
composes into one pure `plan_fleet`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from app.models import JobStatus, WorkerState

LIVE = frozenset(
    {
        WorkerState.REQUESTED.value,
        WorkerState.CREATING.value,
        WorkerState.BOOTING.value,
        WorkerState.READY.value,
        WorkerState.DRAINING.value,
    }
)


# States in which a worker takes new jobs from its profile's queue (or will once booted).
SERVING = LIVE - {WorkerState.DRAINING.value}


STARTING = frozenset({WorkerState.REQUESTED.value, WorkerState.CREATING.value})


# States in which a worker reports (or sends bare heartbeats), so silence means something.
REPORTING = frozenset({WorkerState.READY.value, WorkerState.DRAINING.value})


READY = WorkerState.READY.value


RUNNING = JobStatus.RUNNING.value


DISPATCHED = JobStatus.DISPATCHED.value


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
    # The instance's boot path said the worker cannot come up (image pull failed, container
    # exited before readiness, its own checks refused the runtime): app.fleet.readiness.
    BOOT_FAILED = "boot failed"
    NO_HEARTBEAT = "no heartbeat"

    @property
    def capacity(self) -> bool:
        """Backs its profile off and falls back to the next, like an out-of-stock create."""
        return self is Death.OUT_OF_STOCK

    @property
    def failed_boot(self) -> bool:
        """Counts as a failed boot of its profile (enough in a row hold it, see
        fleet.max_failed_boots)."""
        return self in (Death.BOOT_TIMEOUT, Death.RUNTIME_REJECTED, Death.BOOT_FAILED)

    @property
    def confirmed(self) -> bool:
        """A failed boot the instance itself reported: one holds its profile at once (a slow
        boot, judged by the timeout, takes fleet.max_failed_boots in a row)."""
        return self is Death.BOOT_FAILED

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


BUDGET_EPSILON = 1e-9


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
    # Work-aware scaling (app/fleet/scaling_policy.py): no job should wait longer than this.
    target_wait: timedelta = timedelta(seconds=300)
    # Boot-time estimate (app/fleet/boot_policy.py): p95 of measured boots × margin, at least
    # boot_floor, at most boot_timeout (also the estimate while too few boots are measured).
    boot_margin: float = 1.5
    boot_floor: timedelta = timedelta(seconds=60)
    # Idle by break-even (app/fleet/idle_policy.py): the shortest idle time before a worker
    # whose next job is not expected within a boot is deleted; None: idle_timeout for all.
    idle_floor: timedelta | None = None
    arrival_window: timedelta = timedelta(minutes=30)


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
    # Learned (app/fleet/learned.py): seconds request → ready of recent successful boots, and
    # audio seconds transcribed per wall second (None: no finished job yet).
    boot_samples: tuple[float, ...] = ()
    speed: float | None = None


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
    """Jobs already committed to a profile's queue: waiting there, or running on its workers.

    A job cut into parts (app/jobs/parts.py) counts as its parts, not as a job: `parts_waiting`
    of them on the queue, holding `parts_waiting_seconds` of audio, the oldest of their jobs
    submitted at `parts_since`."""

    profile: str
    dispatched: int = 0
    running: int = 0
    parts_waiting: int = 0
    parts_waiting_seconds: float = 0.0
    parts_since: datetime | None = None


@dataclass(frozen=True)
class ActiveJob:
    """A dispatched or running job, for the re-route rules (a bounded sample, oldest first)."""

    id: str
    profile: str | None
    status: str  # "dispatched" | "running"
    worker_id: str | None = None
    dispatched_at: datetime | None = None
    audio_seconds: float | None = None
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    # Cut into parts: its work is counted by part (`JobCounts.parts_waiting`), not here.
    parted: bool = False


@dataclass(frozen=True)
class WaitingJob:
    """A queued job for the scaling policy (a few hundred, in fair dispatch order): how much
    audio it holds and, when only some profiles can serve it, which (None: any)."""

    id: str
    submitted_at: datetime
    audio_seconds: float | None = None
    # None: any profile may serve it; empty: none of the configured ones can.
    profiles: tuple[str, ...] | None = None
    # The spans it is cut into (app/jobs/parts.py), 0 when whole: once dispatched, its parts
    # spread over every free worker of the profile instead of holding one.
    parts: int = 0


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
    # Queued job ids the plan may dispatch this round, oldest first within each owner: the
    # head of each owner's queue per kind of job (app/fleet/snapshot.py), bounded.
    dispatchable: tuple[str, ...] = ()
    job_counts: tuple[JobCounts, ...] = ()
    active_jobs: tuple[ActiveJob, ...] = ()
    # Parts of long jobs running now (app/jobs/parts.py), one per busy worker at most: what
    # each such worker still has to do (`audio_seconds` is the part's span).
    running_parts: tuple[ActiveJob, ...] = ()
    # When the fleet last came back from a stop (app.fleet.reconcile.listening_since):
    # nothing could hear the workers before, so their silence counts from here at the earliest.
    listening_since: datetime | None = None
    # Queued jobs with their audio, in dispatch order (app/fleet/scaling_policy.py); empty:
    # one worker per waiting job, as before work-aware scaling.
    waiting_jobs: tuple[WaitingJob, ...] = ()
    # Jobs submitted within rules.arrival_window (app/fleet/idle_policy.py); None: unknown.
    recent_arrivals: int | None = None
    # Jobs (queued, or active and liable to re-route) that only some profiles can serve: job
    # id -> those profiles' names (language, task, model, diarize; computed outside the planner
    # by app/jobs/routing.py). A job not listed may go to any profile.
    routes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Fair dispatch between API tokens (app/fleet/dispatch_order.py): the owner of each
    # dispatchable job, each owner's jobs dispatched or running now, and when the reconcile
    # last dispatched one of its jobs (Unix time). Empty: the ids are taken in the order given.
    owners: Mapping[str, str] = field(default_factory=dict)
    in_service: Mapping[str, int] = field(default_factory=dict)
    last_served: Mapping[str, float] = field(default_factory=dict)


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
    rule: str = ""  # which rule of the scaling policy asked for it, for /v1/fleet and the logs


@dataclass(frozen=True)
class Delete:
    worker_id: str
    reason: str
    rule: str = ""  # which rule decided, when more than the reason says


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
    boot_estimate_seconds: float | None = None
    speed: float | None = None


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
    # Which rule decided each new worker and each retirement, in words (for /v1/fleet).
    decisions: tuple[str, ...] = ()


@dataclass
class Tally:
    """Mutable per-profile bookkeeping while planning (never leaves this module)."""

    live: int = 0  # live workers not marked dead this round
    serving: int = 0  # live, not draining
    dispatched: int = 0
    running: int = 0
    # Parts of long jobs on its queue, not claimed yet, and the audio they hold.
    parts_waiting: int = 0
    parts_seconds: float = 0.0
    parts_since: datetime | None = None
    new: int = 0
    hourly_eur: float = 0.0
    status: str = "ok"
    workers: list[WorkerSnapshot] = field(default_factory=list)

    @property
    def queued_messages(self) -> int:
        """What its free workers will take from its queue before anything dispatched now:
        jobs, and parts of long jobs."""
        return self.dispatched + self.parts_waiting


def age_of(now: datetime, since: datetime | None) -> timedelta | None:
    return None if since is None else now - since


def fmt_seconds(td: timedelta) -> str:
    return f"{int(td.total_seconds())}s"


@dataclass
class Round:
    """One planning round's working state (never leaves this module)."""

    state: FleetState
    profiles: dict[str, ProfileSnapshot]
    tallies: dict[str, Tally]
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
    decisions: list[str] = field(default_factory=list)
    # Of the waiting jobs, those only some profiles serve: their profiles' names.
    restricted_left: list[frozenset[str]] = field(default_factory=list)

    @classmethod
    def start(cls, state: FleetState) -> Round:
        return cls(
            state=state,
            profiles={p.name: p for p in state.profiles},
            tallies={p.name: Tally() for p in state.profiles},
            provisions_left=state.rules.max_provisions,
        )

    def tally(self, name: str) -> Tally:
        if name not in self.tallies:  # a profile removed from the config with workers/jobs
            self.tallies[name] = Tally(status="removed")
        return self.tallies[name]

    def enabled(self) -> Iterator[tuple[ProfileSnapshot, Tally]]:
        return ((p, self.tallies[p.name]) for p in self.state.profiles if p.enabled)


def availability(p: ProfileSnapshot, now: datetime) -> str:
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


def held_reason(p: ProfileSnapshot) -> str:
    """Why a profile held after an error other than stock gets no worker, nor a fallback."""
    until = p.retry_at.isoformat() if p.retry_at else "?"
    return (
        f"{p.name}: last provisioning failed ({p.last_error or 'error'}); next attempt "
        f"at {until}; not falling back to another profile"
    )


def can_grow(
    p: ProfileSnapshot, t: Tally, hourly_eur: float, rules: FleetRules, now: datetime
) -> bool:
    """Whether `p` could get one more worker now: available, under max_workers and budget."""
    return (
        availability(p, now) == "ok"
        and t.live + t.new < p.max_workers
        and hourly_eur + p.hourly_cost_eur <= rules.max_hourly_eur + BUDGET_EPSILON
    )


def idle_ref(w: WorkerSnapshot) -> datetime:
    return w.idle_since or w.ready_at or w.created_at or w.requested_at


def short_reason(reason: str | None) -> str | None:
    """The head of a reason, short enough for `Worker.delete_reason`."""
    if not reason:
        return None
    return reason.split(":", 1)[0][:64]


def serves(state: FleetState, job_id: str, profile: str) -> bool:
    """Whether `profile` can serve the job (its language, task, model, diarization)."""
    allowed = state.routes.get(job_id)
    return allowed is None or profile in allowed


def waits_for(r: Round, profile: str) -> bool:
    """Whether a job still waiting for a worker slot could go to `profile`."""
    if r.waiting - len(r.restricted_left) > 0:
        return True
    return any(profile in allowed for allowed in r.restricted_left)
