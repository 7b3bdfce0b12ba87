"""I/O-queue task of data retention: beat runs it every `retention.sweep_interval_seconds`."""

from __future__ import annotations

from app.celery_config import SWEEP_RETENTION
from app.jobs.retention import sweep_expired_audio
from tasks import context
from tasks.celery_app import celery_app

# Longer than any upload or URL fetch can take (app.jobs.fetch.FETCH_DEADLINE_SECONDS is 300 s):
# a staged file this old belongs to a request or task that died.
STALE_STAGING_SECONDS = 3600.0
# A backlog (after retention is shortened, say) drains over several runs, not in one long task.
MAX_BATCHES_PER_RUN = 10


@celery_app.task(name=SWEEP_RETENTION.name, ignore_result=True)
def sweep_retention() -> dict[str, int]:
    """Delete one batch of expired audio and any stale staged file; safe to run twice at once."""
    svc = context.services()
    settings, store = svc.settings, svc.storage
    deleted = 0
    for _ in range(MAX_BATCHES_PER_RUN):
        cleared = sweep_expired_audio(svc.db, store, settings, svc.clock())
        deleted += cleared
        if cleared < settings.retention.batch_size:
            break
    return {
        "audio_deleted": deleted,
        "staging_deleted": store.remove_stale_staging(STALE_STAGING_SECONDS),
    }
