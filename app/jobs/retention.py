"""Retention: an ended job's audio is deleted after a while, and an owner may purge a job.

Invariants:
- Audio is deleted only from jobs that have ended (succeeded, failed, cancelled) at least
  `retention.audio_seconds` ago; a job that may still be transcribed keeps its file.
- The file goes before the row forgets its key: a crash between the two leaves a key whose
  next sweep finds nothing to delete and clears it, never a file that no row names.
- Every step is idempotent and the row change is a compare-and-set, so two control workers
  sweeping at once (or a sweep beside a purge) delete each file at most once and never fail.
- A purge removes the row itself (prompt, filename, URLs, transcript), and a long job's part
  rows (app/jobs/parts.py) with it: afterwards the job is unknown, exactly as if it had never
  existed (`404 job_not_found`), and its idempotency key is free again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update

from app.config import Settings
from app.db import Database, rows_changed
from app.errors import Refused
from app.jobs.service import get_job
from app.models import FINISHED_STATES, Job, JobPart
from app.storage import AudioStore

log = logging.getLogger(__name__)


def sweep_expired_audio(db: Database, store: AudioStore, settings: Settings, now: datetime) -> int:
    """Delete the audio of at most one batch of jobs past retention; how many were cleared.

    The query reads only the partial index `ix_jobs_audio_expiry` (jobs that still hold audio),
    so its cost does not grow with the jobs already swept.
    """
    cutoff = now - timedelta(seconds=settings.retention.audio_seconds)
    with db.reader() as s:
        expired = list(
            s.execute(
                select(Job.id, Job.audio_key)
                .where(
                    Job.audio_key.is_not(None),
                    Job.finished_at < cutoff,
                    Job.status.in_(FINISHED_STATES),
                )
                .order_by(Job.finished_at)
                .limit(settings.retention.batch_size)
            ).all()
        )
    cleared = 0
    for job_id, key in expired:
        assert key is not None
        try:
            store.delete(key)
        except Refused as err:  # the store is down: the rows keep their keys for next time
            log.warning("retention: audio store unavailable (%s); will retry", err.code)
            break
        with db.session() as s:
            cleared += rows_changed(
                s,
                update(Job).where(Job.id == job_id, Job.audio_key == key).values(audio_key=None),
            )
    if cleared:
        log.info("retention: deleted the audio of %d ended job(s)", cleared)
    return cleared


def purge_job(db: Database, store: AudioStore, job_id: str, owner: str) -> None:
    """Remove an ended job of `owner`: its audio, its transcript and its row."""
    job = get_job(db, job_id, owner)  # 404 for an unknown job or someone else's
    if job.status not in FINISHED_STATES:
        raise Refused(
            "job_not_finished",
            f"job {job_id} is {job.status}; cancel it (DELETE without purge) before purging it",
        )
    if job.audio_key is not None:
        store.delete(job.audio_key)
    with db.session() as s:
        gone = rows_changed(
            s,
            delete(Job).where(
                Job.id == job_id, Job.owner == owner, Job.status.in_(FINISHED_STATES)
            ),
        )
        if gone:  # a long job's parts (app/jobs/parts.py) go with it
            s.execute(delete(JobPart).where(JobPart.job_id == job_id))
    if not gone:  # purged meanwhile by a concurrent request
        raise Refused("job_not_found", f"no job with id {job_id}")
