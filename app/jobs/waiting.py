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
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from flask import current_app

from app.db import Database
from app.errors import ApiError
from app.jobs.service import DONE_CHANNEL, get_job
from app.models import FINISHED_STATES, Job

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
# How often a waiter looks at its client, and reads the job while Redis cannot wake it.
CHECK_SECONDS = 1.0
# How often it reads the job anyway while Redis can wake it (a missed message costs this).
READ_SECONDS = 5.0


class SyncSlots:
    """The synchronous requests one API process may have in progress at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    @contextmanager
    def hold(self) -> Iterator[None]:
        if not self._free.acquire(blocking=False):
            raise ApiError(
                503,
                "sync_capacity_exhausted",
                f"this server already waits on {self.size} synchronous transcriptions; retry "
                "shortly, or submit with POST /v1/jobs and poll",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        try:
            yield
        finally:
            self._free.release()


def sync_slots() -> SyncSlots:
    """This app's slots, made on first use (setdefault keeps one even if two threads race)."""
    size = current_app.extensions["murmur"].settings.api.sync_max_waiting
    slots: SyncSlots = current_app.extensions.setdefault("murmur.sync_slots", SyncSlots(size))
    return slots


def client_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The request's connection, where the server exposes it (gunicorn, Werkzeug's server)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    return sock if isinstance(sock, socket.socket) else None


def client_gone(sock: socket.socket | None) -> bool:
    """True once the client has closed or reset its connection; False when it cannot tell.

    The request was read whole, so a readable socket holds either the client's end of stream
    (a peek reads nothing) or a pipelined next request (still there).
    """
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, ValueError):
        return False  # nothing to read after all, or a TLS socket that cannot peek
    except OSError:
        return True  # reset by the peer


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
    client: socket.socket | None = None,
) -> Waited:
    """Wait until the job ends, `timeout` passes, or the client leaves (see the invariants)."""
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
            if client_gone(client):
                log.info("client of synchronous job %s left; stopped waiting", job_id)
                return Waited(job, client_gone=True)
            if woken or pubsub is None or time.monotonic() >= next_read:
                job = get_job(db, job_id)
                next_read = time.monotonic() + READ_SECONDS
        return Waited(job)
    finally:
        if pubsub is not None:
            pubsub.close()
