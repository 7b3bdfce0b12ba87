"""Idle policy: which free workers are retired (drained, idle, not needed, profile gone).

Idle by break-even: keeping an idle worker until the next job costs its price for the expected
gap between jobs (1 / the recent arrival rate: jobs submitted within `rules.arrival_window`);
deleting it and booting a new one for that job costs the same price for the profile's boot
(app/fleet/boot_policy.py), and the job waits that boot. So an idle worker is kept up to
`rules.idle_timeout` (the ceiling) while the next job is expected within a boot, and deleted
after `rules.idle_floor` otherwise: a sparse trickle no longer pays the whole idle timeout
after each job on top of the boot it pays anyway. Without an arrival rate (or without
`idle_floor`) every idle worker gets the idle timeout, as before.
"""

from __future__ import annotations

from datetime import timedelta

from app.fleet.boot_policy import profile_boot
from app.fleet.plan_records import (
    NOT_NEEDED,
    READY,
    REPORTING,
    SERVING,
    Delete,
    ProfileSnapshot,
    Round,
    Tally,
    idle_ref,
    waits_for,
)
from app.models import WorkerState


def retire(r: Round) -> None:
    """5. Tear down free workers that are drained, idle too long, or serve a profile that is
    disabled or gone, keeping enough of them to take the jobs already on their queue.

    A booting worker costs as much as a ready one: once nothing waits for it (its job was
    cancelled, other workers took the work) it is retired now, not at the boot timeout.
    """
    for name, t in r.tallies.items():
        prof = r.profiles.get(name)
        usable = prof is not None and prof.enabled
        retire_unneeded_boots(r, name, t, usable)
        starting_free = sum(
            1 for w in t.workers if w.state in SERVING and w.state != READY and not w.busy
        )
        need = t.queued_messages - starting_free
        free_ready = sorted(
            (w for w in t.workers if not w.busy and w.state in REPORTING),
            key=idle_ref,
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
            elif not waits_for(r, name) or name not in r.reached:
                limit, rule = idle_limit(r, prof)
                if r.state.now - idle_ref(w) >= limit:
                    r.teardown.append(Delete(w.id, "idle", rule=rule))
                    r.decisions.append(f"delete {w.id} ({name}): {rule}")


def idle_limit(r: Round, prof: ProfileSnapshot | None) -> tuple[timedelta, str]:
    """How long a free ready worker of `prof` may stay idle, and the rule that says so."""
    rules = r.state.rules
    arrivals = r.state.recent_arrivals
    ceiling = f"idle for {rules.idle_timeout.total_seconds():.0f} s (fleet.idle_timeout_seconds)"
    if rules.idle_floor is None or arrivals is None:
        return rules.idle_timeout, ceiling
    boot = profile_boot(prof, rules)
    window = rules.arrival_window.total_seconds()
    gap = window / arrivals if arrivals else float("inf")
    if gap < boot:
        return (
            rules.idle_timeout,
            f"{ceiling}; next job expected in {gap:.0f} s < boot {boot:.0f} s",
        )
    floor = min(rules.idle_floor, rules.idle_timeout)
    expected = "no job" if arrivals == 0 else f"next job expected in {gap:.0f} s"
    return floor, (
        f"break-even: {expected} within {window:.0f} s, >= boot {boot:.0f} s: "
        f"idle for {floor.total_seconds():.0f} s costs less than keeping it"
    )


def retire_unneeded_boots(r: Round, name: str, t: Tally, usable: bool) -> None:
    """Free booting workers beyond the jobs on their queue go (the oldest, nearest to ready,
    stay). While jobs wait unassigned a free booting worker takes one next round, so all stay;
    a disabled profile's worker gets none of them."""
    free_ready_count = sum(1 for w in t.workers if w.state == READY and not w.busy)
    booting_free = sorted(
        (w for w in t.workers if w.state == WorkerState.BOOTING.value and not w.busy),
        key=lambda w: (w.requested_at, w.id),
    )
    if usable and waits_for(r, name):
        return
    wanted = max(0, t.queued_messages - free_ready_count)
    if len(booting_free) > wanted:
        retired = {w.id for w in booting_free[wanted:]}
        r.teardown.extend(Delete(w.id, NOT_NEEDED) for w in booting_free[wanted:])
        t.workers = [w for w in t.workers if w.id not in retired]
