"""The workers' side door: readiness, claims, signed audio downloads, results and failures.

Workers authenticate with their instance credential (see app.auth.authenticate_worker); the
audio route needs no credential but a signed, expiring URL issued by a successful claim, and
serves only while that claim holds the job: same worker, same attempt, job still running.
The routes are the protocol's templates (gpu_worker/protocol/routes.py) and the bodies are
parsed with the protocol's models, the ones the worker builds them with; a body that does not
parse is `400 invalid_body` naming the first field at fault.

A job route's id may name a part of a long job (`<job id>.<index>`, app/jobs/parts.py): the
claim, status, release, result and failure of a part go to the part's own rules, and what a
part's word finishes (the job stitched and succeeded, or failed) is announced for the job.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request, send_file
from pydantic import BaseModel, ValidationError, field_validator

from app.auth import WorkerCaller, authenticate_worker
from app.context import services
from app.errors import ApiError
from app.fleet import readiness
from app.inputs import MAX_JSON_BYTES, json_problem, read_body, refuse_duplicate_keys
from app.jobs import handover, parts, progress_intake, service
from app.jobs.dispatch import send_parts
from gpu_worker.protocol import routes
from gpu_worker.protocol.boot import BootFailure
from gpu_worker.protocol.failure import Failure
from gpu_worker.protocol.progress import MAX_PROGRESS_BYTES, ProgressBody
from gpu_worker.protocol.readiness import ReadyBody
from gpu_worker.protocol.redaction import redact
from gpu_worker.protocol.transcript import ResultBody

internal_bp = Blueprint("internal", __name__, url_prefix=routes.INTERNAL_PREFIX)

# A transcript of hours of audio with words is a few MB; nothing a worker sends is larger.
MAX_RESULT_BYTES = 32 * 1024 * 1024
# A boot failure is a stage and a few hundred characters.
MAX_BOOT_FAILURE_BYTES = 4096


class _Ready(ReadyBody):
    """The protocol's body, and what this side can store of it.

    `runtime` is typed afterwards by the protocol's model (readiness.read_runtime): a runtime
    of the wrong shape is the worker's mismatch (409, the worker failed with why), not a bad
    body; one this side could not store is.
    """

    @field_validator("runtime")
    @classmethod
    def _storable(cls, runtime: dict[str, Any]) -> dict[str, Any]:
        # What is stored (its unknown fields included) stays within the limits of any JSON
        # we keep: no NUL or lone surrogate, finite numbers, at most 4 levels deep.
        problem = json_problem(runtime, max_depth=4)
        if problem is not None:
            raise ValueError(problem)
        return runtime


def _body(model: type[BaseModel], limit: int = MAX_JSON_BYTES) -> Any:
    # Only a result (a whole transcript) may be large; every other report is small.
    raw = read_body(limit)
    refuse_duplicate_keys(raw)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiError(400, "invalid_body", f"{where}: {first['msg']}") from None


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.READY))
def worker_ready(worker_id: str, instance_id: str) -> Response:
    worker = authenticate_worker(worker_id, instance_id)
    body: _Ready = _body(_Ready)
    svc = services()
    readiness.report_ready(svc.db, svc.settings, worker.id, body.runtime, svc.clock())
    return jsonify({"accepted": True})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.BOOT_FAILURE))
def boot_failure(worker_id: str, instance_id: str) -> Response:
    """The instance's boot path says its worker cannot come up (gpu_worker/protocol/boot.py).

    Bound to the instance like every worker call; a worker no longer live may still call (its
    unit reports every stop) and is answered `{"accepted": false}`: nothing changes."""
    worker = authenticate_worker(worker_id, instance_id, live_only=False)
    body: BootFailure = _body(BootFailure, MAX_BOOT_FAILURE_BYTES)
    svc = services()
    accepted = readiness.report_boot_failure(svc.db, worker.id, body, svc.clock())
    return jsonify({"accepted": accepted})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.CLAIM))
def claim(worker_id: str, instance_id: str, job_id: str) -> Response:
    worker = authenticate_worker(worker_id, instance_id)
    svc = services()
    if parts.is_part(job_id):
        return _claim_part(worker, job_id)
    claim = service.claim_job(
        svc.db, job_id, worker, svc.settings.fleet.max_attempts, now=svc.clock()
    )
    if claim.failed is not None:
        service.announce_finished(svc.redis, svc.celery, service.get_job(svc.db, job_id))
    job = claim.job
    if job is None:
        raise ApiError(409, "job_not_claimable", f"job {job_id} is not waiting for this worker")
    claimed = handover.handed_over(svc.settings, svc.storage, job, svc.clock())
    service.announce_started(svc.redis, job)
    return jsonify({"job": claimed.model_dump()})


def _claim_part(worker: WorkerCaller, part_id: str) -> Response:
    svc = services()
    max_attempts = svc.settings.fleet.max_attempts
    claim = parts.claim(svc.db, part_id, worker.id, worker.profile, max_attempts, now=svc.clock())
    if claim.failed is not None:
        _announce(claim.failed.id)
    if claim.part is None or claim.job is None:
        raise ApiError(409, "job_not_claimable", f"job {part_id} is not waiting for this worker")
    count = (parts.summary(svc.db, claim.job.id) or {}).get("count", 1)
    claimed = handover.handed_over_part(
        svc.settings, svc.storage, claim.job, claim.part, count, svc.clock()
    )
    service.announce_started(svc.redis, claim.job)
    return jsonify({"job": claimed.model_dump()})


def _announce(job_id: str) -> None:
    """A job finished: wake its waiters and event streams, queue its webhook."""
    svc = services()
    service.announce_finished(svc.redis, svc.celery, service.get_job(svc.db, job_id))


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.RELEASE))
def release(worker_id: str, instance_id: str, job_id: str) -> Response:
    """A draining worker gives a job back before it stops; the next worker may claim it."""
    worker = authenticate_worker(worker_id, instance_id)
    svc = services()
    if parts.is_part(job_id):
        return jsonify({"released": parts.release(svc.db, job_id, worker.id, now=svc.clock())})
    return jsonify({"released": service.release_job(svc.db, job_id, worker.id, now=svc.clock())})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.STATUS))
def job_status(worker_id: str, instance_id: str, job_id: str) -> Response:
    """Polled by a busy worker every few seconds: once it no longer holds the job (cancelled,
    re-routed, finished elsewhere) it stops transcribing and frees itself."""
    worker = authenticate_worker(worker_id, instance_id)
    if parts.is_part(job_id):
        return jsonify({"held": parts.held_by(services().db, job_id, worker.id)})
    return jsonify({"held": service.job_held_by(services().db, job_id, worker.id)})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.HEARTBEAT))
def heartbeat(worker_id: str, instance_id: str) -> Response:
    """Liveness without usage reports: the fleet deletes workers that miss three in a row."""
    worker = authenticate_worker(worker_id, instance_id)
    svc = services()
    service.record_heartbeat(svc.db, worker.id, now=svc.clock())
    return jsonify({"ok": True})


@internal_bp.get(routes.flask_rule(routes.AUDIO))
def audio(job_id: str) -> Response:
    """The audio of a running job, to the holder of its claim's signed URL (no credential)."""
    svc = services()
    key = handover.claimed_audio(svc.db, svc.settings, job_id, request.args, svc.clock())
    return send_file(svc.storage.open(key), mimetype="application/octet-stream")


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.RESULT))
def result(worker_id: str, instance_id: str, job_id: str) -> Response:
    worker = authenticate_worker(worker_id, instance_id)
    body: ResultBody = _body(ResultBody, MAX_RESULT_BYTES)
    svc = services()
    transcript = body.transcript.model_dump(exclude_none=True)
    if parts.is_part(job_id):
        done = parts.store_result(
            svc.db, job_id, worker.id, transcript, body.processing_seconds, now=svc.clock()
        )
        if done.stored:
            progress_intake.part_finished(svc.db, svc.redis, job_id)
        if done.job_succeeded:
            _announce(parts.job_of(job_id))
        return jsonify({"stored": done.stored})
    stored = service.store_result(
        svc.db, job_id, worker.id, transcript, body.processing_seconds, now=svc.clock()
    )
    if stored:
        service.announce_finished(svc.redis, svc.celery, service.get_job(svc.db, job_id))
    return jsonify({"stored": stored})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.PROGRESS))
def job_progress(worker_id: str, instance_id: str, job_id: str) -> Response:
    """Hot progress at the worker's per-segment checkpoint, kept in Redis (app/jobs/progress.py);
    `accepted` is false once the worker no longer holds the job (it stops reporting)."""
    worker = authenticate_worker(worker_id, instance_id)
    body: ProgressBody = _body(ProgressBody, MAX_PROGRESS_BYTES)
    svc = services()
    accepted = progress_intake.accept(svc.db, svc.redis, job_id, worker.id, body)
    return jsonify({"accepted": accepted})


@internal_bp.post(routes.flask_rule(routes.WORKER_PREFIX, routes.FAILURE))
def failure(worker_id: str, instance_id: str, job_id: str) -> Response:
    worker = authenticate_worker(worker_id, instance_id)
    body: Failure = _body(Failure)
    svc = services()
    # Worker-supplied text, stored and shown to the job's owner: redacted on this side too
    # (gpu_worker/protocol/redaction.py), so an old or buggy worker cannot store a secret.
    message = redact(body.message)
    if parts.is_part(job_id):
        return _part_failure(worker, job_id, body.code, message)
    stored = service.store_failure(svc.db, job_id, worker.id, body.code, message, now=svc.clock())
    if stored:
        service.announce_finished(svc.redis, svc.celery, service.get_job(svc.db, job_id))
    return jsonify({"stored": stored})


def _part_failure(worker: WorkerCaller, part_id: str, code: str, message: str) -> Response:
    """A part failed: sent again (a retry of that part alone), or its job failed."""
    svc = services()
    max_attempts = svc.settings.fleet.max_attempts
    outcome = parts.store_failure(
        svc.db, part_id, worker.id, code, message, max_attempts, now=svc.clock()
    )
    if outcome.retry is not None:
        send_parts(svc.db, svc.celery, [outcome.retry], worker.profile)
    if outcome.job_failed:
        _announce(parts.job_of(part_id))
    return jsonify({"stored": outcome.stored})
