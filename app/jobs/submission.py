"""Submitting a job: what happens between a parsed request and the client's 202.

An upload is stored, then its row is inserted pointing at it, then it is sent to a queue; a
URL job's row is inserted, then its fetch is queued (which cuts a long download the same way,
app/jobs/fetch.py). A long upload (app/jobs/cuts.py) is cut while it is staged: its parts are
inserted with its row and sent as one message each.
Invariants: a job row exists before any message names it; audio no row refers to is deleted
(a refused, failed or replayed insert); a job a broker refused to queue is either kept queued
for the reconcile (an upload: its audio is stored) or removed before the client hears of it
(a URL job: nothing of the client's is stored yet). An idempotent repeat returns the first
job and stores nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from app.audio import probe_audio
from app.celery_config import FETCH_AUDIO
from app.errors import Refused
from app.fleet.served import note_served
from app.jobs import idempotency, service
from app.jobs.cuts import Span
from app.jobs.dispatch import send_dispatched
from app.jobs.loudness import spans_of
from app.models import Job, JobStatus
from app.services import Services
from app.storage import full_is_refused

log = logging.getLogger(__name__)


class Upload(Protocol):
    """The uploaded file as the HTTP layer holds it (werkzeug's FileStorage is one)."""

    def save(self, dst: str) -> None: ...


@dataclass(frozen=True)
class Submitter:
    """What submitting needs, and nothing of HTTP."""

    svc: Services
    # Holds a slot of the bounded pool of slow probes for as long as its context lasts.
    probe_slot: Callable[[], AbstractContextManager[None]]

    def upload(
        self, req: service.JobRequest, upload: Upload, digest: Callable[[], str]
    ) -> tuple[Job, bool]:
        """Store the upload and create its job (dispatched at once to a warm profile); the job
        and whether it was created (False: an idempotent repeat)."""
        key = req.idempotency_key
        if key is not None:
            req = replace(req, request_hash=idempotency.fingerprint(req, digest()))
            existing = service.find_idempotent(self.svc.db, req.owner, key)
            if existing is not None:
                return idempotency.replay(existing, req.request_hash), False
        staged, size, duration, spans = self._stage(upload)
        audio_key = staged.name + ".audio"
        try:
            self.svc.storage.commit(staged, audio_key)
            job, created = service.insert_job(
                self.svc.db,
                req,
                now=self.svc.clock(),
                settings=self.svc.settings,
                spans=spans,
                audio_key=audio_key,
                size_bytes=size,
                duration_seconds=duration,
            )
        except BaseException:
            # No row refers to the audio: a refused or failed insert must not leave it behind.
            staged.unlink(missing_ok=True)
            self._forget(audio_key)
            raise
        if not created:
            self._forget(audio_key)  # the replay answers, whatever the store says
            return idempotency.replay(job, req.request_hash), False
        if job.status == JobStatus.DISPATCHED.value and job.profile is not None:
            if send_dispatched(self.svc.db, self.svc.celery, job.id, job.profile):
                # Fair dispatch's memory (app/fleet/served.py): this token was just served.
                note_served(self.svc.redis, [job.owner], self.svc.clock())
            else:
                job = service.get_job(self.svc.db, job.id)  # back to queued: the reconcile
        return job, True

    def url(self, req: service.JobRequest) -> tuple[Job, bool]:
        """Create a URL job and queue the fetch of its audio; the job and whether it was
        created. Refuses `broker_unavailable` (and keeps nothing) if the fetch cannot be
        queued."""
        if req.idempotency_key is not None:
            req = replace(req, request_hash=idempotency.fingerprint(req))
        job, created = service.insert_job(self.svc.db, req, now=self.svc.clock())
        if not created:
            return idempotency.replay(job, req.request_hash), False
        try:
            FETCH_AUDIO.send(self.svc.celery, job.id, retry=False)
        except Exception as exc:
            service.delete_unstarted_job(self.svc.db, job.id)
            raise Refused(
                "broker_unavailable", "the job queue is unavailable; retry shortly"
            ) from exc
        return job, True

    def _forget(self, audio_key: str) -> None:
        """Delete audio no row names; a store that is down meanwhile must not hide the error
        that brought us here (the object, if it was ever written, is then left to the
        bucket's lifecycle rule, docs/operations.md)."""
        try:
            self.svc.storage.delete(audio_key)
        except Refused as err:
            log.warning("could not delete unreferenced audio: %s", err.code)

    def _stage(self, upload: Upload) -> tuple[Path, int, float, tuple[Span, ...]]:
        """Stream the upload to a staging file, enforce the size cap, probe it, and find the
        spans a long one is cut into (`spans_of`; () when it is not cut)."""
        limit = self.svc.settings.api.max_upload_bytes
        staged = self.svc.storage.staging_path()
        try:
            with full_is_refused():  # a full disk: 507, and the partial file goes below
                upload.save(str(staged))
            size = staged.stat().st_size
            if size > limit:
                raise Refused(
                    "payload_too_large",
                    f"the file is {size} bytes; the limit is {limit} (the setting "
                    "api.max_upload_bytes, MURMUR_MAX_UPLOAD_BYTES)",
                )
            with self.probe_slot():
                info = probe_audio(staged, self.svc.settings.api.max_audio_seconds)
                part_seconds = self.svc.settings.jobs.part_seconds
                spans = spans_of(staged, info.duration_seconds, part_seconds)
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        return staged, size, info.duration_seconds, spans
