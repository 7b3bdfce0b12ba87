"""One thread per API process that waits on Redis for every open event stream at once.

An event stream (app/jobs/event_stream.py) holds its server thread for as long as it is open
(gunicorn's thread worker; app/server.py budgets `api.stream_max_open` threads for them). What
it must not hold is a Redis connection or a database connection while it waits: 200 streams
would be 200 blocked connections. So a stream registers its job and the last stream id it has
read (`wait`), and parks on a `threading.Event`; this hub's thread runs one `XREAD BLOCK` over
the Redis streams of every job that has a waiter, from the oldest id a waiter of that job has
read, and sets the events of the waiters whose job has entries after their id (the oldest
waiter of a job is always among them, so each XREAD that answers wakes someone: no spin).

Invariants:
- No lost wake-up: a waiter names the id it has read up to, and XREAD with an explicit id
  answers at once when the stream already holds entries after it, whenever they were added.
- The hub holds one Redis connection (its own client, with a socket timeout above the block)
  and no database connection; with no waiter it blocks on a condition, not on Redis.
- A waiter added while XREAD blocks is seen within `BLOCK_MS` (the block is short for that
  reason); `wait` returns at its own timeout in any case, so a Redis outage only slows the
  streams down to their timeouts (they then read the database, as their heartbeat does).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

from app.jobs.progress import stream_key

log = logging.getLogger(__name__)

# How long one XREAD blocks: the delay before a newly added waiter is watched.
BLOCK_MS = 250
# After a Redis error the hub retries this much later (the waiters time out meanwhile).
ERROR_PAUSE_SECONDS = 1.0


class _Waiter:
    __slots__ = ("after", "event")

    def __init__(self, after: str) -> None:
        self.after = after
        self.event = threading.Event()


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class EventHub:
    """Waits on the Redis streams of the jobs whose event streams are waiting."""

    def __init__(self, client_factory: Callable[[], redis.Redis]) -> None:
        self._client_factory = client_factory
        self._lock = threading.Condition()
        self._waiters: dict[str, set[_Waiter]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def wait(self, job_id: str, after: str, timeout: float) -> bool:
        """Block until the job's Redis stream holds an entry after id `after`, or `timeout`
        seconds pass; whether an entry came."""
        waiter = _Waiter(after)
        with self._lock:
            self._waiters[job_id].add(waiter)
            self._start()
            self._lock.notify_all()
        try:
            return waiter.event.wait(timeout)
        finally:
            with self._lock:
                waiting = self._waiters.get(job_id)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[job_id]

    def waiting(self) -> int:
        """How many waiters are registered (the bench and the leak tests read it)."""
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify_all()

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="event-hub", daemon=True)
            self._thread.start()

    def _watched(self) -> dict[str, str] | None:
        """{stream key: oldest id read by a waiter of that job}; None once stopped. Blocks
        while nobody waits."""
        with self._lock:
            while not self._waiters and not self._stopped:
                self._lock.wait()
            if self._stopped:
                return None
            return {
                stream_key(job_id): min((w.after for w in waiters), key=_id_key)
                for job_id, waiters in self._waiters.items()
            }

    def _wake(self, found: dict[str, str]) -> None:
        """Wake (and stop watching for) the waiters whose job's stream has an entry after
        their id; `found` holds the first entry after the oldest id of each job."""
        with self._lock:
            for job_id in list(self._waiters):
                entry = found.get(stream_key(job_id))
                if entry is None:
                    continue
                woken = {w for w in self._waiters[job_id] if _id_key(entry) > _id_key(w.after)}
                for waiter in woken:
                    waiter.event.set()
                self._waiters[job_id] -= woken
                if not self._waiters[job_id]:
                    del self._waiters[job_id]

    def _run(self) -> None:
        client = self._client_factory()
        while True:
            streams = self._watched()
            if streams is None:
                return
            try:
                answer: Any = client.xread(streams, count=1, block=BLOCK_MS)  # type: ignore[arg-type]
            except redis.RedisError as exc:
                log.warning("event hub: Redis read failed, retrying: %s", type(exc).__name__)
                with self._lock:
                    self._lock.wait(ERROR_PAUSE_SECONDS)
                continue
            found = {}
            for key, entries in answer or []:
                name = key.decode() if isinstance(key, bytes) else str(key)
                entry_id = entries[0][0]
                found[name] = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            if found:
                self._wake(found)
