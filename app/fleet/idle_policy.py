"""Idle policy: which free workers are retired (drained, idle, not needed, profile gone)."""

from __future__ import annotations

from app.fleet.plan_records import (
    NOT_NEEDED,
    READY,
    REPORTING,
    SERVING,
    Delete,
    Round,
    Tally,
    idle_ref,
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
        retire_unneeded_boots(r, t, usable)
        starting_free = sum(
            1 for w in t.workers if w.state in SERVING and w.state != READY and not w.busy
        )
        need = t.dispatched - starting_free
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
            elif (r.waiting == 0 or name not in r.reached) and (
                r.state.now - idle_ref(w) >= r.state.rules.idle_timeout
            ):
                r.teardown.append(Delete(w.id, "idle"))


def retire_unneeded_boots(r: Round, t: Tally, usable: bool) -> None:
    """Free booting workers beyond the jobs on their queue go (the oldest, nearest to ready,
    stay). While jobs wait unassigned a free booting worker takes one next round, so all stay;
    a disabled profile's worker gets none of them."""
    free_ready_count = sum(1 for w in t.workers if w.state == READY and not w.busy)
    booting_free = sorted(
        (w for w in t.workers if w.state == WorkerState.BOOTING.value and not w.busy),
        key=lambda w: (w.requested_at, w.id),
    )
    if r.waiting != 0 and usable:
        return
    wanted = max(0, t.dispatched - free_ready_count)
    if len(booting_free) > wanted:
        retired = {w.id for w in booting_free[wanted:]}
        r.teardown.extend(Delete(w.id, NOT_NEEDED) for w in booting_free[wanted:])
        t.workers = [w for w in t.workers if w.id not in retired]
