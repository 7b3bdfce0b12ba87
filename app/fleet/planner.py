"""The fleet planner: a pure function from a snapshot of the fleet to the actions that fix it.

It composes the policies, each in its own module, so the rule for "why was this worker booted,
kept or deleted" is found in one place: app/fleet/boot_policy.py (boot time, boot timeout,
dead workers), scaling_policy.py (which profile gets how many new workers), idle_policy.py
(which free workers are retired); the records they share are in plan_records.py. Each new
worker and each retirement carries the rule that decided it (`Provision.rule`,
`Delete.rule`, `FleetPlan.decisions`).

`plan_fleet(state)` reads frozen dataclasses (profiles in allowlist order, workers, provider
inventory, job aggregates) and returns a `FleetPlan`. It does no I/O and reads no clock: the
snapshot carries `now`. Jobs arrive aggregated (counts per profile, plus a bounded list of the
ids that could be dispatched or re-routed this round), so the work grows with profiles and
workers, never with the backlog.
"""

from __future__ import annotations

from app.fleet.boot_policy import lifecycle, profile_boot
from app.fleet.dispatch_order import fair_order
from app.fleet.idle_policy import retire
from app.fleet.plan_records import (
    DISPATCHED,
    LIVE,
    NOT_NEEDED,
    READY,
    RUNNING,
    SERVING,
    STARTING,
    Action,
    ActiveJob,
    Death,
    Delete,
    DeleteOrphan,
    Dispatch,
    FleetPlan,
    FleetRules,
    FleetState,
    InstanceSnapshot,
    JobCounts,
    MarkBooted,
    MarkDead,
    MarkStarting,
    ProfilePlan,
    ProfileSnapshot,
    Provision,
    Requeue,
    Round,
    WaitingJob,
    WorkerSnapshot,
    availability,
    can_grow,
    serves,
    short_reason,
    stock_detail,
)
from app.fleet.scaling_policy import grow_backlogs, grow_for_parts, provision_waiting
from app.models import WorkerState


def plan_fleet(state: FleetState) -> FleetPlan:
    """Every action that brings the fleet toward the demand, within every bound.

    The phases run in order on one `Round`; each reads what the earlier ones decided.
    """
    r = Round.start(state)
    lifecycle(r)
    _count(r)
    _reroute(r)
    _dispatch(r)
    grow_backlogs(r)
    grow_for_parts(r)
    provision_waiting(r)
    retire(r)
    return _finish(r, _orphans(state))


__all__ = [
    "Action",
    "ActiveJob",
    "Death",
    "Delete",
    "DeleteOrphan",
    "Dispatch",
    "FleetPlan",
    "FleetRules",
    "FleetState",
    "InstanceSnapshot",
    "JobCounts",
    "MarkBooted",
    "MarkDead",
    "MarkStarting",
    "NOT_NEEDED",
    "ProfilePlan",
    "ProfileSnapshot",
    "Provision",
    "Requeue",
    "WaitingJob",
    "WorkerSnapshot",
    "plan_fleet",
    "stock_detail",
]


def _count(r: Round) -> None:
    """What is live and what it costs; jobs per profile."""
    for w in r.state.workers:
        if w.server_gone:
            pass  # its GPU is gone; what is left is storage, negligible against the budget
        elif w.state != WorkerState.FAILED.value or w.instance_id is not None:
            r.current_eur += w.hourly_cost_eur  # billed until the provider confirms deletion
        if w.state in LIVE and w.id not in r.dead:
            r.live_ids.add(w.id)
            t = r.tally(w.profile)
            t.live += 1
            t.serving += w.state in SERVING
            t.hourly_eur += w.hourly_cost_eur
            t.workers.append(w)
    for c in r.state.job_counts:
        t = r.tally(c.profile)
        t.dispatched += c.dispatched
        t.running += c.running
        t.parts_waiting += c.parts_waiting
        t.parts_seconds += c.parts_waiting_seconds
        t.parts_since = c.parts_since
    r.planned_eur = r.current_eur


def _reroute(r: Round) -> None:
    """2. Re-route jobs that lost their worker, whose profile has no live worker left, or whose
    message was lost."""
    state = r.state
    depths = {p.name: p.queue_depth for p in state.profiles}
    for j in state.active_jobs:
        if j.profile is None:
            continue
        t = r.tally(j.profile)
        lost_worker = (
            j.status == RUNNING and j.worker_id is not None and j.worker_id not in r.live_ids
        )
        no_worker = t.serving == 0 and (j.status == DISPATCHED or j.worker_id is None)
        lost_message = (
            j.status == DISPATCHED
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
        if j.status == RUNNING:
            t.running = max(0, t.running - 1)
        else:
            t.dispatched = max(0, t.dispatched - 1)
    _not_left_to_a_boot(r)


def _not_left_to_a_boot(r: Round) -> None:
    """2b. A dispatched job waiting on a profile whose workers are all still booting goes back
    to the queue when a ready worker of a profile earlier in the allowlist that serves it is
    free: it (or its parts) takes that worker now instead of waiting a boot beside it (issue
    34: no part waits while a capable worker idles). Never towards a later profile: a
    fallback's ready workers get no new work while the preferred profile can have it."""
    state = r.state
    requeued = {q.job_id for q in r.requeues}
    free_ready: dict[str, int] = {}  # in allowlist order
    for p, t in r.enabled():
        idle = sum(1 for w in t.workers if w.state == READY and not w.busy)
        free_ready[p.name] = idle - t.queued_messages
    order = [p.name for p in state.profiles]
    for j in state.active_jobs:
        if j.status != DISPATCHED or j.profile not in order or j.id in requeued:
            continue
        t = r.tally(str(j.profile))
        if any(w.state == READY for w in t.workers):
            continue
        earlier = order[: order.index(str(j.profile))]
        elsewhere = next(
            (
                name
                for name, n in free_ready.items()
                if n > 0 and name in earlier and serves(state, j.id, name)
            ),
            None,
        )
        if elsewhere is None:
            continue
        free_ready[elsewhere] -= 1
        reason = f"it waits for a boot while a ready worker of {elsewhere} is free"
        r.requeues.append(Requeue(j.id, j.profile, reason))


def _dispatch(r: Round) -> None:
    """3. Dispatch waiting jobs to free worker slots, in profile order.

    A worker runs one job at a time, so a profile takes as many jobs as it has live, idle
    workers not already promised a job; booting workers count, their jobs wait on the queue
    until they are ready. New work prefers the first profile that can take it: past a profile
    that could still get a worker, or one held after an error other than stock (its jobs wait
    for it, as for the walk in `provision_waiting`), a fallback's ready workers get no new job
    (an idle one is left to retire); only its workers still starting take the jobs they were
    created for, as they are paid.
    """
    state = r.state
    r.waiting = state.queued + len(r.requeues)
    fair = fair_order(state.dispatchable, state.owners, state.in_service, state.last_served)
    pool = list(dict.fromkeys([q.job_id for q in r.requeues] + fair))
    dispatch_left = state.rules.max_dispatch
    # Earlier profiles that could still get a worker (or are held): a job one of them can
    # serve prefers it, so here only workers still starting take it.
    open_before: list[str] = []
    preferred: set[str] = set()  # jobs one of them serves
    choices = _choices(state, pool)
    for p, t in r.enabled():
        serving_idle = sum(1 for w in t.workers if w.state in SERVING and not w.busy)
        free = serving_idle - t.queued_messages
        booting = sum(1 for w in t.workers if w.state in SERVING - {READY} and not w.busy)
        if open_before:
            # Jobs already on its queue go to its ready workers first.
            booting = min(free, booting)
        else:
            r.reached.add(p.name)
        taken: list[str] = []
        room = min(free, dispatch_left)
        for job_id in _only_here_first(state, pool, p.name, choices) if room > 0 else ():
            if len(taken) >= room:
                break
            if job_id in preferred:
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
            can_grow(p, t, r.current_eur, state.rules, state.now)
            or availability(p, state.now) == "held"
        ):
            open_before.append(p.name)
            preferred.update(job_id for job_id in pool if serves(state, job_id, p.name))
    r.waiting = max(0, r.waiting)
    if state.routes:
        active = {j.id for j in state.active_jobs} - {q.job_id for q in r.requeues}
        dispatched = {d.job_id for d in r.dispatches}
        r.restricted_left = [
            allowed
            for job_id, allowed in state.routes.items()
            if job_id not in active and job_id not in dispatched
        ][: r.waiting]


def _choices(state: FleetState, pool: list[str]) -> dict[str, int]:
    """How many enabled profiles can serve each job of the pool."""
    enabled = frozenset(p.name for p in state.profiles if p.enabled)
    routes = state.routes
    return {
        job_id: len(routes[job_id] & enabled) if job_id in routes else len(enabled)
        for job_id in pool
    }


def _only_here_first(
    state: FleetState, pool: list[str], profile: str, choices: dict[str, int]
) -> list[str]:
    """The jobs `profile` serves, those no other enabled profile serves first (they have
    nowhere else to go), each group in the pool's (fair) order."""
    mine = [job_id for job_id in pool if serves(state, job_id, profile)]
    return sorted(mine, key=lambda job_id: choices[job_id] > 1)


def _orphans(state: FleetState) -> list[Action]:
    """6. Instances nobody owns: unknown worker, or a worker that no longer claims them.

    Only an instance that names its worker (providers list only those) can be an orphan: one
    without a worker id was not made by the fleet, and is never deleted.
    """
    owned = {(w.provider, w.instance_id) for w in state.workers if w.instance_id}
    starting = {w.id for w in state.workers if w.state in STARTING and w.instance_id is None}
    return [
        DeleteOrphan(i.provider, i.instance_id, i.worker_id, i.profile)
        for i in state.inventory
        if i.worker_id
        and i.provider in state.inventory_known
        and (i.provider, i.instance_id) not in owned
        and i.worker_id not in starting
    ]


def _finish(r: Round, orphans: list[Action]) -> FleetPlan:
    """The actions in the order apply must run them, and the per-profile summary."""
    deaths = [Delete(wid, short_reason(mark.reason) or "dead") for wid, mark in r.dead.items()]
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
            boot_estimate_seconds=(
                profile_boot(r.profiles[name], r.state.rules) if name in r.profiles else None
            ),
            speed=r.profiles[name].speed if name in r.profiles else None,
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
        decisions=tuple(r.decisions),
    )
