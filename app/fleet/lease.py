"""A short Redis lease that a watchdog thread renews while its holder is alive.

Invariants: the key holds one random token per holder; renewal and release are compare-and-set
on that token (Lua), so a holder never extends or deletes another's lease. A holder that dies
stops renewing and its lease expires within one lease length. A holder that cannot renew in
time (Redis unreachable, its process stalled, another owner found) counts its lease lost from
its own monotonic clock, never later than Redis would expire it, and `check` then refuses.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import redis

log = logging.getLogger("murmur.fleet")

# Extend the lease only if it is still ours: PEXPIRE on a key someone else set would extend
# their lease, and a renewal after expiry must not resurrect ours.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class LeaseLost(Exception):
    """The lease expired or another holder took it; stop writing at once."""


class Lease:
    """One attempt at holding `key` for `seconds`, renewed every third of that while held."""

    def __init__(self, r: redis.Redis, key: str, seconds: float) -> None:
        self._redis = r
        self._key = key
        self._seconds = seconds
        self._ms = max(1, int(seconds * 1000))
        self._token = secrets.token_hex(16)
        self._renew = r.register_script(_RENEW)
        self._release = r.register_script(_RELEASE)
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._valid_until = 0.0  # monotonic; set when acquired and at each renewal
        self._watchdog: threading.Thread | None = None

    def acquire(self) -> bool:
        """Take the lease if nobody holds it; never waits."""
        sent = time.monotonic()
        if not self._redis.set(self._key, self._token, nx=True, px=self._ms):
            return False
        # Counted from before the SET: Redis's expiry starts later, so ours ends first.
        self._valid_until = sent + self._seconds
        self._watchdog = threading.Thread(target=self._watch, name="lease-watchdog", daemon=True)
        self._watchdog.start()
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self._seconds / 3):
            sent = time.monotonic()
            try:
                renewed = int(self._renew(keys=[self._key], args=[self._token, self._ms]))
            except redis.RedisError as exc:
                log.warning("lease %s: renewal failed: %s", self._key, type(exc).__name__)
                renewed = -1
            if renewed == 1:
                self._valid_until = sent + self._seconds
            elif renewed == 0 or time.monotonic() >= self._valid_until:
                self._lost.set()
                return

    def check(self) -> None:
        """Raise LeaseLost unless the lease is still ours; call before every write."""
        if self._lost.is_set() or time.monotonic() >= self._valid_until:
            self._lost.set()
            raise LeaseLost(f"the lease on {self._key} was lost")

    def release(self) -> None:
        """Stop renewing and delete the key if it is still ours."""
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(self._seconds)
        try:
            self._release(keys=[self._key], args=[self._token])
        except redis.RedisError as exc:  # it expires on its own within one lease
            log.warning("lease %s: release failed: %s", self._key, type(exc).__name__)
