"""Bounds on the I/O workers' outbound work: how many URL fetches and webhook attempts run at
once, in all and per API token, counted in Redis so that every I/O worker process shares them.

Invariants:
- A slot is a member of two Redis sorted sets (the kind's total and the token's), scored with
  its expiry on Redis's own clock. Taking one checks and takes both bounds in one script, so
  two workers never both take the last slot.
- A slot's lease is longer than the work it covers can last (each is bounded by its deadline:
  app/jobs/fetch.py FETCH_DEADLINE_SECONDS, app/jobs/delivery.py WEBHOOK_DEADLINE_SECONDS), so a
  live holder never loses it, and a holder that died (SIGKILL, a lost host) frees it when the
  lease ends: a crash never leaks a slot for good.
- Work that finds no slot raises `SlotsBusy` before it has done anything; its task is retried a
  little later (`busy_countdown`) until its own wait deadline (`SLOT_WAIT_SECONDS`).
- A holder re-asserts its slot every `REFRESH_SECONDS` while it holds it, so slot records lost
  to a Redis FLUSHALL or a restart without persistence are rebuilt within that time: a token
  can exceed its bound only for that long, not for a whole fetch (issue 32 §6).
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

from app.config import IoSettings

KEY_PREFIX = "murmur:io:"

# The whole exchange of one URL fetch (app/jobs/fetch.py) and of one webhook attempt
# (app/jobs/delivery.py): app/deadline.py enforces them. Here, since the slot leases are built
# on them and both modules import this one.
FETCH_DEADLINE_SECONDS = 300
WEBHOOK_DEADLINE_SECONDS = 20.0
# How often a holder re-asserts its slot (rebuilding records Redis lost).
REFRESH_SECONDS = 1.0
# How long a fetch or a webhook attempt waits for a slot (or for the audio store) in all,
# retried with `busy_countdown`, before the job (or the attempt) fails saying why.
SLOT_WAIT_SECONDS = 1800.0

# Takes one slot in KEYS[1] (the kind's total) and KEYS[2] (the token's) if both have room.
# ARGV: total bound, token bound, lease seconds, slot id. Expired slots are dropped first.
_TAKE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', t)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
local lease = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], t + lease, ARGV[4])
redis.call('ZADD', KEYS[2], t + lease, ARGV[4])
local keep = math.ceil(lease * 1000) + 1000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return 1
"""

# Re-asserts a held slot: ARGV lease seconds, slot id. Adds it back if Redis lost it.
_KEEP = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1000000
local lease = tonumber(ARGV[1])
local keep = math.ceil(lease * 1000) + 1000
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, t + lease, ARGV[2])
  redis.call('PEXPIRE', key, keep)
end
return 1
"""


class SlotsBusy(Exception):
    """Every slot of this kind (in all, or of this token) is taken: try again shortly."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"no free {kind} slot")
        self.kind = kind


@dataclass(frozen=True)
class Bound:
    kind: str  # "fetch" | "webhook"
    total: int
    per_token: int
    lease_seconds: float


class IoSlots:
    """The shared fetch and webhook bounds of the settings, kept in `r`."""

    def __init__(self, r: redis.Redis, settings: IoSettings) -> None:
        self._redis = r
        self._take = r.register_script(_TAKE)
        self._keep = r.register_script(_KEEP)
        # The lease outlasts the deadline by a margin: the watchdog's last shot, then the
        # settling of the result, happen after the deadline itself.
        self.fetches = Bound(
            "fetch", settings.fetches, settings.fetches_per_token, FETCH_DEADLINE_SECONDS + 60
        )
        self.webhooks = Bound(
            "webhook", settings.webhooks, settings.webhooks_per_token, WEBHOOK_DEADLINE_SECONDS + 30
        )

    @contextmanager
    def held(self, bound: Bound, owner: str) -> Iterator[None]:
        """Hold one `bound` slot for `owner` (an API token's fingerprint) while the block runs;
        `SlotsBusy` at once if none is free (or Redis cannot say: the work waits, unbounded
        work never starts)."""
        keys = [f"{KEY_PREFIX}{bound.kind}:all", f"{KEY_PREFIX}{bound.kind}:token:{owner}"]
        slot = uuid.uuid4().hex
        try:
            taken = self._take(
                keys=keys, args=[bound.total, bound.per_token, bound.lease_seconds, slot]
            )
        except redis.RedisError as exc:
            raise SlotsBusy(bound.kind) from exc
        if not taken:
            raise SlotsBusy(bound.kind)
        done = threading.Event()
        keeper = threading.Thread(
            target=self._keep_while,
            args=(done, keys, bound.lease_seconds, slot),
            name=f"io-slot-{bound.kind}",
            daemon=True,
        )
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join(timeout=5.0)
            try:
                for key in keys:
                    self._redis.zrem(key, slot)
            except redis.RedisError:
                pass  # the lease frees it

    def _keep_while(self, done: threading.Event, keys: list[str], lease: float, slot: str) -> None:
        """Re-assert the slot every REFRESH_SECONDS until `done`: a flushed record comes back."""
        while not done.wait(REFRESH_SECONDS):
            try:
                self._keep(keys=keys, args=[lease, slot])
            except redis.RedisError:
                continue  # Redis away: the lease (or the next try) covers it

    def in_use(self, bound: Bound, owner: str | None = None) -> int:
        """Slots of `bound` held now, in all or by `owner` (expired ones not counted)."""
        key = f"{KEY_PREFIX}{bound.kind}:" + ("all" if owner is None else f"token:{owner}")
        now_s, now_us = self._redis.time()
        return int(self._redis.zcount(key, f"({now_s + now_us / 1e6}", "+inf"))


def busy_countdown(retries: int) -> float:
    """Seconds before a task that found no slot tries again: from about 1 s, doubling with
    each try up to about 30 s, with jitter so that waiting tasks do not come back together."""
    base = min(30.0, 2.0 ** min(retries, 5))
    return base * random.uniform(0.5, 1.0)
