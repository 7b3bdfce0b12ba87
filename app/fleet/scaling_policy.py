"""Scaling policy: which profile gets new workers, and how many, for the jobs that wait.

Work-aware (when the snapshot carries the waiting jobs' audio and the profile's measured
speed): the queue is played forward on the profile's workers — each free when its current job
or its boot ends, jobs taken in their dispatch order (fair between API tokens, oldest first
within one: app/fleet/dispatch_order.py) by the first worker free (`drain`). A new worker is
added only when it shortens the time to drain the backlog by more than its boot, and always
while some job would otherwise wait past `rules.target_wait` (counted from its submission), up
to `max_workers`, the budget and the round's limit. Jobs that would still wait too long with
the profile at its bound go on to the next profile in the walk, as a stock-out's do.

Without that knowledge (a job of unknown length, a profile that has finished no job yet) each
waiting job gets a worker of its own, as before: the safe side for latency. Only a stock-out,
a disabled profile or a bound moves the walk on; a profile held after another error stops it.

Parts of a long job (app/jobs/parts.py) on a profile's queue are work like jobs, weighed by
the same two rules (`grow_for_parts`): a worker is booted for them only when it drains the
profile's queue sooner by more than its own boot, or when a part would otherwise start later
than `rules.target_wait` after its job's submission. So a short job cut in parts never boots
a worker per part (one worker finishes them before another would boot), while a long file on an
idle fleet gets as many workers as pay for their boot, within `max_workers` and the budget.
Without a measured speed, parts boot only the profile's first worker; they use what is free.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from datetime import datetime

from app.fleet.boot_policy import profile_boot
from app.fleet.plan_records import (
    BUDGET_EPSILON,
    DISPATCHED,
    READY,
    RUNNING,
    SERVING,
    ProfileSnapshot,
    Provision,
    Round,
    WaitingJob,
    availability,
    can_grow,
    held_reason,
)


def add_workers(r: Round, p: ProfileSnapshot, want: int, rule: str = "") -> int:
    """Up to `want` new workers on `p` within max_workers, budget and the round's limit."""
    rules = r.state.rules
    t = r.tallies[p.name]
    added = 0
    while added < want and r.provisions_left > 0 and t.live + t.new < p.max_workers:
        if r.planned_eur + p.hourly_cost_eur > rules.max_hourly_eur + BUDGET_EPSILON:
            r.held_back.append(
                f"{p.name}: budget of {rules.max_hourly_eur:.2f} EUR/h reached "
                f"(planned {r.planned_eur:.2f}, one more worker costs {p.hourly_cost_eur:.2f})"
            )
            break
        r.provisions.append(Provision(p.name, p.hourly_cost_eur, rule=rule))
        r.planned_eur += p.hourly_cost_eur
        t.hourly_eur += p.hourly_cost_eur
        t.new += 1
        added += 1
        r.provisions_left -= 1
    if added < want and r.provisions_left == 0:
        r.held_back.append(f"at most {rules.max_provisions} new workers per round; more next round")
    if added and rule:
        r.decisions.append(f"provision {added} x {p.name}: {rule}")
    return added


@dataclass(frozen=True)
class Drain:
    """The backlog played forward on some workers."""

    seconds: float  # until the last job is done
    max_wait: float  # the longest wait of a job, from its submission to its start
    waits: tuple[float, ...]  # each job's wait, in queue order


def drain(free_in: list[float], queue: list[tuple[float, float]]) -> Drain:
    """Jobs `queue` = [(seconds waited so far, seconds of work)], oldest first, taken by the
    first of the workers free in `free_in` seconds (one job at a time each)."""
    if not free_in:
        return Drain(float("inf"), float("inf") if queue else 0.0, (float("inf"),) * len(queue))
    heap = sorted(free_in)
    waits = []
    end = max(heap)
    for waited, work in queue:
        start = heapq.heappop(heap)
        waits.append(waited + start)
        heapq.heappush(heap, start + work)
        end = max(end, start + work)
    return Drain(end if queue else 0.0, max(waits, default=0.0), tuple(waits))


def workers_wanted(
    free_in: list[float], queue: list[tuple[float, float]], boot: float, target: float, room: int
) -> tuple[int, str]:
    """How many new workers (each free after `boot`) to add for `queue`, at most `room`, and
    the rule that decided the last one ("" when none)."""
    added, rule = 0, ""
    while added < room and queue:
        now = drain(free_in + [boot] * added, queue)
        if not free_in and not added:
            why = "first worker for the waiting jobs"
        elif now.max_wait > target:
            late = sum(1 for w in now.waits if w > target)
            why = f"target wait: {late} job(s) would wait over {target:.0f} s"
        else:
            more = drain(free_in + [boot] * (added + 1), queue)
            gain = now.seconds - more.seconds
            if gain <= boot:
                break
            why = (
                f"drain: one more worker drains the backlog {gain:.0f} s sooner (boot {boot:.0f} s)"
            )
        added, rule = added + 1, why
    return added, rule


def grow_backlogs(r: Round) -> None:
    """4a. Workers for jobs already on a profile's queue beyond its free workers.

    The API dispatches at once to a warm profile, and such jobs need more workers of that same
    profile; they wait otherwise. A fallback grows only while every profile before it is
    unavailable for lack of capacity: once the preferred one can get a worker again, or while
    it is held after another error, the fallback's queue waits for the workers it has.
    """
    state = r.state
    for p in state.profiles:
        r.tallies[p.name].status = availability(p, state.now)
    preferred: str | None = None  # an earlier profile that could still get a worker
    held: ProfileSnapshot | None = None  # an earlier profile held after a non-capacity error
    for p in state.profiles:
        t = r.tallies[p.name]
        free = sum(1 for w in t.workers if w.state in SERVING and not w.busy)
        backlog = max(0, t.dispatched - free)
        if backlog and t.status == "ok":
            if preferred is None and held is None:
                add_workers(r, p, min(backlog, p.max_workers - t.live), "backlog on its queue")
            elif preferred is not None:
                r.held_back.append(
                    f"{p.name}: not grown for the {backlog} job(s) on its queue; "
                    f"{preferred} is preferred and available again"
                )
            elif held is not None:
                r.held_back.append(held_reason(held))
                r.held_back.append(
                    f"{p.name}: not grown for the {backlog} job(s) on its queue; "
                    f"{held.name} is held after an error, not falling back"
                )
        if (
            preferred is None
            and p.enabled
            and can_grow(p, t, r.planned_eur, state.rules, state.now)
        ):
            preferred = p.name
        if held is None and preferred is None and t.status == "held":
            held = p


def grow_for_parts(r: Round) -> None:
    """4a'. Workers for the parts of long jobs on a profile's queue (see the module's rules)."""
    rules = r.state.rules
    target = rules.target_wait.total_seconds()
    for p in r.state.profiles:
        t = r.tallies[p.name]
        if not t.parts_waiting or not p.enabled or t.status != "ok":
            continue
        room = max(0, p.max_workers - t.live - t.new)
        boot = profile_boot(p, rules)
        free_in = _free_in(r, p, boot)
        if p.speed is None or p.speed <= 0:
            if not free_in:
                add_workers(r, p, min(1, room), "parts: first worker for the parts on its queue")
            continue
        queue, _ = _queue(r, p, [], p.speed)  # its jobs and parts not started yet
        n, rule = workers_wanted(free_in, queue, boot, target, room)
        add_workers(r, p, n, f"parts: {rule}")


# Why a profile gets no new worker in the walk, for the reasons that move on to the next one.
SKIPPED = {
    "disabled": "{name}: disabled",
    "no-capacity": "{name}: max_workers is 0",
    "backoff": "{name}: out of stock, backing off until {until}",
}


def provision_waiting(r: Round) -> None:
    """4b. Provision for what still waits: the first profile, in order, that can get a worker.

    Capacity reasons (disabled, no capacity, out-of-stock back-off, max_workers, budget) move
    on to the next profile; a profile held after another error stops the walk, because
    falling back there would hide the error behind a different machine type.
    """
    if r.state.waiting_jobs:
        _provision_by_work(r)
        return
    restricted = list(r.restricted_left)
    # Spare slots take the jobs any profile may serve; the others need their own profiles.
    anywhere = max(0, r.waiting - len(restricted) - r.spare_slots)
    r.unmet = anywhere + len(restricted)
    stuck = 0  # jobs that wait for a held profile that could serve them
    for p in r.state.profiles:
        if r.unmet == 0:
            break
        t = r.tallies[p.name]
        if t.status in SKIPPED:
            until = p.backoff_until.isoformat() if p.backoff_until else "?"
            r.held_back.append(SKIPPED[t.status].format(name=p.name, until=until))
            continue
        if t.status == "held":
            r.held_back.append(held_reason(p))
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
        added = add_workers(r, p, min(room, demand), "one worker per waiting job")
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


def _provision_by_work(r: Round) -> None:
    """4b, work-aware: the walk of `provision_waiting`, each profile sized by `workers_wanted`
    for the waiting jobs it can serve; the jobs it would still leave waiting past the target
    move on to the next profile."""
    state, rules = r.state, r.state.rules
    target = rules.target_wait.total_seconds()
    dispatched = {d.job_id for d in r.dispatches}
    left = [j for j in state.waiting_jobs if j.id not in dispatched]
    spare = r.spare_slots
    stuck = 0  # jobs that wait for a held profile that could serve them
    for p in state.profiles:
        mine = [j for j in left if j.profiles is None or p.name in j.profiles]
        if not mine:
            continue
        t = r.tallies[p.name]
        if t.status in SKIPPED:
            until = p.backoff_until.isoformat() if p.backoff_until else "?"
            r.held_back.append(SKIPPED[t.status].format(name=p.name, until=until))
            continue
        if t.status == "held":
            r.held_back.append(held_reason(p))
            # What it could serve waits for it; jobs only later profiles serve walk on.
            stuck += len(mine)
            left = [j for j in left if j not in mine]
            if not left:
                break
            continue
        room = p.max_workers - t.live - t.new
        boot = profile_boot(p, rules)
        if p.speed is None or p.speed <= 0 or any(j.audio_seconds is None for j in mine):
            # Nothing to weigh: one worker per waiting job (a free slot takes one next round).
            # Free slots (of any profile) take only jobs any profile may serve.
            unrestricted = [j for j in mine if j.profiles is None]
            use = min(spare, len(unrestricted))
            spare -= use
            taken = {j.id for j in unrestricted[:use]}
            rest = [j for j in mine if j.id not in taken]
            rule = "one worker per waiting job (work unknown)"
            added = add_workers(r, p, min(room, len(rest)), rule)
            late = rest[added:]
        else:
            free_in = _free_in(r, p, boot)
            queue, starts = _queue(r, p, mine, p.speed)
            n, rule = workers_wanted(free_in, queue, boot, target, max(0, room))
            added = add_workers(r, p, n, rule)
            after = drain(free_in + [boot] * added, queue)
            # A job starts with its first part (or whole).
            late = [j for j, first in zip(mine, starts, strict=True) if after.waits[first] > target]
        if late and t.live + t.new >= p.max_workers:
            r.held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
        keep = {j.id for j in mine} - {j.id for j in late}
        left = [j for j in left if j.id not in keep]
        if not left or r.provisions_left == 0:
            break
    r.unmet = len(left) + stuck
    if left:
        r.held_back.append(f"{len(left)} job(s) would wait past the target with no worker slot")


def _free_in(r: Round, p: ProfileSnapshot, boot: float) -> list[float]:
    """Seconds until each of the profile's serving workers (new ones too) can take a job."""
    now = r.state.now
    running = {
        j.worker_id: j
        for j in (*r.state.active_jobs, *r.state.running_parts)
        if j.status == RUNNING and j.worker_id is not None
    }
    out = []
    for w in r.tallies[p.name].workers:
        if w.state not in SERVING:
            continue
        if w.state != READY:
            out.append(max(0.0, boot - (now - w.requested_at).total_seconds()))
        elif w.busy:
            job = running.get(w.id)
            left = 0.0
            if job is not None and job.audio_seconds and job.started_at and p.speed:
                left = job.audio_seconds / p.speed - (now - job.started_at).total_seconds()
            out.append(max(0.0, left))
        else:
            out.append(0.0)
    return out + [boot] * r.tallies[p.name].new


def _as_work(job: WaitingJob, now: datetime, speed: float) -> list[tuple[float, float]]:
    """A waiting job as the queue will hold it: whole, or its parts, each its share of the
    audio (they spread over every free worker once the job is dispatched)."""
    waited = (now - job.submitted_at).total_seconds()
    pieces = max(1, job.parts)
    return [(waited, (job.audio_seconds or 0.0) / speed / pieces)] * pieces


def _queue(
    r: Round, p: ProfileSnapshot, mine: list[WaitingJob], speed: float
) -> tuple[list[tuple[float, float]], list[int]]:
    """(seconds waited, seconds of work) of the jobs and parts on the profile's queue not
    started yet (this round's dispatches included), oldest first, then of `mine`, in their
    order, a job cut into parts as its parts; and where each of `mine` starts in that list."""
    now = r.state.now
    waiting = {j.id: j for j in r.state.waiting_jobs}
    ahead: list[tuple[float, float]] = []
    for a in r.state.active_jobs:
        if a.profile == p.name and a.status == DISPATCHED and not a.parted:
            since = a.submitted_at or a.dispatched_at or now
            ahead.append(((now - since).total_seconds(), (a.audio_seconds or 0.0) / speed))
    for d in r.dispatches:
        job = waiting.get(d.job_id)
        if d.profile == p.name and job is not None:
            ahead += _as_work(job, now, speed)
    t = r.tallies[p.name]
    if t.parts_waiting:  # parts of long jobs, each its part of the audio
        waited = (now - t.parts_since).total_seconds() if t.parts_since else 0.0
        ahead += [(waited, t.parts_seconds / t.parts_waiting / speed)] * t.parts_waiting
    ahead.sort(key=lambda q: -q[0])
    starts = []
    for job in mine:
        starts.append(len(ahead))
        ahead += _as_work(job, now, speed)
    return ahead, starts
