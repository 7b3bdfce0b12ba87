"""Scaling policy: which profile gets new workers, and how many, for the jobs that wait."""

from __future__ import annotations

from app.fleet.plan_records import (
    BUDGET_EPSILON,
    SERVING,
    ProfileSnapshot,
    Provision,
    Round,
    availability,
    can_grow,
    held_reason,
)


def add_workers(r: Round, p: ProfileSnapshot, want: int) -> int:
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
        r.provisions.append(Provision(p.name, p.hourly_cost_eur))
        r.planned_eur += p.hourly_cost_eur
        t.hourly_eur += p.hourly_cost_eur
        t.new += 1
        added += 1
        r.provisions_left -= 1
    if added < want and r.provisions_left == 0:
        r.held_back.append(f"at most {rules.max_provisions} new workers per round; more next round")
    return added


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
                add_workers(r, p, min(backlog, p.max_workers - t.live))
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
    r.unmet = max(0, r.waiting - r.spare_slots)
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
            break
        room = p.max_workers - t.live - t.new
        if room <= 0:
            r.held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
            continue
        added = add_workers(r, p, min(room, r.unmet))
        r.unmet -= added
        if r.provisions_left == 0 and r.unmet > 0:
            break
        if r.unmet > 0 and added == room:
            r.held_back.append(f"{p.name}: at max_workers ({p.max_workers})")
    if r.unmet > 0:
        r.held_back.append(f"{r.unmet} job(s) waiting with no worker slot")
