"""Putting a job on a profile's queue: compare-and-set the row first, then send the task id.

The row moves `queued -> dispatched` (with its profile) inside a transaction before the
message is sent; if the broker refuses, the row goes back to `queued` and the next reconcile
retries. A job is therefore never on two live queues at once, and never lost.
"""

from __future__ import annotations

import logging

from celery import Celery
from sqlalchemy import update

from app.db import Database, rows_changed
from app.models import Job, JobStatus, utcnow
from tasks.celery_app import TRANSCRIBE_TASK

log = logging.getLogger(__name__)


def dispatch_job(db: Database, celery: Celery, job_id: str, profile: str) -> bool:
    """Send a queued job to `transcribe.<profile>`; False if not queued or the send failed."""
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(
                Job.id == job_id, Job.status == JobStatus.QUEUED.value, Job.audio_key.is_not(None)
            )
            .values(status=JobStatus.DISPATCHED.value, profile=profile, dispatched_at=utcnow()),
        )
    if not moved:
        return False
    return send_dispatched(db, celery, job_id, profile)


def send_dispatched(db: Database, celery: Celery, job_id: str, profile: str) -> bool:
    """Send the message for a job already marked dispatched; on failure put it back to queued."""
    try:
        celery.send_task(TRANSCRIBE_TASK, args=[job_id], queue=f"transcribe.{profile}", retry=False)
    except Exception as exc:  # broker down: keep the job, reconcile dispatches it later
        log.warning("broker refused job %s for %s: %s", job_id, profile, type(exc).__name__)
        with db.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == JobStatus.DISPATCHED.value)
                .values(status=JobStatus.QUEUED.value, dispatched_at=None)
            )
        return False
    return True


def requeue_job(db: Database, job_id: str, from_profile: str) -> bool:
    """Take a dispatched job back (its profile lost its workers) so it can be routed again.

    The message already on the old queue stays there; a worker that later receives it finds the
    job no longer dispatched to its profile, and its claim is refused (a no-op).
    """
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(
                Job.id == job_id,
                Job.status.in_([JobStatus.DISPATCHED.value, JobStatus.RUNNING.value]),
                Job.profile == from_profile,
            )
            .values(status=JobStatus.QUEUED.value, dispatched_at=None, worker_id=None),
        )
    return bool(moved)
