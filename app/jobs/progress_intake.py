"""A worker's progress report, checked against the job it holds and stored as hot progress.

The attempt is the job's own count of claims (`Job.attempts`), not the worker's word: a job
redelivered to another worker is a new attempt there, and the first worker, still holding a
stale view, no longer holds the job and is answered `{"accepted": false}`.
"""

from __future__ import annotations

import redis

from app.db import Database
from app.jobs import progress
from app.models import Job, JobStatus
from gpu_worker.protocol.progress import ProgressBody


def held_attempt(db: Database, job_id: str, worker_id: str) -> int | None:
    """The attempt this worker runs the job as, or None when it no longer holds the job."""
    with db.reader() as s:
        job = s.get(Job, job_id)
    if job is None or job.status != JobStatus.RUNNING.value or job.worker_id != worker_id:
        return None
    return max(1, int(job.attempts or 0))


def accept(
    db: Database, client: redis.Redis, job_id: str, worker_id: str, body: ProgressBody
) -> bool:
    """Store the report if the worker still holds the job; whether it did (or had already)."""
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
