"""HTTP surface of the jobs domain: /v1/jobs and the OpenAI-compatible /v1/audio/transcriptions."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Response, g, jsonify, request
from werkzeug.datastructures import FileStorage

from app.auth import require_api_token
from app.context import Services, services
from app.errors import ApiError
from app.inputs import check_text, display_filename, request_json
from app.jobs import idempotency, retention, service
from app.jobs.formats import FORMATS, render
from app.jobs.slow_work import probe_slot
from app.jobs.submission import Submitter
from app.jobs.waiting import Waited, client_socket, sync_slots, wait_for_job
from app.languages import WHISPER_LANGUAGES, is_english_only
from app.models import JobStatus
from app.urls import check_url
from gpu_worker.protocol.failure import CLIENT_FAILURES

log = logging.getLogger(__name__)

jobs_bp = Blueprint("jobs", __name__)

OPENAI_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
_JSON_FIELDS = {"url", "language", "webhook_url", "word_timestamps", "prompt"}
_FORM_FIELDS = {"language", "webhook_url", "word_timestamps", "prompt"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _language(value: Any, svc: Services) -> str | None:
    if value is None or value == "":
        return svc.settings.default_language
    if not isinstance(value, str) or value.lower() not in WHISPER_LANGUAGES:
        raise ApiError(
            400,
            "invalid_language",
            f"language {value!r} is not an ISO 639-1 code Whisper knows (e.g. 'en', 'fr')",
        )
    code = value.lower()
    models = {p.model for p in svc.settings.enabled_profiles}
    if code != "en" and models and all(is_english_only(m) for m in models):
        raise ApiError(
            400,
            "unsupported_language",
            f"language {code!r} is not supported: the configured models are English-only",
        )
    return code


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise ApiError(400, "invalid_parameter", f"{name} must be true or false")


def _text(value: Any, name: str, limit: int) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise ApiError(
            400, "invalid_parameter", f"{name} must be a string of at most {limit} characters"
        )
    return check_text(value, name, free_text=True)


def _webhook(value: Any, svc: Services) -> str | None:
    if value is None or value == "":
        return None
    if not svc.settings.reveal("webhook_secret"):
        raise ApiError(
            400, "webhooks_disabled", "webhooks are disabled: MURMUR_WEBHOOK_SECRET is not set"
        )
    allow = svc.settings.api.allow_private_urls
    with probe_slot():  # resolving the host may wait on a slow resolver
        return check_url(value, field="webhook_url", allow_private=allow).url


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


def _form_upload(svc: Services, allowed_fields: set[str]) -> tuple[FileStorage, dict[str, Any]]:
    unknown = set(request.form) - allowed_fields
    if unknown:
        # A part whose name werkzeug could not read is keyed None: name it, do not sort on it.
        names = ", ".join(sorted(str(name) for name in unknown))
        raise ApiError(400, "unknown_field", f"unknown form field(s): {names}")
    upload = request.files.get("file")
    if upload is None:
        raise ApiError(400, "missing_file", "send the audio as a multipart form field named 'file'")
    return upload, request.form.to_dict()


def _submitter(svc: Services) -> Submitter:
    return Submitter(svc, probe_slot)


def create_upload_job(
    svc: Services, upload: FileStorage, fields: dict[str, Any], owner: str, key: str | None
) -> tuple[dict[str, Any], bool]:
    req = service.JobRequest(
        owner=owner,
        source="upload",
        language=_language(fields.get("language"), svc),
        prompt=_text(fields.get("prompt"), "prompt", 2000),
        word_timestamps=_flag(fields.get("word_timestamps"), "word_timestamps"),
        webhook_url=_webhook(fields.get("webhook_url"), svc),
        idempotency_key=key,
        filename=display_filename(upload.filename),
    )
    job, created = _submitter(svc).upload(req, upload, lambda: idempotency.upload_digest(upload))
    return service.job_json(job), created


def _create_url_job(
    svc: Services, body: dict[str, Any], owner: str, key: str | None
) -> tuple[dict[str, Any], bool]:
    unknown = set(body) - _JSON_FIELDS
    if unknown:
        raise ApiError(400, "unknown_field", f"unknown field(s): {', '.join(sorted(unknown))}")
    if "url" not in body:
        raise ApiError(400, "missing_url", 'send JSON {"url": "https://..."} or upload a file')
    with probe_slot():  # resolving the host may wait on a slow resolver
        checked = check_url(body["url"], allow_private=svc.settings.api.allow_private_urls)
    req = service.JobRequest(
        owner=owner,
        source="url",
        source_url=checked.url,
        language=_language(body.get("language"), svc),
        prompt=_text(body.get("prompt"), "prompt", 2000),
        word_timestamps=_flag(body.get("word_timestamps"), "word_timestamps"),
        webhook_url=_webhook(body.get("webhook_url"), svc),
        idempotency_key=key,
        filename=display_filename(checked.url.split("?", 1)[0]),
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
        upload, fields = _form_upload(svc, _FORM_FIELDS)
        job, created = create_upload_job(svc, upload, fields, g.owner, key)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            "send multipart/form-data with a 'file' field, or application/json with a 'url'",
        )
    return _accepted(job, created)


@jobs_bp.get("/v1/jobs/<job_id>")
@require_api_token
def get_job(job_id: str) -> Response:
    return jsonify(service.job_json(service.get_job(services().db, job_id, g.owner)))


@jobs_bp.get("/v1/jobs")
@require_api_token
def list_jobs() -> Response:
    status = request.args.get("status") or None
    if status is not None and status not in {s.value for s in JobStatus}:
        raise ApiError(
            400,
            "invalid_status",
            f"status must be one of {', '.join(s.value for s in JobStatus)}",
        )
    try:
        limit = int(request.args.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ApiError(400, "invalid_limit", "limit must be an integer from 1 to 100")
    raw_cursor = request.args.get("cursor")
    cursor = service.cursor_decode(raw_cursor) if raw_cursor else None
    jobs = service.list_jobs(services().db, g.owner, status, limit + 1, cursor)
    page, more = jobs[:limit], len(jobs) > limit
    return jsonify(
        {
            "object": "list",
            "data": [service.job_json(j) for j in page],
            "next_cursor": service.cursor_encode(page[-1]) if more else None,
        }
    )


@jobs_bp.delete("/v1/jobs/<job_id>")
@require_api_token
def cancel_job(job_id: str) -> Response:
    svc = services()
    if _flag(request.args.get("purge"), "purge"):
        retention.purge_job(svc.db, svc.storage, job_id, g.owner)
        return Response(status=204)
    job = service.cancel_job(svc.db, job_id, g.owner, now=svc.clock())
    service.announce_finished(svc.redis, svc.celery, job)
    return jsonify(service.job_json(job))


@jobs_bp.get("/v1/jobs/<job_id>/transcript")
@require_api_token
def get_transcript(job_id: str) -> Response:
    fmt = request.args.get("format", "json")
    if fmt not in FORMATS:
        raise ApiError(
            400, "invalid_format", f"format must be one of {', '.join(f for f in FORMATS)}"
        )
    job = service.get_job(services().db, job_id, g.owner)
    if job.status != JobStatus.SUCCEEDED.value or job.transcript is None:
        if job.status in (JobStatus.FAILED.value, JobStatus.CANCELLED.value):
            raise ApiError(
                409,
                "job_not_succeeded",
                f"job {job_id} ended with status {job.status}; it has no transcript",
            )
        raise ApiError(
            409, "job_not_finished", f"job {job_id} is {job.status}; the transcript is not ready"
        )
    body, media_type = render(job.transcript, fmt)
    return Response(body, mimetype=media_type.split(";")[0], content_type=media_type)


@jobs_bp.post("/v1/audio/transcriptions")
@require_api_token
def openai_transcriptions() -> Response:
    """OpenAI-compatible synchronous transcription: submit, wait, answer in the asked format."""
    # A slot before the upload is read: a refused request costs nothing and stores nothing.
    with sync_slots().hold():
        return _transcribe_and_wait()


def _transcribe_and_wait() -> Response:
    svc = services()
    if request.mimetype != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data")
    upload, _ = _form_upload(svc, _OPENAI_FIELDS)
    fmt, granularities = _openai_format()
    fields = {
        "language": request.form.get("language"),
        "prompt": request.form.get("prompt"),
        "word_timestamps": "true" if "word" in granularities else "false",
    }
    job, _ = create_upload_job(svc, upload, fields, g.owner, _idempotency_key())
    timeout = svc.settings.api.sync_timeout_seconds
    waited = wait_for_job(svc.db, svc.redis, job["id"], timeout, client_socket(request.environ))
    return _sync_answer(waited, fmt, granularities, timeout)


_OPENAI_FIELDS = {
    "model",
    "language",
    "prompt",
    "response_format",
    "temperature",
    "timestamp_granularities[]",
    "stream",
}


def _openai_format() -> tuple[str, set[str]]:
    """The asked response format and timestamp granularities, checked."""
    fmt = request.form.get("response_format") or "json"
    if fmt not in OPENAI_FORMATS:
        raise ApiError(
            400,
            "invalid_response_format",
            f"response_format must be one of {', '.join(OPENAI_FORMATS)}",
        )
    granularities = set(request.form.getlist("timestamp_granularities[]"))
    if granularities - {"word", "segment"}:
        raise ApiError(
            400, "invalid_parameter", "timestamp_granularities[] accepts 'word' and 'segment'"
        )
    return fmt, granularities


def _sync_answer(waited: Waited, fmt: str, granularities: set[str], timeout: float) -> Response:
    """The answer to a synchronous request once its wait ended, however it ended."""
    finished = waited.job
    # From here a job exists: every answer names it and tells the official client not to
    # retry (it retries 409 and 5xx answers, and a retry would submit the audio again).
    no_retry = {"x-should-retry": "false"}
    if finished.status == JobStatus.SUCCEEDED.value and finished.transcript is not None:
        transcript = finished.transcript
        if fmt == "verbose_json" and "word" not in granularities:
            transcript = {
                **transcript,
                "segments": [
                    {k: v for k, v in seg.items() if k != "words"}
                    for seg in transcript.get("segments", [])
                ],
            }
        body, media_type = render(transcript, "text" if fmt == "text" else fmt)
        response = Response(body, content_type=media_type)
        response.headers["X-Murmur-Job-Id"] = finished.id
        return response
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
