"""Job lifecycle: create, route, claim, finish, cancel — every transition a compare-and-set.

A job row is committed before any message about it is sent. A transition only happens from
the states it is allowed from, in one UPDATE ... WHERE status IN (...), so a redelivered task,
a second worker or a late cancel can never overwrite a finished job or store a transcript twice.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Select, delete, func, inspect, literal, select, tuple_, union, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, undefer
from sqlalchemy.orm.attributes import set_committed_value

from app.auth import WorkerCaller
from app.celery_config import DELIVER_WEBHOOK
from app.config import Settings
from app.db import Database, as_utc
from app.errors import Refused
from app.inputs import text_problem
from app.jobs import parts, progress, routing
from app.jobs.cuts import Span
from app.jobs.dispatch import dispatch_job
from app.models import (
    FINISHED_STATES,
    LIVE_WORKER_STATES,
    Job,
    JobStatus,
    ProfileState,
    WebhookStatus,
    Worker,
    iso,
    new_id,
)
from app.observability import record_job_finished
from app.transitions import move_job
from gpu_worker.protocol.bounds import finite_or_none
from gpu_worker.protocol.capabilities import Need
from gpu_worker.protocol.failure import CANCELLED

log = logging.getLogger(__name__)

DONE_CHANNEL = "murmur:job-done:"
ACTIVE_STATES = (JobStatus.DISPATCHED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True)
class JobRequest:
    owner: str
    source: str  # "upload" | "url"
    language: str | None = None
    prompt: str | None = None
    word_timestamps: bool = False
    webhook_url: str | None = None
    idempotency_key: str | None = None
    source_url: str | None = None
    filename: str | None = None
    request_hash: str | None = None  # app/jobs/idempotency.py; set with idempotency_key
    # What the job asks of a profile (app/jobs/routing.py), resolved at submission.
    task: str = "transcribe"
    model: str | None = None
    diarize: bool = False
    min_speakers: int | None = None
    max_speakers: int | None = None
    # Decoding options the worker applies (gpu_worker/protocol/claim.py).
    temperature: float | None = None
    vad_filter: bool = True

    def need(self) -> Need:
        return Need(
            language=self.language,
            task="translate" if self.task == "translate" else "transcribe",
            model=self.model,
            diarize=self.diarize,
        )


def job_json(job: Job, *, with_text: bool = True) -> dict[str, Any]:
    """A job as the API shows it; with `with_text`, a succeeded job's transcript text too
    when it was read (`get_job` reads it; listings leave it out)."""
    body: dict[str, Any] = {
        "id": job.id,
        "object": "transcription.job",
        "status": job.status,
        "profile": job.profile,
        "source": job.source,
        "filename": job.filename,
        "size_bytes": job.size_bytes,
        # A row stored before the wire types refused non-finite numbers reads as null, so
        # neither the API nor a webhook body ever holds NaN or Infinity.
        "duration_seconds": finite_or_none(job.duration_seconds),
        # The language asked for, else the one the worker detected (ISO 639-1).
        "language": job.language or job.detected_language,
        "language_probability": finite_or_none(job.language_probability),
        "task": job.task or "transcribe",
        "model": job.model,
        "diarize": bool(job.diarize),
        "min_speakers": job.min_speakers,
        "max_speakers": job.max_speakers,
        "word_timestamps": job.word_timestamps,
        "temperature": finite_or_none(job.temperature),
        "vad_filter": job.vad_filter is not False,
        "webhook_url": job.webhook_url,
        "webhook_status": job.webhook_status,
        "attempts": job.attempts,
        "created_at": iso(job.created_at),
        "dispatched_at": iso(job.dispatched_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "processing_seconds": finite_or_none(job.processing_seconds),
        "error": (
            {"code": job.error_code, "message": job.error_message} if job.error_code else None
        ),
        "links": {
            "self": f"/v1/jobs/{job.id}",
            "transcript": f"/v1/jobs/{job.id}/transcript",
        },
    }
    loaded = "transcript_text" not in inspect(job).unloaded
    succeeded = job.status == JobStatus.SUCCEEDED.value
    if with_text and loaded and succeeded and job.transcript_text is not None:
        body["text"] = job.transcript_text
    return body


def find_idempotent(db: Database, owner: str, key: str) -> Job | None:
    with db.reader() as s:
        return s.execute(
            select(Job)
            .where(Job.owner == owner, Job.idempotency_key == key)
            .options(undefer(Job.transcript_text))
        ).scalar_one_or_none()


def insert_job(
    db: Database,
    req: JobRequest,
    *,
    now: datetime,
    settings: Settings | None = None,
    spans: Sequence[Span] = (),
    **fields: Any,
) -> tuple[Job, bool]:
    """Commit a new job row; (job, created). An idempotency key already used returns that job.

    With `settings` and stored audio, the job is routed in the same transaction: it is written
    as `dispatched` to a profile whose idle worker may take it (`routable_profile`), and the
    caller sends the message
    (`app.jobs.dispatch.send_dispatched`). Otherwise it stays `queued` for the reconcile.
    With more than one of `spans`, the job's parts (app/jobs/parts.py) are written with it.
    """
    job = Job(
        id=new_id("job"),
        owner=req.owner,
        source=req.source,
        source_url=req.source_url,
        filename=req.filename,
        language=req.language,
        prompt=req.prompt,
        word_timestamps=req.word_timestamps,
        webhook_url=req.webhook_url,
        webhook_status=WebhookStatus.PENDING.value if req.webhook_url else None,
        task=None if req.task == "transcribe" else req.task,
        model=req.model,
        diarize=req.diarize,
        min_speakers=req.min_speakers,
        max_speakers=req.max_speakers,
        temperature=req.temperature,
        vad_filter=req.vad_filter,
        idempotency_key=req.idempotency_key,
        idempotency_hash=req.request_hash,
        status=JobStatus.QUEUED.value,
        created_at=now,
        **fields,
    )
    try:
        with db.session() as s:
            if settings is not None and job.audio_key is not None:
                profile = routable_profile(s, settings, now, req.owner, req.need())
                if profile is not None:
                    job.status = JobStatus.DISPATCHED.value
                    job.profile = profile
                    job.dispatched_at = now
            s.add(job)
            if len(spans) > 1:
                s.add_all(
                    parts.new_parts(
                        job.id, spans, JobStatus(job.status), now, diarize=bool(job.diarize)
                    )
                )
    except IntegrityError:
        if req.idempotency_key is None:
            raise
        existing = find_idempotent(db, req.owner, req.idempotency_key)
        if existing is None:
            raise
        return existing, False
    return job, True


def delete_unstarted_job(db: Database, job_id: str) -> None:
    """Remove a job refused before anything of it was stored (its idempotency key is freed)."""
    with db.session() as s:
        s.execute(
            delete(Job).where(
                Job.id == job_id,
                Job.status == JobStatus.QUEUED.value,
                Job.audio_key.is_(None),
            )
        )


def get_job(db: Database, job_id: str, owner: str | None = None) -> Job:
    """The job with its transcript's text, never the transcript itself."""
    with db.reader() as s:
        job = s.get(Job, job_id, options=[undefer(Job.transcript_text)])
        if (
            job is not None
            and job.transcript_text is None
            and job.status == JobStatus.SUCCEEDED.value
        ):
            # A row stored before the text had its own column: read it once from the transcript.
            old = s.execute(select(Job.transcript).where(Job.id == job_id)).scalar()
            if isinstance(old, dict):
                set_committed_value(job, "transcript_text", str(old.get("text", "")))
    if job is None or (owner is not None and job.owner != owner):
        raise Refused("job_not_found", f"no job with id {job_id}")
    return job


def get_transcript(db: Database, job_id: str) -> dict[str, Any] | None:
    """The stored transcript of a job (None until it succeeded): the one read of it."""
    with db.reader() as s:
        transcript = s.execute(select(Job.transcript).where(Job.id == job_id)).scalar()
    return transcript if isinstance(transcript, dict) else None


def routable_profile(
    session: Session, settings: Settings, now: datetime, owner: str, need: Need | None = None
) -> str | None:
    """The profile whose idle worker takes `owner`'s new job at once (only profiles that can
    serve it count: app/jobs/routing.py), or None: the job stays queued for the reconcile,
    whose planner dispatches fairly between tokens (app/fleet/dispatch_order.py).

    The fast path for the common case: a job submitted beside an idle worker runs without
    waiting for the reconcile. It never queues a job behind others, so it cannot bypass the
    planner's fairness: a profile takes the job only if one of its live workers (ready, or
    booting: it takes the job once ready) is free and not promised to a job already on its
    queue, and `owner` has no job of its own on that queue yet. One token submitting 1,000
    jobs puts one on the queue; the rest wait beside another token's jobs, and the planner
    takes them in turns. The walk, in allowlist order:
    - a profile that could get a worker (no back-off, no hold) takes the job if it may (above);
      else, if it has live workers or could get one, the walk stops: new work prefers it, so
      a later fallback's warm worker does not keep the job;
    - a back-off or a hold only stops new workers: such a profile takes the job if it may;
    - otherwise a profile backed off after a stock-out passes the job on to the next profile,
      while one held after another error keeps it queued: no fallback on errors an operator
      must fix.
    """
    facts = _routing_facts(session, now, owner)
    candidates = settings.enabled_profiles
    if need is not None:
        candidates = tuple(routing.serving(candidates, need))
    for profile in candidates:
        name = profile.name
        if facts.get((name, "idle"), 0) > facts.get((name, "queued"), 0) and not facts.get(
            (name, "mine"), 0
        ):
            return name
        backoff, held = (name, "backoff") in facts, (name, "held") in facts
        if not (backoff or held):
            if facts.get((name, "live"), 0) > 0 or profile.max_workers > 0:
                return None
            continue
        if held and profile.max_workers > 0:
            return None
    return None


def _routing_facts(session: Session, now: datetime, owner: str) -> dict[tuple[str, str], int]:
    """(profile, fact) -> count, in one round trip on the submission path: live workers, free
    ones, jobs dispatched and not yet claimed (in all, and `owner`'s), back-offs, holds."""
    dispatched = Job.status == JobStatus.DISPATCHED.value
    rows: Any = session.execute(
        union(
            select(Worker.profile, literal("live"), func.count())
            .where(Worker.state.in_(LIVE_WORKER_STATES))
            .group_by(Worker.profile),
            # Free: live (ready, or booting toward ready) and on no job.
            select(Worker.profile, literal("idle"), func.count())
            .where(Worker.state.in_(LIVE_WORKER_STATES), Worker.current_job_id.is_(None))
            .group_by(Worker.profile),
            select(Job.profile, literal("queued"), func.count())
            .where(dispatched, Job.profile.is_not(None))
            .group_by(Job.profile),
            select(Job.profile, literal("mine"), func.count())
            .where(dispatched, Job.profile.is_not(None), Job.owner == owner)
            .group_by(Job.profile),
            select(ProfileState.name, literal("backoff"), literal(1)).where(
                ProfileState.backoff_until > now
            ),
            select(ProfileState.name, literal("held"), literal(1)).where(
                ProfileState.retry_at > now
            ),
        )
    )
    return {(str(name), str(fact)): int(n) for name, fact, n in rows}


def try_dispatch_now(
    db: Database, settings: Settings, celery: Celery, job_id: str, *, now: datetime
) -> bool:
    """Dispatch a queued job at once if an idle worker may take it (`routable_profile`), else
    leave it to the reconcile."""
    with db.reader() as s:
        job = s.get(Job, job_id)
        if job is None:
            return False
        profile = routable_profile(s, settings, now, job.owner, routing.need_of(job))
    if profile is None:
        return False
    return dispatch_job(db, celery, job_id, profile, now=now)


def list_query(
    owner: str, status: str | None, limit: int, cursor: tuple[datetime, str] | None
) -> Select[Job]:
    """A page of the owner's jobs, newest first: read in the order of the index on
    (owner, [status,] created_at, id), so no page sorts, and none reads a transcript."""
    query = select(Job).where(Job.owner == owner)
    if status:
        query = query.where(Job.status == status)
    if cursor is not None:
        # A row comparison: the index seeks straight to the cursor, where an OR of the two
        # conditions would scan every newer row first.
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(*cursor))
    return query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)


def list_jobs(
    db: Database, owner: str, status: str | None, limit: int, cursor: tuple[datetime, str] | None
) -> list[Job]:
    with db.reader() as s:
        return list(s.execute(list_query(owner, status, limit, cursor)).scalars())


def _transition(
    db: Database, job_id: str, sources: tuple[str, ...], to: JobStatus, **values: Any
) -> bool:
    with db.session() as s:
        return move_job(s, job_id, sources, to, **values)


def _update_held_job(s: Session, job_id: str, holder: str, to: JobStatus, **values: Any) -> bool:
    """Move a running job on only while the worker `holder` holds it (compare-and-set)."""
    return move_job(s, job_id, [JobStatus.RUNNING], to, Job.worker_id == holder, **values)


def _finish(db: Database, job_id: str, worker_id: str, to: JobStatus, **values: Any) -> bool:
    """End a running job on behalf of the worker that holds it; anyone else's word is ignored."""
    with db.session() as s:
        return _update_held_job(s, job_id, worker_id, to, **values)


def cancel_job(
    db: Database, job_id: str, owner: str, *, now: datetime, by: str = "the client"
) -> Job:
    """Cancel the owner's job unless it has finished (`job_finished`); `by` names who did."""
    job = get_job(db, job_id, owner)
    cancellable = (JobStatus.QUEUED.value, *ACTIVE_STATES)
    done = _transition(
        db,
        job_id,
        cancellable,
        JobStatus.CANCELLED,
        finished_at=now,
        error_code=CANCELLED,
        error_message=f"cancelled by {by}",
    )
    if not done:
        job = get_job(db, job_id, owner)
        raise Refused("job_finished", f"job {job_id} has already finished with status {job.status}")
    parts.cancel(db, job_id, now)  # every part's worker hears it at its next status check
    return get_job(db, job_id, owner)


@dataclass(frozen=True)
class Claim:
    """The outcome of a claim: the job handed over, or why not (and whether it just failed)."""

    job: Job | None
    failed: Job | None = None  # set when this claim gave up on the job (too many attempts)


def _holder_is_on_it(session: Session, job: Job) -> bool:
    """Whether the worker recorded on a running job is live and still working on it."""
    if job.worker_id is None:
        return False
    holder = session.get(Worker, job.worker_id)
    return (
        holder is not None
        and holder.state in LIVE_WORKER_STATES
        and holder.current_job_id == job.id
    )


def claim_job(
    db: Database, job_id: str, worker: WorkerCaller, max_attempts: int, *, now: datetime
) -> Claim:
    """Hand the job to this worker if it is still meant for the worker's profile.

    A `dispatched` job is claimable. A `running` one only by the worker that holds it (a
    redelivery to the same worker) or when its holder is gone or has let it go (a worker that
    died or handed it back while draining); never from a live worker still running it, so one
    job is transcribed by one worker at a time. After `max_attempts` starts the job fails
    instead of looping forever.
    """
    with db.session() as s:
        job = s.get(Job, job_id)
        if job is None or job.status not in ACTIVE_STATES or job.profile != worker.profile:
            return Claim(None)
        if (
            job.status == JobStatus.RUNNING.value
            and job.worker_id != worker.id
            and _holder_is_on_it(s, job)
        ):
            return Claim(None)
        if job.attempts >= max_attempts:
            failed = move_job(
                s,
                job_id,
                ACTIVE_STATES,
                JobStatus.FAILED,
                finished_at=now,
                error_code="too_many_attempts",
                error_message=f"the job was started {job.attempts} times without finishing",
            )
            return Claim(None, failed=job if failed else None)
        moved = move_job(
            s,
            job_id,
            ACTIVE_STATES,
            JobStatus.RUNNING,
            Job.attempts == job.attempts,
            worker_id=worker.id,
            started_at=now,
            attempts=job.attempts + 1,
        )
        if not moved:
            return Claim(None)
        s.execute(
            update(Worker)
            .where(Worker.id == worker.id)
            .values(
                current_job_id=job_id,
                idle_since=None,
                last_seen_at=now,
                first_job_at=worker.first_job_at or now,
            )
        )
    return Claim(get_job(db, job_id))


def record_heartbeat(db: Database, worker_id: str, *, now: datetime) -> None:
    """The worker was heard from: the fleet deletes workers that miss three reports in a row."""
    with db.session() as s:
        s.execute(update(Worker).where(Worker.id == worker_id).values(last_seen_at=now))


def job_held_by(db: Database, job_id: str, worker_id: str) -> bool:
    """Whether the job is still running on this worker; a worker that hears no stops at once."""
    with db.reader() as s:
        job = s.get(Job, job_id)
    return job is not None and job.status == JobStatus.RUNNING.value and job.worker_id == worker_id


def release_job(db: Database, job_id: str, worker_id: str, *, now: datetime) -> bool:
    """A draining worker hands a running job back: it becomes claimable by the next worker."""
    with db.session() as s:
        moved = _update_held_job(s, job_id, worker_id, JobStatus.DISPATCHED, worker_id=None)
        s.execute(
            update(Worker)
            .where(Worker.id == worker_id, Worker.current_job_id == job_id)
            .values(current_job_id=None, idle_since=now)
        )
    return bool(moved)


def _release_worker(
    db: Database, worker_id: str, job_id: str, *, counted: bool, now: datetime
) -> None:
    """The worker is done with the job (it says so): free it; count the job only if `counted`.

    A refused word (the job was cancelled, re-routed or already finished) still frees the
    worker, but did nothing, so it must not grow `jobs_done`.
    """
    with db.session() as s:
        worker = s.get(Worker, worker_id)
        if worker is None:
            return
        if worker.current_job_id == job_id:
            worker.current_job_id = None
            worker.idle_since = now
        if counted:
            worker.jobs_done = (worker.jobs_done or 0) + 1
        worker.last_seen_at = now


def store_result(
    db: Database,
    job_id: str,
    worker_id: str,
    transcript: dict[str, Any],
    seconds: float,
    *,
    now: datetime,
) -> bool:
    """Store the transcript once; False when the job had already finished (or was cancelled)."""
    stored = _finish(
        db,
        job_id,
        worker_id,
        JobStatus.SUCCEEDED,
        transcript=transcript,
        transcript_text=str(transcript.get("text", "")),
        # What the worker found (detected, or the language it was given): json answers it.
        detected_language=transcript.get("language") or None,
        language_probability=transcript.get("language_probability"),
        processing_seconds=seconds,
        finished_at=now,
        error_code=None,
        error_message=None,
    )
    _release_worker(db, worker_id, job_id, counted=stored, now=now)
    return stored


def store_failure(
    db: Database, job_id: str, worker_id: str, code: str, message: str, *, now: datetime
) -> bool:
    stored = _finish(
        db,
        job_id,
        worker_id,
        JobStatus.FAILED,
        finished_at=now,
        error_code=code,
        error_message=message,
    )
    _release_worker(db, worker_id, job_id, counted=stored, now=now)
    return stored


def fail_job(db: Database, job_id: str, code: str, message: str, *, now: datetime) -> bool:
    """Fail a job the control plane itself gave up on (URL fetch failed, no profile left...)."""
    return _transition(
        db,
        job_id,
        (JobStatus.QUEUED.value, *ACTIVE_STATES),
        JobStatus.FAILED,
        finished_at=now,
        error_code=code,
        error_message=message,
    )


def fail_fetch(db: Database, job_id: str, code: str, message: str, *, now: datetime) -> bool:
    """Fail a URL job whose fetch went wrong, only while it still waits for its audio: a second
    fetch of the same job (a re-sent message) never fails one the first already stored."""
    with db.session() as s:
        return move_job(
            s,
            job_id,
            [JobStatus.QUEUED],
            JobStatus.FAILED,
            Job.audio_key.is_(None),
            finished_at=now,
            error_code=code,
            error_message=message,
        )


def announce_started(r: redis.Redis, job: Job) -> None:
    """Wake the job's event streams (a worker claimed it); may not fail the caller."""
    try:
        progress.mark_status(r, job.id, ended=False)
    except redis.RedisError as exc:
        log.warning("could not mark the start of %s: %s", job.id, type(exc).__name__)


def announce_finished(r: redis.Redis, celery: Celery, job: Job) -> None:
    """Wake synchronous waiters and event streams (whose live view then expires) and queue the
    webhook; none of it may fail the caller."""
    record_job_finished(r, job)  # latency histograms; never raises
    try:
        r.publish(DONE_CHANNEL + job.id, job.status)
        progress.mark_status(r, job.id, ended=True)
    except redis.RedisError as exc:
        log.warning("could not publish completion of %s: %s", job.id, type(exc).__name__)
    if job.webhook_url:
        try:
            DELIVER_WEBHOOK.send(celery, job.id)
        except Exception as exc:
            log.warning("could not queue webhook for %s: %s", job.id, type(exc).__name__)


def wait_until_finished(
    db: Database, r: redis.Redis, job_id: str, timeout: float, poll_seconds: float = 1.0
) -> Job:
    """Block until the job finishes or `timeout` seconds of real time pass; returns the job as
    last read. A wait is measured on the monotonic clock, not `Services.clock`: it blocks a
    request for real."""
    deadline = time.monotonic() + timeout
    pubsub = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    try:
        pubsub.subscribe(DONE_CHANNEL + job_id)
        while True:
            job = get_job(db, job_id)
            if job.status in FINISHED_STATES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                return job
            pubsub.get_message(timeout=min(poll_seconds, left))
    finally:
        pubsub.close()


def cursor_encode(job: Job) -> str:
    created = as_utc(job.created_at)
    raw = json.dumps([created.isoformat() if created else "", job.id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_decode(value: str) -> tuple[datetime, str]:
    try:
        padded = value + "=" * (-len(value) % 4)
        created, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        parsed = as_utc(datetime.fromisoformat(created))
        assert parsed is not None
        # Checked here, not by assert: the id reaches SQL, and PostgreSQL refuses a NUL.
        if not isinstance(job_id, str) or text_problem(job_id) is not None:
            raise ValueError("not a job id")
        return parsed, job_id
    except (ValueError, TypeError, AssertionError, RecursionError) as exc:
        raise Refused("invalid_cursor", "cursor is not one this API returned") from exc
