"""Bounds on open event streams: per API process (threads) and per API token (fairness).

Invariants (docs/api.md, "Watching a job"):
- An open stream holds one server thread for its whole life (gunicorn's thread worker), so a
  process serves at most `api.stream_max_open` of them, on threads of their own on top of the
  general and synchronous ones (app/server.py): a stream never takes a thread that /healthz,
  a listing or a submission needs. One more is answered 503 `stream_capacity_exhausted`.
- One token holds at most `api.streams_per_token` open streams across every API process: a
  lease per stream in one Redis sorted set per token (score: the lease's expiry), taken
  atomically, renewed at each heartbeat, released when the stream ends. A process that dies
  leaves leases that lapse within `LEASE_HEARTBEATS` heartbeats. One more is 429
  `too_many_streams`. The key names the token's fingerprint, never the token.
- `Held` releases both when the server closes the response (WSGI `close()`), whether or not
  the stream was ever iterated: a client that leaves mid-stream leaks nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis

from app.errors import Refused

_PREFIX = "murmur:streams:"
# A lease lapses this many heartbeats after its last renewal.
LEASE_HEARTBEATS = 3

# KEYS: the token's set. ARGV: now (ms), expiry (ms), cap, member. 1 taken, 0 refused.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return 1
"""


class StreamSlots:
    """The event streams one API process may have open at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    def take(self) -> Callable[[], None]:
        """A slot, or 503 `stream_capacity_exhausted`; returns its release."""
        if not self._free.acquire(blocking=False):
            raise Refused(
                "stream_capacity_exhausted",
                f"this server already holds {self.size} open event streams; retry shortly, or "
                "poll GET /v1/jobs/<id>",
            )
        return self._free.release


class TokenLease:
    """One open stream's lease in its token's set."""

    def __init__(self, client: redis.Redis, owner: str, ttl_seconds: float) -> None:
        self._client = client
        self._key = _PREFIX + owner
        self._member = uuid.uuid4().hex
        self._ttl_ms = int(ttl_seconds * 1000)

    def take(self, cap: int) -> None:
        """Take the lease, or 429 `too_many_streams` when the token holds `cap` already."""
        now = int(time.time() * 1000)
        taken = self._client.eval(_TAKE, 1, self._key, now, now + self._ttl_ms, cap, self._member)
        if not taken:
            raise Refused(
                "too_many_streams",
                f"this API token already has {cap} open event streams; close one first",
            )

    def renew(self) -> None:
        expiry = int(time.time() * 1000) + self._ttl_ms
        try:
            pipe = self._client.pipeline()
            pipe.zadd(self._key, {self._member: expiry}, xx=True)
            pipe.pexpireat(self._key, expiry)
            pipe.execute()
        except redis.RedisError:
            pass  # it lapses on its own; the stream goes on

    def release(self) -> None:
        with contextlib.suppress(redis.RedisError):  # else it lapses on its own
            self._client.zrem(self._key, self._member)

    @staticmethod
    def held(client: redis.Redis, owner: str) -> int:
        """The token's leases not yet lapsed (tests and the bench read it)."""
        now = int(time.time() * 1000)
        return int(client.zcount(_PREFIX + owner, now, "+inf"))


class Held:
    """A response body that releases what its stream holds when the server closes it."""

    def __init__(self, body: Iterable[str], releases: list[Callable[[], None]]) -> None:
        self._body = body
        self._releases = releases

    def __iter__(self) -> Iterator[str]:
        return iter(self._body)

    def close(self) -> None:
        try:
            close: Any = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            for release in self._releases:
                release()
            self._releases = []
