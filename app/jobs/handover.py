"""What a claim hands a worker, and what the signed audio URL in it opens.

Invariant: the audio URL is issued by a successful claim and serves only that run: the same
worker, the same attempt, the job still running. Once the job has ended, been cancelled or
handed back, or been claimed again (by another worker or the same one), nobody holding an old
URL may read the audio; each claim issues a new one. Signing and expiry read the services'
clock.

Where the audio store can hand out a URL of its own (the s3 store: a presigned GET), the claim
carries that instead and the API is out of the audio's path. Such a URL is bound to the object
and to its expiry (`storage.presigned_url_ttl_seconds`, short) only, not to the worker, the
attempt or the job's state: until it expires it still reads the audio after a cancellation or
a re-claim (docs/worker-protocol.md). It is still issued by a claim alone, for that attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from app.config import Settings
from app.credentials import sign_audio_url, verify_audio_signature
from app.db import Database
from app.errors import Refused
from app.jobs.service import get_job
from app.models import Job, JobStatus
from app.storage import AudioStore
from gpu_worker.protocol import routes
from gpu_worker.protocol.claim import ClaimedJob


def handed_over(settings: Settings, store: AudioStore, job: Job, now: datetime) -> ClaimedJob:
    """The claimed job as the worker gets it, with an audio URL for this claim alone."""
    assert job.worker_id is not None  # a successful claim sets both
    return ClaimedJob(
        id=job.id,
        language=job.language,
        prompt=job.prompt,
        word_timestamps=job.word_timestamps,
        task="translate" if job.task == "translate" else "transcribe",
        diarize=bool(job.diarize),
        min_speakers=job.min_speakers,
        max_speakers=job.max_speakers,
        temperature=job.temperature,
        vad_filter=job.vad_filter is not False,
        duration_seconds=job.duration_seconds,
        # The worker stops decoding past this (gpu_worker/audio.py), whatever the file
        # claims: the probe's count is one defence, this is the second.
        max_audio_seconds=settings.api.max_audio_seconds,
        audio_url=_audio_url(settings, store, job, now),
    )


def _audio_url(settings: Settings, store: AudioStore, job: Job, now: datetime) -> str:
    """The store's own short-lived URL where it has one, else the API's signed route."""
    assert job.worker_id is not None
    if job.audio_key is not None:
        direct = store.direct_url(job.audio_key, settings.storage.presigned_url_ttl_seconds)
        if direct is not None:
            return direct
    query = sign_audio_url(
        settings.reveal("signing_key"),
        job.id,
        job.worker_id,
        job.attempts,
        settings.api.signed_url_ttl_seconds,
        now=now.timestamp(),
    )
    return f"{settings.api.public_url.rstrip('/')}{routes.audio_path(job.id)}?{query}"


def claimed_audio(
    db: Database, settings: Settings, job_id: str, query: Mapping[str, str], now: datetime
) -> str:
    """The storage key of the audio a signed URL opens, or the refusal (see the invariant)."""
    issued = verify_audio_signature(
        settings.reveal("signing_key"),
        job_id,
        query.get("worker", ""),
        query.get("attempt", ""),
        query.get("expires", ""),
        query.get("sig", ""),
        now=now.timestamp(),
    )
    if issued is None:
        raise Refused("invalid_signature", "the audio URL is invalid or has expired")
    job = get_job(db, job_id)
    if (
        job.status != JobStatus.RUNNING.value
        or job.worker_id != issued.worker_id
        or job.attempts != issued.attempt
    ):
        raise Refused("audio_url_expired", "the job is no longer running on a worker")
    if job.audio_key is None:
        raise Refused("audio_not_found", "the job has no stored audio")
    return job.audio_key
