"""The parts of a long job: created with it, claimed, retried, finished and stitched, each a row.

A job cut at pauses (app/jobs/cuts.py) has one `JobPart` row per span; each part is a message
of its own on the job's profile queue whose argument is the part's id, `<job id>.<index>`, so a
worker runs it through the same claim, status, result, failure and release routes as a job
(app/internal.py answers a part id on each). The job's row stays the record: it is `running`
from the first part's claim, holds no worker of its own, and succeeds once, when the last part's
result is stored, with the parts' transcripts stitched (app/jobs/stitch.py).

Invariants:
- Every part change is a compare-and-set (`app.transitions.move_part`): a part runs on one
  worker at a time, its result is stored once (a redelivered result is `stored: false`), and
  the stitch runs on the stored results only, so a part heard twice is never text twice.
- A part is claimable only while its job is active (dispatched or running) on the claiming
  worker's profile, and only by a worker that lists the `parts` claim feature
  (gpu_worker/protocol/claim.py); a part's holder knows it holds it only while its job is
  active, so a cancelled job frees every part's worker at its next status check.
- A part's failure retries that part (back to `dispatched`, a new message), not the job,
  until the part has been claimed `fleet.max_attempts` times; a failure caused by the audio
  itself (`CLIENT_FAILURES`) fails the job at once, as the whole job would have.
- The job succeeds exactly once: the part whose result completes the set moves the job
  `running -> succeeded` by compare-and-set; two last parts finishing together both try, one
  moves it.
- A part's transcript is kept only while its job runs: the job's end (stitched, failed or
  cancelled) clears every part's, and purging the job deletes its parts.
- A diarized job has one more part, of kind `speakers` (index: the transcription parts'
  count), spanning the whole file: its worker diarizes, the others transcribe without
  speakers, and the stitch assigns the joined words to its turns (app/jobs/stitch.py), so the
  job has one set of labels. It is sent first (it is the longest), claimed only by a worker
  that lists `SPEAKER_PARTS`, and counts towards `summary` like any part but not towards
  progress (its audio is the transcription parts').
- Live segments (`ready_segments`): the stitch of the job's first parts, as far as every part
  before is in, is exactly the start of its final stitch, so those segments are streamed as
  they become final, in order, never revised (a diarized job's wait for its speakers: none).
- Progress hook (for the streaming side, app/jobs/progress.py): a part's transcript covers
  [start_seconds, end_seconds) of the job's `duration_seconds`, with times of the whole file;
  `summary` counts parts done and running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, undefer

from app.db import Database
from app.jobs.cuts import Span
from app.jobs.stitch import PartTranscript, stitch, with_speakers
from app.models import (
    LIVE_WORKER_STATES,
    Job,
    JobPart,
    JobStatus,
    PartStatus,
    Worker,
)
from app.transitions import move_job, move_part
from gpu_worker.protocol.claim import PARTS, SPEAKER_PARTS, SPEAKERS_PART, TRANSCRIBE_PART
from gpu_worker.protocol.failure import CANCELLED, CLIENT_FAILURES

SEPARATOR = "."
# A speakers part's work against transcribing the same audio, for the planner: WhisperX's
# diarizer took 2 min 53 s where its batched ASR took 8 min 10 s on the same GPU and data
# (docs/fleet.md, "Long files"; on the CPU it is 3.7 times, docs/performance.md).
SPEAKERS_WORK_SHARE = 0.35
ACTIVE_JOB = (JobStatus.DISPATCHED.value, JobStatus.RUNNING.value)
_P = PartStatus
UNFINISHED = (_P.QUEUED.value, _P.DISPATCHED.value, _P.RUNNING.value)


def part_id(job_id: str, index: int) -> str:
    return f"{job_id}{SEPARATOR}{index}"


def job_of(message_id: str) -> str:
    """The job a message's id names: the id itself, or a part's job."""
    return message_id.split(SEPARATOR, 1)[0]


def is_part(message_id: str) -> bool:
    return SEPARATOR in message_id


def new_parts(
    job_id: str, spans: Sequence[Span], status: JobStatus, now: datetime, *, diarize: bool
) -> list[JobPart]:
    """The rows of a job's parts, in the state their job starts in (queued or dispatched): one
    per span, and for a diarized job its speakers part over the whole file."""
    dispatched = status == JobStatus.DISPATCHED
    cut = [(span, TRANSCRIBE_PART) for span in spans]
    if diarize and spans:
        cut.append((Span(len(spans), 0.0, max(span.end for span in spans)), SPEAKERS_PART))
    return [
        JobPart(
            id=part_id(job_id, span.index),
            job_id=job_id,
            index=span.index,
            kind=kind,
            start_seconds=span.start,
            end_seconds=span.end,
            status=(_P.DISPATCHED if dispatched else _P.QUEUED).value,
            attempts=0,
            created_at=now,
            dispatched_at=now if dispatched else None,
        )
        for span, kind in cut
    ]


def summary(db: Database, job_id: str) -> dict[str, int] | None:
    """`{count, done, running}` of the job's parts; None for a job that was not cut."""
    with db.reader() as s:
        rows = s.execute(
            select(JobPart.status, func.count())
            .where(JobPart.job_id == job_id)
            .group_by(JobPart.status)
        ).all()
    counts = {str(status): int(n) for status, n in rows}
    if not counts:
        return None
    return {
        "count": sum(counts.values()),
        "done": counts.get(_P.SUCCEEDED.value, 0),
        "running": counts.get(_P.RUNNING.value, 0),
    }


def to_send(db: Database, job_id: str, now: datetime) -> list[str] | None:
    """Mark the job's waiting parts dispatched; the ids to send (None: the job has no parts).

    A part already running keeps its worker; a finished one is never sent again."""
    with db.session() as s:
        rows = s.execute(
            select(JobPart.id, JobPart.status, JobPart.kind)
            .where(JobPart.job_id == job_id)
            .order_by(JobPart.index)
        ).all()
        if not rows:
            return None
        ids = []
        # The speakers part first: it spans the whole file, so it ends last if it starts last.
        for pid, status, _ in sorted(rows, key=lambda row: row.kind != SPEAKERS_PART):
            if status == _P.QUEUED.value:
                move_part(s, pid, [_P.QUEUED], _P.DISPATCHED, dispatched_at=now)
                ids.append(pid)
            elif status == _P.DISPATCHED.value:
                ids.append(pid)
    return ids


def requeue(s: Session, job_id: str) -> None:
    """The job goes back to the queue (re-routed, or its send failed): so do its unfinished
    parts, whose workers hear at their next check that they no longer hold them."""
    s.execute(
        update(JobPart)
        .where(JobPart.job_id == job_id, JobPart.status.in_(UNFINISHED))
        .values(status=_P.QUEUED.value, worker_id=None, dispatched_at=None)
    )


def cancel(db: Database, job_id: str, now: datetime) -> None:
    """The job was cancelled: so is every unfinished part (none is claimed again)."""
    with db.session() as s:
        s.execute(
            update(JobPart)
            .where(JobPart.job_id == job_id, JobPart.status.in_(UNFINISHED))
            .values(status=_P.CANCELLED.value, finished_at=now)
        )
        _forget_transcripts(s, job_id)


@dataclass(frozen=True)
class PartClaim:
    """A claim's outcome: the part and its job handed over, or why not."""

    part: JobPart | None = None
    job: Job | None = None
    failed: Job | None = None  # set when this claim gave up on the job (too many attempts)


def _serves(worker: Worker | None, part: JobPart) -> bool:
    """Whether the worker says it runs parts of this kind (its readiness `features`)."""
    features = (worker.runtime or {}).get("features") if worker is not None else None
    needed = (PARTS, SPEAKER_PARTS) if part.kind == SPEAKERS_PART else (PARTS,)
    return isinstance(features, list) and all(feature in features for feature in needed)


def _holder_is_on_it(s: Session, part: JobPart) -> bool:
    holder = s.get(Worker, part.worker_id) if part.worker_id else None
    return (
        holder is not None
        and holder.state in LIVE_WORKER_STATES
        and holder.current_job_id == part.id
    )


def claim(
    db: Database, pid: str, worker_id: str, profile: str, max_attempts: int, *, now: datetime
) -> PartClaim:
    """Hand the part to this worker if its job still wants it on the worker's profile (the
    rules of `app.jobs.service.claim_job`, per part)."""
    with db.session() as s:
        part = s.get(JobPart, pid)
        job = s.get(Job, part.job_id) if part is not None else None
        me = s.get(Worker, worker_id)
        if part is None or job is None or job.status not in ACTIVE_JOB or job.profile != profile:
            return PartClaim()
        if part.status not in (_P.DISPATCHED.value, _P.RUNNING.value) or not _serves(me, part):
            return PartClaim()
        if (
            part.status == _P.RUNNING.value
            and part.worker_id != worker_id
            and _holder_is_on_it(s, part)
        ):
            return PartClaim()
        if part.attempts >= max_attempts:
            message = f"part {part.index} was started {part.attempts} times without finishing"
            failed = _fail(s, part, job, "too_many_attempts", message, now)
            return PartClaim(failed=job if failed else None)
        moved = move_part(
            s,
            pid,
            [part.status],
            _P.RUNNING,
            JobPart.attempts == part.attempts,
            worker_id=worker_id,
            started_at=now,
            attempts=part.attempts + 1,
        )
        if not moved:
            return PartClaim()
        move_job(s, job.id, [JobStatus.DISPATCHED], JobStatus.RUNNING, started_at=now)
        s.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(
                current_job_id=pid,
                idle_since=None,
                last_seen_at=now,
                first_job_at=func.coalesce(Worker.first_job_at, now),
            )
        )
    with db.reader() as s:
        return PartClaim(part=s.get(JobPart, pid), job=s.get(Job, job.id))


def holding(db: Database, pid: str, worker_id: str) -> tuple[JobPart, Job] | None:
    """The part and its job while the part is still running on this worker, its job still
    active; else None."""
    with db.reader() as s:
        part = s.get(JobPart, pid)
        job = s.get(Job, part.job_id) if part is not None else None
    if (
        part is None
        or job is None
        or job.status not in ACTIVE_JOB
        or part.status != _P.RUNNING.value
        or part.worker_id != worker_id
    ):
        return None
    return part, job


def held_by(db: Database, pid: str, worker_id: str) -> bool:
    """Whether the part is still running on this worker, its job still active."""
    return holding(db, pid, worker_id) is not None


def _free(s: Session, worker_id: str, pid: str, *, counted: bool, now: datetime) -> None:
    """The worker is done with the part (it says so): free it; count it only if `counted`."""
    worker = s.get(Worker, worker_id)
    if worker is None:
        return
    if worker.current_job_id == pid:
        worker.current_job_id = None
        worker.idle_since = now
    if counted:
        worker.jobs_done = (worker.jobs_done or 0) + 1
    worker.last_seen_at = now


def release(db: Database, pid: str, worker_id: str, *, now: datetime) -> bool:
    """A draining worker hands its part back: the next worker may claim it at once."""
    with db.session() as s:
        moved = move_part(
            s, pid, [_P.RUNNING], _P.DISPATCHED, JobPart.worker_id == worker_id, worker_id=None
        )
        _free(s, worker_id, pid, counted=False, now=now)
    return moved


def _fail(s: Session, part: JobPart, job: Job, code: str, message: str, now: datetime) -> bool:
    """Fail the part and its job (with the part's reason); whether the job moved."""
    move_part(
        s, part.id, [_P.DISPATCHED, _P.RUNNING], _P.FAILED,
        finished_at=now, error_code=code, error_message=message,
    )  # fmt: skip
    moved = move_job(
        s, job.id, ACTIVE_JOB, JobStatus.FAILED,
        finished_at=now, error_code=code, error_message=f"part {part.index}: {message}"[:2000],
    )  # fmt: skip
    if moved:
        s.execute(
            update(JobPart)
            .where(JobPart.job_id == job.id, JobPart.status.in_(UNFINISHED))
            .values(status=_P.CANCELLED.value, finished_at=now)
        )
        _forget_transcripts(s, job.id)
    return moved


@dataclass(frozen=True)
class PartFailure:
    """What a worker's failure report did: stored, the part to send again, the job failed."""

    stored: bool
    retry: str | None = None
    job_failed: bool = False


def store_failure(
    db: Database,
    pid: str,
    worker_id: str,
    code: str,
    message: str,
    max_attempts: int,
    *,
    now: datetime,
) -> PartFailure:
    """Record a part's failure from its holder: retry the part, or fail the job (invariants)."""
    with db.session() as s:
        part = s.get(JobPart, pid)
        job = s.get(Job, part.job_id) if part is not None else None
        held = (
            part is not None and job is not None and part.status == _P.RUNNING.value
            and part.worker_id == worker_id and job.status in ACTIVE_JOB
        )  # fmt: skip
        _free(s, worker_id, pid, counted=False, now=now)
        if not held or code == CANCELLED or part is None or job is None:
            return PartFailure(stored=False)
        if code in CLIENT_FAILURES or part.attempts >= max_attempts:
            return PartFailure(stored=True, job_failed=_fail(s, part, job, code, message, now))
        retried = move_part(
            s, pid, [_P.RUNNING], _P.DISPATCHED, JobPart.worker_id == worker_id,
            worker_id=None, dispatched_at=now, error_code=code, error_message=message,
        )  # fmt: skip
    return PartFailure(stored=retried, retry=pid if retried else None)


@dataclass(frozen=True)
class PartResult:
    """What a worker's result did: stored (first time), and whether it finished the job."""

    stored: bool
    job_succeeded: bool = False


def store_result(
    db: Database,
    pid: str,
    worker_id: str,
    transcript: dict[str, Any],
    seconds: float,
    *,
    now: datetime,
) -> PartResult:
    """Store a part's transcript once; when it completes the set, stitch and finish the job."""
    with db.session() as s:
        part = s.get(JobPart, pid)
        job = s.get(Job, part.job_id) if part is not None else None
        active = job is not None and job.status in ACTIVE_JOB
        stored = active and move_part(
            s, pid, [_P.RUNNING], _P.SUCCEEDED, JobPart.worker_id == worker_id,
            transcript=transcript, processing_seconds=seconds, finished_at=now,
        )  # fmt: skip
        _free(s, worker_id, pid, counted=stored, now=now)
    if not stored or part is None:
        return PartResult(stored=False)
    return PartResult(stored=True, job_succeeded=finish(db, part.job_id, now=now))


def finish(db: Database, job_id: str, *, now: datetime) -> bool:
    """Stitch the parts and succeed the job if every part is in; whether this call did."""
    with db.reader() as s:
        job = s.get(Job, job_id)
        parts = list(
            s.execute(
                select(JobPart)
                .where(JobPart.job_id == job_id)
                .order_by(JobPart.index)
                .options(undefer(JobPart.transcript))
            ).scalars()
        )
    if job is None or not parts or any(p.status != _P.SUCCEEDED.value for p in parts):
        return False
    spans = [p for p in parts if p.kind != SPEAKERS_PART]
    duration = job.duration_seconds or spans[-1].end_seconds
    stitched = stitch(
        [
            PartTranscript(Span(p.index, p.start_seconds, p.end_seconds), p.transcript or {})
            for p in spans
        ],
        duration,
        job.language,
    )
    for speakers in (p for p in parts if p.kind == SPEAKERS_PART):
        stitched = with_speakers(stitched, (speakers.transcript or {}).get("turns") or [])
    with db.session() as s:
        moved = move_job(
            s, job_id, [JobStatus.RUNNING], JobStatus.SUCCEEDED,
            transcript=stitched,
            transcript_text=str(stitched.get("text", "")),
            detected_language=stitched.get("language") or None,
            language_probability=stitched.get("language_probability"),
            processing_seconds=sum(p.processing_seconds or 0.0 for p in parts),
            finished_at=now, error_code=None, error_message=None,
        )  # fmt: skip
        if moved:
            _forget_transcripts(s, job_id)
    return moved


def ready_segments(db: Database, job_id: str) -> list[dict[str, Any]]:
    """The job's segments that no later part can change: the stitch of its transcription parts
    from the first up to the first one not in yet (all of them once the job succeeded); none
    for a diarized job (its speakers come last) or one that ended otherwise."""
    with db.reader() as s:
        job = s.get(Job, job_id, options=[undefer(Job.transcript)])
        if job is None or job.diarize:
            return []
        if job.status == JobStatus.SUCCEEDED.value:
            return list((job.transcript or {}).get("segments") or [])
        if job.status not in ACTIVE_JOB:
            return []
        rows = list(
            s.execute(
                select(JobPart)
                .where(JobPart.job_id == job_id, JobPart.kind != SPEAKERS_PART)
                .order_by(JobPart.index)
                .options(undefer(JobPart.transcript))
            ).scalars()
        )
    first: list[JobPart] = []
    for part in rows:
        if part.status != _P.SUCCEEDED.value or part.transcript is None:
            break
        first.append(part)
    if not first:
        return []
    spans = [PartTranscript(Span(p.index, p.start_seconds, p.end_seconds), p.transcript or {})
             for p in first]  # fmt: skip
    duration = job.duration_seconds or rows[-1].end_seconds
    whole = stitch(spans, duration, job.language, complete=len(first) == len(rows))
    return list(whole["segments"])


def _forget_transcripts(s: Session, job_id: str) -> None:
    """The job has ended: its parts' transcripts (stitched into the job's, or of a job that
    failed or was cancelled) are not kept beside it."""
    s.execute(update(JobPart).where(JobPart.job_id == job_id).values(transcript=None))


def held_parts(db: Database, worker_id: str, *, now: datetime) -> list[str]:
    """A dead worker's running parts go back to `dispatched`; their ids, to send again."""
    with db.session() as s:
        ids = list(
            s.execute(
                select(JobPart.id).where(
                    JobPart.worker_id == worker_id, JobPart.status == _P.RUNNING.value
                )
            ).scalars()
        )
        return [
            pid
            for pid in ids
            if move_part(
                s,
                pid,
                [_P.RUNNING],
                _P.DISPATCHED,
                JobPart.worker_id == worker_id,
                worker_id=None,
                dispatched_at=now,
            )  # fmt: skip
        ]
