"""Idempotency keys: the same key with the same request replays the job, any other is a 422.

A job created with an `Idempotency-Key` stores a fingerprint of its request: the SHA-256 of
the parameters that shape the job (source, URL, language, prompt, word timestamps, webhook)
and, for an upload, of the audio bytes. The display filename is not part of it: it never
changes what is transcribed. A job stored before fingerprints existed has none and replays.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

from werkzeug.datastructures import FileStorage

from app.errors import Refused
from app.jobs.service import JobRequest
from app.models import Job

_CHUNK = 1024 * 1024
_FINGERPRINTED = ("source", "source_url", "language", "prompt", "word_timestamps", "webhook_url")
# Options added later count only when set: a request without them keeps the fingerprint it
# had before they existed, so a key used before an upgrade still replays after it.
# Each with the value that leaves it unset.
_FINGERPRINTED_WHEN_SET: dict[str, object] = {
    "task": "transcribe",
    "model": None,
    "diarize": False,
    "min_speakers": None,
    "max_speakers": None,
    "temperature": None,
    "vad_filter": True,
}


def upload_digest(upload: FileStorage) -> str:
    """SHA-256 of the uploaded bytes; the upload's stream is left at its start for saving."""
    digest = hashlib.sha256()
    stream = upload.stream
    stream.seek(0)
    while chunk := stream.read(_CHUNK):
        digest.update(chunk)
    stream.seek(0)
    return digest.hexdigest()


def fingerprint(req: JobRequest, audio_digest: str | None = None) -> str:
    fields = {
        name: value
        for name, value in asdict(req).items()
        if name in _FINGERPRINTED
        or (name in _FINGERPRINTED_WHEN_SET and value != _FINGERPRINTED_WHEN_SET[name])
    }
    canonical = json.dumps({**fields, "audio_sha256": audio_digest}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(job: Job, request_fingerprint: str | None) -> Job:
    """`job` when this request is the one that created it; else 422 `idempotency_key_reused`."""
    if job.idempotency_hash is not None and job.idempotency_hash != request_fingerprint:
        raise Refused(
            "idempotency_key_reused",
            "this Idempotency-Key was already used with a different request; "
            "use a new key for a new request",
            extra={"job_id": job.id},
        )
    return job
