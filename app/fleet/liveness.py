"""The control plane's liveness: when a reconcile last completed, kept in Redis.

Each reconcile that ran to its end under its lease records the time (tasks.fleet.reconcile);
`/readyz` and `/metrics` read its age. The record never expires, so a control plane that
stopped shows as an age that grows, not as a missing key; before any record exists the age
counts from when the reader started, so a control plane that never came up is noticed too.
"""

from __future__ import annotations

from datetime import datetime

import redis

RECONCILED_KEY = "murmur:fleet:reconciled-at"


def record_reconciled(r: redis.Redis, at: datetime) -> None:
    r.set(RECONCILED_KEY, f"{at.timestamp():.3f}")


def last_reconciled(r: redis.Redis) -> float | None:
    """Unix time of the last completed reconcile, or None if none was ever recorded."""
    raw = r.get(RECONCILED_KEY)
    if raw is None:
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def reconciled_within(r: redis.Redis, now: datetime, seconds: float) -> bool:
    """Whether a reconcile completed less than `seconds` before `now` (and not in its future)."""
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
    return f"last reconcile completed {age:.0f} s ago (bound {stale_seconds:.0f} s)"
