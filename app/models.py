"""Tables of record: jobs, workers and per-profile fleet state."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, UtcDateTime, as_utc
from gpu_worker.protocol.claim import TRANSCRIBE_PART


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime | None) -> str | None:
    """The one way a timestamp is written in a JSON answer: RFC 3339 in UTC, to the
    millisecond (`2026-12-01T19:13:30.123Z`)."""
    moment = as_utc(value)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z") if moment else None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


FINISHED_STATES = tuple(s.value for s in JobStatus if s.finished)


class WebhookStatus(enum.StrEnum):
    """A job's webhook: `pending → retrying → delivered | failed` (app/jobs/webhooks.py)."""

    PENDING = "pending"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    FAILED = "failed"

    @property
    def open(self) -> bool:
        return self in (WebhookStatus.PENDING, WebhookStatus.RETRYING)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner", "idempotency_key", name="uq_jobs_idempotency"),
        # The webhook sweep's query: due webhooks (app/jobs/webhooks.py).
        Index("ix_jobs_webhook_due", "webhook_status", "webhook_next_at"),
        # A client's listing, newest first, all of it or one status (app/jobs/service.py
        # list_jobs): the index gives the order, so a page reads `limit` rows and sorts none.
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        Index("ix_jobs_owner_status_created", "owner", "status", "created_at", "id"),
        # The reconcile's snapshot (app/fleet/snapshot.py): the oldest queued jobs in order,
        # and per-profile counts of dispatched and running jobs read from the index alone.
        Index("ix_jobs_status_created", "status", "created_at", "id"),
        Index("ix_jobs_status_profile", "status", "profile"),
        # The retention sweep's index (app/jobs/retention.py): only jobs still holding audio.
        Index(
            "ix_jobs_audio_expiry",
            "finished_at",
            sqlite_where=text("audio_key IS NOT NULL"),
            postgresql_where=text("audio_key IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    status: Mapped[str] = mapped_column(String(16), index=True, default=JobStatus.QUEUED.value)
    # The profile whose queue the job waits on or ran on; re-routing changes it.
    profile: Mapped[str | None] = mapped_column(String(40), index=True)
    owner: Mapped[str] = mapped_column(String(64))  # sha256 of the API token that created it
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # SHA-256 (hex) of the request that used the key: a different request with the same key
    # is refused (app/jobs/idempotency.py). Null for jobs without a key.
    idempotency_hash: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(8))  # "upload" | "url"
    source_url: Mapped[str | None] = mapped_column(Text)
    audio_key: Mapped[str | None] = mapped_column(String(255))
    filename: Mapped[str | None] = mapped_column(String(255))
    size_bytes: Mapped[int | None] = mapped_column(Integer)
    duration_seconds: Mapped[float | None] = mapped_column(Float)
    language: Mapped[str | None] = mapped_column(String(8))
    prompt: Mapped[str | None] = mapped_column(Text)
    word_timestamps: Mapped[bool] = mapped_column(default=False)
    # What the job asks of a profile (app/jobs/routing.py); None/False on older rows.
    task: Mapped[str | None] = mapped_column(String(16))  # None: transcribe
    model: Mapped[str | None] = mapped_column(String(64))  # None: any model
    diarize: Mapped[bool] = mapped_column(default=False, server_default=false())
    min_speakers: Mapped[int | None] = mapped_column(Integer)
    max_speakers: Mapped[int | None] = mapped_column(Integer)
    # Decoding options (gpu_worker/protocol/claim.py): a fixed sampling temperature (None: the
    # worker's own), and whether VAD skips silence before decoding.
    temperature: Mapped[float | None] = mapped_column(Float)
    vad_filter: Mapped[bool] = mapped_column(default=True, server_default=true())
    # The language the worker detected when none was asked, and its probability.
    detected_language: Mapped[str | None] = mapped_column(String(16))
    language_probability: Mapped[float | None] = mapped_column(Float)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_status: Mapped[str | None] = mapped_column(String(16))
    # Attempts claimed so far, and when the next is due (or the current one's lease ends).
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    webhook_next_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(40))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    processing_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)
    dispatched_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Deferred: a listing or a poll never reads a transcript (megabytes for hours of audio);
    # `app.jobs.service.get_transcript` reads it for the transcript endpoint. A job's JSON
    # shows the text, kept in its own column (null on rows stored before it: read from the
    # transcript then). Both last, the transcript at the very end: SQLite reads a column by
    # walking past every column stored before it, and a 4 MB transcript in the middle of the
    # row cost a listing 3.5 ms per such job just to reach `created_at`.
    transcript_text: Mapped[str | None] = mapped_column(Text, deferred=True)
    transcript: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)


class PartStatus(enum.StrEnum):
    """A part of a long job (`JobPart`): `queued → dispatched → running → succeeded`; a retry
    goes back to `dispatched`, a re-routed job takes its unfinished parts back to `queued`."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobPart(Base):
    """One part of a job cut at pauses (app/jobs/parts.py): its own message on the job's
    profile queue, claimed, heartbeated, retried and reported like a job. The job's row stays
    the record; a part's id is `<job id>.<index>` (`app.jobs.parts.part_id`)."""

    __tablename__ = "job_parts"
    __table_args__ = (
        UniqueConstraint("job_id", "index", name="uq_job_parts_index"),
        Index("ix_job_parts_job_status", "job_id", "status"),
    )

    id: Mapped[str] = mapped_column(String(48), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(40))
    index: Mapped[int] = mapped_column(Integer)
    # The part's span of the whole file, in seconds: [start, end).
    start_seconds: Mapped[float] = mapped_column(Float)
    end_seconds: Mapped[float] = mapped_column(Float)
    # `transcribe` (its span), or `speakers`: a diarized job's diarization of the whole file
    # (gpu_worker/protocol/claim.py, `SPEAKERS_PART`).
    kind: Mapped[str] = mapped_column(
        String(16), default=TRANSCRIBE_PART, server_default=TRANSCRIBE_PART
    )
    status: Mapped[str] = mapped_column(String(16), default=PartStatus.QUEUED.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker_id: Mapped[str | None] = mapped_column(String(40))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    processing_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    dispatched_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # The worker's transcript of the part, times already in the whole file's (deferred: only
    # the stitch reads it).
    transcript: Mapped[dict[str, Any] | None] = mapped_column(JSON, deferred=True)


class WorkerState(enum.StrEnum):
    REQUESTED = "requested"  # decided by the planner, provider call not made yet
    CREATING = "creating"  # provider create/power-on in progress
    BOOTING = "booting"  # instance exists, worker has not reported ready
    READY = "ready"  # runtime accepted, consuming its profile's queue
    DRAINING = "draining"
    DELETING = "deleting"  # delete requested, not yet confirmed by the provider
    DELETED = "deleted"
    FAILED = "failed"


LIVE_WORKER_STATES = (
    WorkerState.REQUESTED.value,
    WorkerState.CREATING.value,
    WorkerState.BOOTING.value,
    WorkerState.READY.value,
    WorkerState.DRAINING.value,
)


# Key in `Worker.resources`: when a teardown confirmed the instance itself gone. From then on
# the worker costs no GPU time, only the storage its volumes and IPs still hold (cents a day),
# so the cost and budget count it at zero while its teardown goes on (app.fleet.apply).
SERVER_GONE_AT = "server_gone_at"


# Key in `Worker.resources`: when the provider was first seen reporting the instance
# `starting`. A server that is `stopped` again before it booted is then known to have fallen
# back (an asynchronous out-of-stock), not merely not to show its power-on yet.
SEEN_STARTING_AT = "seen_starting_at"


def server_gone(resources: dict[str, Any] | None) -> bool:
    """Whether a worker's instance was confirmed gone (its GPU no longer billed)."""
    return bool((resources or {}).get(SERVER_GONE_AT))


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("wrk"))
    profile: Mapped[str] = mapped_column(String(40), index=True)
    provider: Mapped[str] = mapped_column(String(16))
    instance_id: Mapped[str | None] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default=WorkerState.REQUESTED.value)
    hourly_cost_eur: Mapped[float] = mapped_column(Float, default=0.0)
    runtime: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    # Provider resources to remove on teardown (flexible IP ids, block volume ids).
    resources: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    current_job_id: Mapped[str | None] = mapped_column(String(40))
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)
    requested_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    created_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    booted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    ready_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    first_job_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    idle_since: Mapped[datetime | None] = mapped_column(UtcDateTime())
    last_seen_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    delete_requested_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    deleted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Why the fleet tore this worker down ("idle", "boot timeout", "orphan", ...), for operators.
    delete_reason: Mapped[str | None] = mapped_column(String(64))


class ProfileState(Base):
    """What the fleet learned about a profile: back-off after out-of-stock, last error."""

    __tablename__ = "profile_state"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    backoff_until: Mapped[datetime | None] = mapped_column(UtcDateTime())
    consecutive_stockouts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    last_error_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    availability: Mapped[str | None] = mapped_column(String(16))
    # After a non-capacity provisioning error (quota, permission, 5xx, timeout) the profile is
    # not retried before this time; unlike back-off, its jobs are NOT re-routed meanwhile.
    retry_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Non-capacity provisioning errors in a row: the wait before `retry_at` doubles with each.
    consecutive_errors: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Workers of this profile in a row that never became ready (boot timeout, stopped before
    # booting); at fleet.max_failed_boots the profile is held. Reset by a worker that is ready.
    consecutive_failed_boots: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
