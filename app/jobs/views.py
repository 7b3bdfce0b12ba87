"""HTTP surface of the jobs domain: /v1/jobs and the OpenAI-compatible /v1/audio/transcriptions,
/v1/audio/translations and /v1/models."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.datastructures import FileStorage

from app.auth import require_api_token
from app.context import Services, services
from app.db import as_utc
from app.errors import ApiError
from app.inputs import display_filename, refuse_repeated, request_json
from app.jobs import idempotency, parts, progress, requests, retention, routing, service
from app.jobs.formats import render
from app.jobs.requests import JobOptions
from app.jobs.slow_work import probe_slot
from app.jobs.submission import Submitter
from app.jobs.waiting import SYNC_SLOTS, SyncSlots, Waited, wait_for_job
from app.languages import language_name
from app.models import JobStatus
from app.server import client_gone, client_socket
from gpu_worker.protocol.failure import CLIENT_FAILURES

log = logging.getLogger(__name__)

jobs_bp = Blueprint("jobs", __name__)
F = TypeVar(
    "F",
    requests.UploadForm,
    requests.OpenAITranscriptionForm,
    requests.OpenAITranslationForm,
)

# The OpenAI endpoints' forms: one synchronous path for both.
OpenAIForm = TypeVar("OpenAIForm", requests.OpenAITranscriptionForm, requests.OpenAITranslationForm)


def _idempotency_key() -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    if not key or len(key) > 255:
        raise ApiError(400, "invalid_idempotency_key", "Idempotency-Key must be 1-255 characters")
    return key


def _accepted(job_json: dict[str, Any], created: bool) -> Response:
    response = jsonify(job_json)
    response.status_code = 202
    response.headers["Location"] = f"/v1/jobs/{job_json['id']}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return response


def _form_upload(model: type[F], svc: Services) -> tuple[FileStorage, F]:
    """The audio part and the form's fields as `model`: a repeated part is refused first (text
    or file; a list field excepted), then unknown parts, then a missing audio part, then the
    fields in the model's order."""
    form = request.form.to_dict(flat=False)
    text_parts: list[str] = [name for name, _ in request.form.items(multi=True)]
    file_parts: list[str] = [name for name, _ in request.files.items(multi=True)]
    refuse_repeated([*text_parts, *file_parts], "form field", lists=requests.list_fields(model))
    other_files = [name for name in file_parts if name != requests.UPLOAD_PART]
    requests.refuse_unknown(model, list(form) + other_files)
    upload = request.files.get(requests.UPLOAD_PART)
    if upload is None:
        raise ApiError(400, "missing_file", "send the audio as a multipart form field named 'file'")
    fields = requests.parse(
        model, requests.form_values(model, form), requests.deployment(svc.settings)
    )
    return upload, fields


def _submitter(svc: Services) -> Submitter:
    return Submitter(svc, probe_slot)


def _routed(options: JobOptions, **fields: Any) -> service.JobRequest:
    """The job request of checked options that some enabled profile can serve."""
    return service.JobRequest(
        language=options.language,
        prompt=options.prompt,
        word_timestamps=options.word_timestamps,
        webhook_url=options.webhook_url,
        task=options.task,
        model=options.model,
        diarize=options.diarize,
        min_speakers=options.min_speakers,
        max_speakers=options.max_speakers,
        temperature=options.temperature,
        vad_filter=options.vad_filter,
        **fields,
    )


def create_upload_job(
    svc: Services, upload: FileStorage, options: JobOptions, owner: str, key: str | None
) -> tuple[dict[str, Any], bool]:
    # Refused before the upload is stored when no enabled profile can serve it.
    options = routing.route(options, svc.settings)
    req = _routed(
        options,
        owner=owner,
        source="upload",
        idempotency_key=key,
        filename=display_filename(upload.filename),
    )
    job, created = _submitter(svc).upload(req, upload, lambda: idempotency.upload_digest(upload))
    return service.job_json(job), created


def _create_url_job(
    svc: Services, body: dict[str, Any], owner: str, key: str | None
) -> tuple[dict[str, Any], bool]:
    fields = requests.parse(requests.UrlJob, body, requests.deployment(svc.settings))
    options = routing.route(fields.options(), svc.settings)
    req = _routed(
        options,
        owner=owner,
        source="url",
        source_url=fields.url,
        idempotency_key=key,
        filename=display_filename(fields.url.split("?", 1)[0]),
    )
    job, created = _submitter(svc).url(req)
    return service.job_json(job), created


@jobs_bp.post("/v1/jobs")
@require_api_token
def create_job() -> Response:
    svc = services()
    key = _idempotency_key()
    if request.mimetype == "application/json":
        body = request_json()
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_json", "the request body is not a JSON object")
        job, created = _create_url_job(svc, body, g.owner, key)
    elif request.mimetype == "multipart/form-data":
        upload, form = _form_upload(requests.UploadForm, svc)
        job, created = create_upload_job(svc, upload, form.options(), g.owner, key)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send multipart/form-data with a 'file' field, or application/json with a 'url'",
        )
    return _accepted(job, created)


@jobs_bp.get("/v1/models")
@require_api_token
def list_models() -> Response:
    """OpenAI's model list: the models enabled profiles serve, and the aliases clients send."""
    settings = services().settings
    return jsonify(
        {
            "object": "list",
            "data": [routing.model_card(i, settings) for i in routing.model_ids(settings)],
        }
    )


@jobs_bp.get("/v1/models/<model_id>")
@require_api_token
def get_model(model_id: str) -> Response:
    settings = services().settings
    if model_id not in routing.model_ids(settings):
        raise ApiError(
            404,
            "model_not_found",
            f"the model {model_id!r} does not exist here; "
            f"models: {', '.join(routing.model_ids(settings))}",
        )
    return jsonify(routing.model_card(model_id, settings))


@jobs_bp.get("/v1/jobs/<job_id>")
@require_api_token
def get_job(job_id: str) -> Response:
    svc = services()
    job = service.get_job(svc.db, job_id, g.owner)
    body = service.job_json(job)
    counted = parts.summary(svc.db, job.id)
    if counted is not None:  # a job cut into parts (app/jobs/parts.py)
        body["parts"] = counted
    return jsonify(_with_progress(svc, job, body))


def _with_progress(svc: Services, job: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The job's JSON with its hot `progress` and `eta_seconds` (app/jobs/progress.py)."""
    started = as_utc(job.started_at) if job.started_at else None
    running = (svc.clock() - started).total_seconds() if started else None
    return {**body, **progress.progress_fields(svc.redis, body, running)}


@jobs_bp.get("/v1/jobs")
@require_api_token
def list_jobs() -> Response:
    query = requests.parse(requests.JobListQuery, request.args.to_dict())
    limit = query.limit
    cursor = service.cursor_decode(query.cursor) if query.cursor else None
    jobs = service.list_jobs(services().db, g.owner, query.status, limit + 1, cursor)
    page, more = jobs[:limit], len(jobs) > limit
    return jsonify(
        {
            "object": "list",
            "data": [service.job_json(j, with_text=False) for j in page],
            "next_cursor": service.cursor_encode(page[-1]) if more else None,
        }
    )


@jobs_bp.delete("/v1/jobs/<job_id>")
@require_api_token
def cancel_job(job_id: str) -> Response:
    svc = services()
    if requests.parse(requests.CancelQuery, request.args.to_dict()).purge:
        retention.purge_job(svc.db, svc.storage, job_id, g.owner)
        return Response(status=204)
    job = service.cancel_job(svc.db, job_id, g.owner, now=svc.clock())
    service.announce_finished(svc.redis, svc.celery, job)
    return jsonify(service.job_json(job))


@jobs_bp.get("/v1/jobs/<job_id>/transcript")
@require_api_token
def get_transcript(job_id: str) -> Response:
    query = requests.parse(requests.TranscriptQuery, request.args.to_dict())
    db = services().db
    job = service.get_job(db, job_id, g.owner)
    transcript = (
        service.get_transcript(db, job_id) if job.status == JobStatus.SUCCEEDED.value else None
    )
    if job.status != JobStatus.SUCCEEDED.value or transcript is None:
        if job.status in (JobStatus.FAILED.value, JobStatus.CANCELLED.value):
            raise ApiError(
                409,
                "job_not_succeeded",
                f"job {job_id} ended with status {job.status}; it has no transcript",
            )
        raise ApiError(
            409, "job_not_finished", f"job {job_id} is {job.status}; the transcript is not ready"
        )
    if query.format == "verbose_json":  # the one format that lists words; cues use them
        transcript = _words_as_asked(transcript, job.word_timestamps)
    body, media_type = render(transcript, query.format, query.cue_options())
    return Response(body, mimetype=media_type.split(";")[0], content_type=media_type)


def _words_as_asked(transcript: dict[str, Any], asked: bool) -> dict[str, Any]:
    """The stored transcript as the client asked for it: the worker stores word times for
    every job (subtitle cues are built from them), the answer carries them only when asked."""
    if asked:
        return transcript
    return {
        **transcript,
        "segments": [
            {k: v for k, v in seg.items() if k != "words"} for seg in transcript.get("segments", [])
        ],
    }


def sync_slots() -> SyncSlots:
    """This app's slots, made once by `create_app`."""
    slots: SyncSlots = current_app.extensions[SYNC_SLOTS]
    return slots


@jobs_bp.post("/v1/audio/transcriptions")
@require_api_token
def openai_transcriptions() -> Response:
    """OpenAI-compatible synchronous transcription: submit, wait, answer in the asked format."""
    # A slot before the upload is read: a refused request costs nothing and stores nothing.
    with sync_slots().hold():
        return _submit_and_wait(requests.OpenAITranscriptionForm)


@jobs_bp.post("/v1/audio/translations")
@require_api_token
def openai_translations() -> Response:
    """OpenAI-compatible synchronous translation to English: the transcriptions' path, with
    task=translate (same slots, timeout and no-retry answers)."""
    with sync_slots().hold():
        return _submit_and_wait(requests.OpenAITranslationForm)


def _submit_and_wait(model: type[OpenAIForm]) -> Response:
    svc = services()
    if request.mimetype != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data")
    upload, form = _form_upload(model, svc)
    waited, timeout = submit_and_wait(svc, upload, form.options())
    granularities: set[str] = set(form.timestamp_granularities)
    return _sync_answer(waited, form.response_format, granularities, timeout, form.task)


def submit_and_wait(
    svc: Services, upload: FileStorage, options: JobOptions
) -> tuple[Waited, float]:
    """A synchronous request's job, submitted as any job (listed, billed, cancellable,
    idempotent by its Idempotency-Key), then waited on within `api.sync_timeout_seconds` and
    for as long as the client stays; how the wait ended, and the timeout it had. The caller
    holds a sync slot (`sync_slots`)."""
    job, _ = create_upload_job(svc, upload, options, g.owner, _idempotency_key())
    timeout = svc.settings.api.sync_timeout_seconds
    sock = client_socket(request.environ)
    waited = wait_for_job(svc.db, svc.redis, job["id"], timeout, lambda: client_gone(sock))
    return waited, timeout


def _openai_language(transcript: dict[str, Any], task: str) -> dict[str, Any]:
    """The transcript as OpenAI's endpoints name its language: Whisper's full name ("german"),
    and "english" for a translation (the language of its text)."""
    if task == "translate":
        # The probability was the audio's language's; the answer's language is English.
        english = {k: v for k, v in transcript.items() if k != "language_probability"}
        return {**english, "language": language_name("en")}
    return {**transcript, "language": language_name(transcript.get("language"))}


def _sync_answer(
    waited: Waited, fmt: str, granularities: set[str], timeout: float, task: str = "transcribe"
) -> Response:
    """The answer to a synchronous request once its wait ended, however it ended."""
    finished = waited.job
    transcript = _openai_language(succeeded_transcript(waited, timeout), task)
    if fmt == "verbose_json":
        transcript = _words_as_asked(transcript, "word" in granularities)
    body, media_type = render(transcript, "text" if fmt == "text" else fmt)
    response = Response(body, content_type=media_type)
    response.headers["X-Murmur-Job-Id"] = finished.id
    return response


def succeeded_transcript(waited: Waited, timeout: float) -> dict[str, Any]:
    """The stored transcript of a synchronous request's job once its wait ended, or the
    refusal that says how the wait ended (each names the job and asks clients not to retry:
    a retry would submit the audio again)."""
    finished = waited.job
    # OpenAI's official client retries 409 and 5xx answers unless told not to.
    no_retry = {"x-should-retry": "false"}
    stored = (
        service.get_transcript(services().db, finished.id)
        if finished.status == JobStatus.SUCCEEDED.value
        else None
    )
    if stored is not None:
        return stored
    if finished.status == JobStatus.CANCELLED.value:
        raise ApiError(
            409,
            "job_cancelled",
            f"job {finished.id} was cancelled while this request waited",
            extra={"job_id": finished.id},
            headers=no_retry,
        )
    if finished.status == JobStatus.FAILED.value:
        client_fault = finished.error_code in CLIENT_FAILURES
        raise ApiError(
            # 502: the API is fine, the transcription behind it failed.
            400 if client_fault else 502,
            finished.error_code or "transcription_failed",
            finished.error_message or "the transcription failed",
            extra={"job_id": finished.id},
            headers=no_retry,
        )
    poll = {**no_retry, "Location": f"/v1/jobs/{finished.id}"}
    if waited.broker_down:
        raise ApiError(
            503,
            "broker_unavailable",
            f"the job queue is unavailable; job {finished.id} is kept and runs once it is back: "
            f"poll GET /v1/jobs/{finished.id}",
            extra={"job_id": finished.id},
            headers={**poll, "Retry-After": "5"},
        )
    if waited.client_gone:
        # Nobody reads this; the status tells the access log why the wait ended.
        raise ApiError(
            499,
            "client_closed_request",
            "the client closed the connection",
            extra={"job_id": finished.id},
            headers=poll,
        )
    raise ApiError(
        504,
        "timeout",
        f"the transcription did not finish within {timeout:.0f} s; poll GET /v1/jobs/{finished.id}",
        extra={"job_id": finished.id},
        headers=poll,
    )
