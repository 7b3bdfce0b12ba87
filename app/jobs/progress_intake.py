"""A worker's progress report, checked against the job it holds and stored as hot progress.

The attempt is the job's own count of claims (`Job.attempts`), not the worker's word: a job
redelivered to another worker is a new attempt there, and the first worker, still holding a
stale view, no longer holds the job and is answered `{"accepted": false}`. A part of a long job
(its id `<job id>.<index>`) is checked the same way against its own row, and its report counts
towards its job's progress (`progress.report_part`).
"""

from __future__ import annotations

import logging

import redis

from app.db import Database
from app.jobs import parts, progress
from app.models import Job, JobPart, JobStatus
from gpu_worker.protocol.claim import SPEAKERS_PART
from gpu_worker.protocol.progress import ProgressBody

log = logging.getLogger(__name__)


def held_attempt(db: Database, job_id: str, worker_id: str) -> int | None:
    """The attempt this worker runs the job as, or None when it no longer holds the job."""
    with db.reader() as s:
        job = s.get(Job, job_id)
    if job is None or job.status != JobStatus.RUNNING.value or job.worker_id != worker_id:
        return None
    return max(1, int(job.attempts or 0))


def _count(
    client: redis.Redis, part: JobPart, job: Job, *, attempt: int, seq: int, done: float | None
) -> int:
    """Count a part's seconds done (None: its whole span) towards its job's progress; a
    speakers part counts none (its audio is the transcription parts', app/jobs/parts.py)."""
    if part.kind == SPEAKERS_PART:
        return progress.DUPLICATE
    span = part.end_seconds - part.start_seconds
    verdict, _ = progress.report_part(
        client,
        job.id,
        part.id,
        attempt=attempt,
        seq=seq,
        done_seconds=span if done is None else done,
        span_seconds=span,
        total_seconds=job.duration_seconds or 0.0,
    )
    return verdict


def _accept_part(
    db: Database, client: redis.Redis, pid: str, worker_id: str, body: ProgressBody
) -> bool:
    held = parts.holding(db, pid, worker_id)
    if held is None:
        return False
    part, job = held
    attempt = max(1, int(part.attempts or 0))
    verdict = _count(client, part, job, attempt=attempt, seq=body.seq, done=body.done_seconds)
    return verdict != progress.STALE


def part_finished(db: Database, client: redis.Redis, pid: str) -> None:
    """A part's result is stored: its whole span counts as done (no later report of it does),
    and the segments it made final are streamed (`progress.publish_segments`). The live view
    only: a Redis error is logged, never raised into the result's answer."""
    with db.reader() as s:
        part = s.get(JobPart, pid)
        job = s.get(Job, part.job_id) if part is not None else None
    if part is None or job is None:
        return
    try:
        _count(client, part, job, attempt=progress.FINISHED, seq=1, done=None)
        progress.publish_segments(client, job.id, parts.ready_segments(db, job.id))
    except redis.RedisError as exc:
        log.warning("part %s: its progress was not updated: %s", pid, exc)


def accept(
    db: Database, client: redis.Redis, job_id: str, worker_id: str, body: ProgressBody
) -> bool:
    """Store the report if the worker still holds the job; whether it did (or had already)."""
    if parts.is_part(job_id):
        return _accept_part(db, client, job_id, worker_id, body)
    attempt = held_attempt(db, job_id, worker_id)
    if attempt is None:
        return False
    verdict, _ = progress.report(
        client,
        job_id,
        attempt=attempt,
        seq=body.seq,
        done_seconds=body.done_seconds,
        total_seconds=body.total_seconds,
        segments=[s.model_dump(exclude_none=True) for s in body.segments],
    )
    return verdict != progress.STALE
