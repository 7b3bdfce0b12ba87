"""What a claim hands a worker, and what the signed audio URL in it opens.

Invariant: the audio URL is issued by a successful claim and serves only that run: the same
worker, the same attempt, the job still running (for a part of a long job: the part's claim,
the part and its job still running). Once the job has ended, been cancelled or
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
from app.jobs import parts
from app.jobs.cuts import OVERLAP_SECONDS
from app.jobs.service import get_job
from app.models import Job, JobPart, JobStatus, PartStatus
from app.storage import AudioStore
from gpu_worker.protocol import routes
from gpu_worker.protocol.claim import SPEAKERS_PART, TRANSCRIBE_PART, ClaimedJob, ClaimedPart


def handed_over(settings: Settings, store: AudioStore, job: Job, now: datetime) -> ClaimedJob:
    """The claimed job as the worker gets it, with an audio URL for this claim alone."""
    assert job.worker_id is not None  # a successful claim sets both
    url = _audio_url(settings, store, job.audio_key, (job.id, job.worker_id, job.attempts), now)
    return _claimed(settings, job, url)


def handed_over_part(
    settings: Settings, store: AudioStore, job: Job, part: JobPart, count: int, now: datetime
) -> ClaimedJob:
    """A claimed part as the worker gets it: the job's options (its prompt on the first part
    only), the part's span plus the overlap, and an audio URL for this part's claim alone.
    A diarized job's speakers part diarizes its span (the whole file) and transcribes nothing;
    its other parts transcribe without speakers (gpu_worker/protocol/claim.py)."""
    assert part.worker_id is not None  # a successful claim sets it
    url = _audio_url(settings, store, job.audio_key, (part.id, part.worker_id, part.attempts), now)
    speakers = part.kind == SPEAKERS_PART
    until = part.end_seconds
    if part.index < count - 1 and not speakers:
        until = min(part.end_seconds + OVERLAP_SECONDS, job.duration_seconds or until)
    span = ClaimedPart(
        index=part.index,
        count=count,
        offset_seconds=part.start_seconds,
        until_seconds=until,
        kind=SPEAKERS_PART if speakers else TRANSCRIBE_PART,
    )
    whole = _claimed(settings, job, url)
    prompt = job.prompt if part.index == 0 else None
    update = {"id": part.id, "prompt": prompt, "part": span, "diarize": whole.diarize and speakers}
    return whole.model_copy(update=update)


def _claimed(settings: Settings, job: Job, audio_url: str) -> ClaimedJob:
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
        audio_url=audio_url,
    )


def _audio_url(
    settings: Settings,
    store: AudioStore,
    audio_key: str | None,
    claim: tuple[str, str, int],
    now: datetime,
) -> str:
    """The store's own short-lived URL where it has one, else the API's signed route bound to
    the claim: (the job's or part's id, the worker, the attempt)."""
    if audio_key is not None:
        direct = store.direct_url(audio_key, settings.storage.presigned_url_ttl_seconds)
        if direct is not None:
            return direct
    claimed, worker_id, attempt = claim
    query = sign_audio_url(
        settings.reveal("signing_key"),
        claimed,
        worker_id,
        attempt,
        settings.api.signed_url_ttl_seconds,
        now=now.timestamp(),
    )
    return f"{settings.api.public_url.rstrip('/')}{routes.audio_path(claimed)}?{query}"


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
    holder = _holder(db, job_id)
    job = get_job(db, parts.job_of(job_id))
    if (
        job.status != JobStatus.RUNNING.value
        or holder is None
        or holder != (issued.worker_id, issued.attempt)
    ):
        raise Refused("audio_url_expired", "the job is no longer running on a worker")
    if job.audio_key is None:
        raise Refused("audio_not_found", "the job has no stored audio")
    return job.audio_key


def _holder(db: Database, claimed: str) -> tuple[str | None, int] | None:
    """(worker, attempt) of a running job's or part's current claim; None if not running."""
    if not parts.is_part(claimed):
        job = get_job(db, claimed)
        return (job.worker_id, job.attempts) if job.status == JobStatus.RUNNING.value else None
    with db.reader() as s:
        part = s.get(JobPart, claimed)
    if part is None or part.status != PartStatus.RUNNING.value:
        return None
    return part.worker_id, part.attempts
