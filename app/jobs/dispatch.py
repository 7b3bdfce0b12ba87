"""Putting a job on a profile's queue: compare-and-set the row first, then send the task id.

The row moves `queued -> dispatched` (with its profile) inside a transaction before the
message is sent; if the broker refuses, the row goes back to `queued` and the next reconcile
retries. A job is therefore never on two live queues at once, and never lost.

A job cut into parts (app/jobs/parts.py) is sent as one message per unfinished part, each
naming the part's id, never the job's; its parts follow the job back to `queued`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Collection
from datetime import datetime

import redis
from celery import Celery

from app.db import Database
from app.jobs import parts
from app.models import Job, JobStatus, utcnow
from app.transitions import move_job
from gpu_worker.protocol.broker import TRANSCRIBE_TASK, queue_name

log = logging.getLogger(__name__)


def dispatch_job(db: Database, celery: Celery, job_id: str, profile: str, *, now: datetime) -> bool:
    """Send a queued job to `transcribe.<profile>`; False if not queued or the send failed."""
    with db.session() as s:
        moved = move_job(
            s,
            job_id,
            [JobStatus.QUEUED],
            JobStatus.DISPATCHED,
            Job.audio_key.is_not(None),
            profile=profile,
            dispatched_at=now,
        )
    if not moved:
        return False
    return send_dispatched(db, celery, job_id, profile, now=now)


def send_dispatched(
    db: Database, celery: Celery, job_id: str, profile: str, *, now: datetime | None = None
) -> bool:
    """Send the message for a job already marked dispatched (one per waiting part for a job
    cut into parts, marked dispatched at `now`, the caller's clock); on failure put it back
    to queued."""
    ids = parts.to_send(db, job_id, now or utcnow())
    try:
        for message in [job_id] if ids is None else ids:
            celery.send_task(
                TRANSCRIBE_TASK, args=[message], queue=queue_name(profile), retry=False
            )
    except Exception as exc:  # broker down: keep the job, reconcile dispatches it later
        log.warning("broker refused job %s for %s: %s", job_id, profile, type(exc).__name__)
        with db.session() as s:
            if move_job(s, job_id, [JobStatus.DISPATCHED], JobStatus.QUEUED, dispatched_at=None):
                parts.requeue(s, job_id)
        return False
    return True


def send_parts(db: Database, celery: Celery, part_ids: Collection[str], profile: str) -> bool:
    """Send parts of a running job again (a retry, a dead holder's); if the broker refuses,
    the whole job goes back to the queue, its parts with it, for the reconcile to send."""
    try:
        for pid in part_ids:
            celery.send_task(TRANSCRIBE_TASK, args=[pid], queue=queue_name(profile), retry=False)
    except Exception as exc:
        log.warning("broker refused parts of %s: %s", profile, type(exc).__name__)
        with db.session() as s:
            for job_id in {parts.job_of(pid) for pid in part_ids}:
                if move_job(
                    s, job_id, [JobStatus.RUNNING], JobStatus.QUEUED,
                    dispatched_at=None, worker_id=None,
                ):  # fmt: skip
                    parts.requeue(s, job_id)
        return False
    return True


def requeue_job(db: Database, job_id: str, from_profile: str) -> bool:
    """Take a dispatched job back (its profile lost its workers) so it can be routed again.

    The row only; the caller withdraws the message from the old queue (`withdraw_messages`)
    before the job is dispatched again. A message that escapes that (a worker holding it
    already) is harmless: its claim is refused, the job is no longer dispatched to it.
    """
    with db.session() as s:
        moved = move_job(
            s,
            job_id,
            [JobStatus.DISPATCHED, JobStatus.RUNNING],
            JobStatus.QUEUED,
            Job.profile == from_profile,
            dispatched_at=None,
            worker_id=None,
        )
        if moved:
            parts.requeue(s, job_id)
    return moved


# How many messages of one queue a withdrawal reads, at most, and per round trip.
WITHDRAW_SCAN_LIMIT = 10_000
_WITHDRAW_CHUNK = 500


def _job_of(raw: bytes) -> str | None:
    """The job id a transcribe message carries (Celery protocol 2 over kombu's Redis transport)."""
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != TRANSCRIBE_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return (
        args[0] if isinstance(args, list) and len(args) == 1 and isinstance(args[0], str) else None
    )


def withdraw_messages(
    client: redis.Redis,
    profile: str,
    job_ids: Collection[str],
    *,
    scan_limit: int = WITHDRAW_SCAN_LIMIT,
) -> int:
    """Remove the messages of these (re-routed) jobs from `transcribe.<profile>`; how many.

    A stale message would count in the queue depth, which drives scaling and the lost-message
    rule. Reads from the consuming end (kombu pushes left, pops right), where the oldest
    messages are, at most `scan_limit` of them; LREM removes only the exact payload, so a
    message a worker takes meanwhile is simply not found.
    """
    wanted = set(job_ids)
    if not wanted:
        return 0
    queue = queue_name(profile)
    found: list[bytes] = []
    end = -1
    while end >= -scan_limit:
        chunk = client.lrange(queue, max(end - _WITHDRAW_CHUNK + 1, -scan_limit), end)
        if not chunk:
            break
        for item in reversed(chunk):
            raw = item if isinstance(item, bytes) else item.encode()
            named = _job_of(raw)
            if named is not None and parts.job_of(named) in wanted:  # a job's, or its part's
                found.append(raw)  # every copy: an older re-route may have left one too
        end -= _WITHDRAW_CHUNK
    removed = 0
    for raw in found:
        removed += int(client.lrem(queue, -1, raw))  # type: ignore[arg-type]  # bytes are fine
    return removed
