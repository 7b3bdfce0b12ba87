"""When the reconcile last dispatched a job of each owner: the memory fair dispatch needs.

The planner is a pure function of the snapshot, and the database does not say cheaply who was
served last; so the reconcile notes it in one Redis hash (owner -> Unix time), and the
snapshot reads it back (app/fleet/dispatch_order.py breaks ties of turn with it). Losing it
(a Redis flush or restart) costs one round of strict round-robin, nothing else: every owner
then counts as never served, and turns fall back to jobs in service and age.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

import redis

log = logging.getLogger("murmur.fleet")

SERVED_KEY = "murmur:fleet:served"
# Owners not served for this long are forgotten with the whole hash (one field per token).
SERVED_TTL_SECONDS = 86_400


def note_served(client: redis.Redis, owners: Iterable[str], at: datetime) -> None:
    """Record that a job of each of `owners` was dispatched at `at`."""
    mapping = {owner: at.timestamp() for owner in owners}
    if not mapping:
        return
    try:
        pipe = client.pipeline(transaction=False)
        pipe.hset(SERVED_KEY, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(SERVED_KEY, SERVED_TTL_SECONDS)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("fleet: cannot note the owners served: %s", type(exc).__name__)


def read_served(client: redis.Redis) -> dict[str, float]:
    """Owner -> when a job of theirs was last dispatched; empty if Redis cannot say."""
    try:
        raw = client.hgetall(SERVED_KEY)
    except redis.RedisError as exc:
        log.warning("fleet: cannot read the owners served: %s", type(exc).__name__)
        return {}
    served: dict[str, float] = {}
    for owner, at in raw.items():
        try:
            served[owner.decode() if isinstance(owner, bytes) else str(owner)] = float(at)
        except (ValueError, UnicodeDecodeError):
            continue
    return served
