"""The control plane's liveness: when a reconcile last made progress, kept in Redis.

A reconcile run under its lease records the time when it starts, as it applies its actions
(at most once a second) and when it completes (app.fleet.reconcile); `/readyz` and
`/metrics` read its age. So a long but working run (many teardowns, slow provider answers)
stays live, while a run stuck in one call, or no run at all, ages. The record never expires, so
a control plane that stopped shows as an age that grows, not as a missing key; before any
record exists the age counts from when the reader started, so a control plane that never came
up is noticed too. When the last run started is kept apart (`STARTED_KEY`): the beat's
duplicate-send check (tasks.control.due) counts from it, so a long run never makes the next
scheduled one skip.
"""

from __future__ import annotations

from datetime import datetime

import redis

RECONCILED_KEY = "murmur:fleet:reconciled-at"
STARTED_KEY = "murmur:fleet:reconcile-started-at"
# The last plan a reconcile run published (app.fleet.reconcile), read by `/v1/fleet` and
# `/metrics`: kept here, with the other keys a reconcile writes, so both readers import it
# from one module that imports neither of them.
PLAN_KEY = "murmur:fleet:plan"


def record_reconciled(r: redis.Redis, at: datetime) -> None:
    """The control plane made progress at `at` (a run started, acted or completed)."""
    r.set(RECONCILED_KEY, f"{at.timestamp():.3f}")


def record_started(r: redis.Redis, at: datetime) -> None:
    """A reconcile run took the lease at `at`: it is progress, and the beat's reference."""
    stamp = f"{at.timestamp():.3f}"
    r.mset({STARTED_KEY: stamp, RECONCILED_KEY: stamp})


def started_within(r: redis.Redis, now: datetime, seconds: float) -> bool:
    """Whether a reconcile run started less than `seconds` before `now` (and not after it)."""
    raw = r.get(STARTED_KEY)
    try:
        last = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        last = None
    return last is not None and 0 <= now.timestamp() - last < seconds


def last_reconciled(r: redis.Redis) -> float | None:
    """Unix time the control plane last made progress, or None if it never recorded any."""
    raw = r.get(RECONCILED_KEY)
    if raw is None:
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def reconciled_within(r: redis.Redis, now: datetime, seconds: float) -> bool:
    """Whether the control plane made progress less than `seconds` before `now` (not after)."""
    last = last_reconciled(r)
    return last is not None and 0 <= now.timestamp() - last < seconds


def control_plane_problem(
    r: redis.Redis, now: float, started: float, stale_seconds: float
) -> str | None:
    """Why the control plane looks dead, for `/readyz`; None while reconciles complete."""
    last = last_reconciled(r)
    if last is None:
        waited = now - started
        if waited <= stale_seconds:
            return None
        return f"no reconcile completed since this API started {waited:.0f} s ago"
    age = now - last
    if age <= stale_seconds:
        return None
    return f"last reconcile progress {age:.0f} s ago (bound {stale_seconds:.0f} s)"
