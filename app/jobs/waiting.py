"""Synchronous transcription's waiting: bounded per process, stopped when the client leaves.

Invariants (the reasons are in docs/api.md, "Synchronous transcription under load"):
- At most `api.sync_max_waiting` synchronous requests are in progress in one API process; the
  server runs that many threads on top of its general ones (app/server.py), so a waiting
  request never holds a thread that /healthz, GET /v1/jobs or a submission needs. One more is
  answered 503 `sync_capacity_exhausted` with Retry-After before anything is read or stored.
- A waiter ends when the job ends, when the timeout passes, or when its client has gone; it
  never cancels the job (a retry with the same Idempotency-Key finds it again).
- The database is the truth and Redis only wakes a waiter early: if Redis fails during a wait,
  the waiter reads the database instead. If Redis is down when the wait starts, the job is
  kept for the reconcile and the caller answers 503 with the job id at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from app.db import Database
from app.errors import Refused
from app.jobs.service import DONE_CHANNEL, get_job
from app.models import FINISHED_STATES, Job

log = logging.getLogger(__name__)

# How often a waiter looks at its client, and reads the job while Redis cannot wake it.
CHECK_SECONDS = 1.0
# How often it reads the job anyway while Redis can wake it (a missed message costs this).
READ_SECONDS = 5.0


# Where `create_app` keeps the process's `SyncSlots` (the Flask app's extensions).
SYNC_SLOTS = "murmur.sync_slots"


class SyncSlots:
    """The synchronous requests one API process may have in progress at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    @contextmanager
    def hold(self) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            raise Refused(
                "sync_capacity_exhausted",
                f"this server already waits on {self.size} synchronous transcriptions; retry "
                "shortly, or submit with POST /v1/jobs and poll",
            )
        try:
            yield
        finally:
            self._free.release()


@dataclass
class Waited:
    """How a wait ended: the job as last read, and whether Redis or the client was missing."""

    job: Job
    broker_down: bool = False
    client_gone: bool = False


def wait_for_job(
    db: Database,
    r: redis.Redis,
    job_id: str,
    timeout: float,
    client_gone: Callable[[], bool] = lambda: False,
) -> Waited:
    """Wait until the job ends, `timeout` passes, or `client_gone()` says the client left (see
    the invariants)."""
    deadline = time.monotonic() + timeout
    pubsub: Any = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        try:
            pubsub.subscribe(DONE_CHANNEL + job_id)
        except (redis.RedisError, OSError):
            job = get_job(db, job_id)
            return Waited(job, broker_down=job.status not in FINISHED_STATES)
        job = get_job(db, job_id)
        next_read = time.monotonic() + READ_SECONDS
        while job.status not in FINISHED_STATES:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            woken = False
            if pubsub is not None:
                try:
                    woken = pubsub.get_message(timeout=min(CHECK_SECONDS, left)) is not None
                except (redis.RedisError, OSError) as exc:
                    log.warning("waiting on %s without Redis: %s", job_id, type(exc).__name__)
                    pubsub.close()
                    pubsub = None
            else:
                time.sleep(min(CHECK_SECONDS, left))
            if client_gone():
                log.info("client of synchronous job %s left; stopped waiting", job_id)
                return Waited(job, client_gone=True)
            if woken or pubsub is None or time.monotonic() >= next_read:
                job = get_job(db, job_id)
                next_read = time.monotonic() + READ_SECONDS
        return Waited(job)
    finally:
        if pubsub is not None:
            pubsub.close()
