"""One JSON error shape for every rejected request: {"error": {"code": ..., "message": ...}}.

On the OpenAI-compatible paths (`is_openai_path`) the same object also carries OpenAI's
ErrorResponse fields, `type` and `param`, so OpenAI's SDKs see `error.type` and `error.param`.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.wsgi import LimitedStream

log = logging.getLogger(__name__)


class Refused(Exception):
    """A domain's refusal: a stable `code`, a `message` for people and `extra` data for the
    client. It says nothing of HTTP: a request that meets one answers `STATUS[code]`, and a
    task that meets one records the code on its job."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        extra: dict[str, Any] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra or {}
        # The request field the refusal is about (OpenAI's `param`), when one is.
        self.param = param

    @property
    def status(self) -> int:
        return STATUS[self.code]


# The HTTP status of every domain refusal: the one place where a domain's code meets HTTP.
STATUS: dict[str, int] = {
    # app/audio.py: the upload's (or the URL's) content
    "invalid_audio": 400,
    "empty_file": 400,
    "audio_too_long": 413,
    "audio_too_complex": 413,
    # app/urls.py: a URL input or webhook address
    "invalid_url": 400,
    "forbidden_url": 400,
    "name_resolution_timeout": 503,
    # app/jobs: a job's state and its owner's requests
    "job_not_found": 404,
    "job_finished": 409,
    "job_not_finished": 409,
    "invalid_cursor": 400,
    "idempotency_key_reused": 422,
    # app/jobs/requests.py: a public request's fields
    "unknown_field": 400,
    "duplicate_field": 400,
    "invalid_parameter": 400,
    "invalid_text": 400,
    "missing_url": 400,
    "invalid_language": 400,
    "unsupported_language": 400,
    "webhooks_disabled": 400,
    "invalid_status": 400,
    "invalid_limit": 400,
    "invalid_format": 400,
    "invalid_response_format": 400,
    # app/jobs/routing.py: no enabled profile can serve the job (issue 20)
    "invalid_task": 400,
    "model_not_found": 400,
    "translation_unavailable": 400,
    "diarization_unavailable": 400,
    # app/fleet/readiness.py: a worker whose runtime is not its profile's
    "runtime_mismatch": 409,
    # app/jobs/handover.py: a worker's signed audio URL
    "invalid_signature": 403,
    "audio_url_expired": 410,
    "audio_not_found": 404,
    # app/jobs/fetch.py: fetching a URL job's audio
    "url_fetch_failed": 422,
    "url_too_large": 413,
    # app/jobs/submission.py: an upload over the size cap; a job whose queue is down
    "payload_too_large": 413,
    "broker_unavailable": 503,
    # app/jobs/slow_work.py, app/jobs/waiting.py: this process's bounded slots are all taken
    "server_busy": 503,
    "sync_capacity_exhausted": 503,
    # app/jobs/stream_limits.py, app/jobs/event_stream.py: event streams
    "stream_capacity_exhausted": 503,
    "too_many_streams": 429,
    "invalid_last_event_id": 400,
    # app/storage.py: the audio store (an S3 bucket) does not answer or refuses us
    "storage_unavailable": 503,
    # app/storage.py, app/db.py: the audio store's or the database's disk is full; the
    # database refuses, does not answer within its timeouts, or stays locked past them
    "insufficient_storage": 507,
    "database_unavailable": 503,
}
# Refusals that pass with time: the seconds a client should wait before trying again.
RETRY_AFTER: dict[str, int] = {
    "broker_unavailable": 5,
    "name_resolution_timeout": 5,
    "server_busy": 2,
    "sync_capacity_exhausted": 5,
    "stream_capacity_exhausted": 5,
    "too_many_streams": 5,
    "storage_unavailable": 10,
    "insufficient_storage": 60,
    "database_unavailable": 5,
}


class ApiError(Refused):
    """A refusal of the HTTP layer itself (a malformed request, a busy server...), with its
    status and response headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(code, message, extra=extra, param=param)
        self._status = status
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return self._status


# The request field a code is about, when the code says (OpenAI's `param`); a refusal may name
# its own (`Refused.param`), which wins.
PARAM: dict[str, str] = {
    "invalid_audio": "file",
    "empty_file": "file",
    "missing_file": "file",
    "audio_too_long": "file",
    "audio_too_complex": "file",
    "payload_too_large": "file",
    "invalid_language": "language",
    "unsupported_language": "language",
    "invalid_response_format": "response_format",
}


def is_openai_path(path: str) -> bool:
    """Whether `path` is of the OpenAI-compatible surface, whose errors also carry OpenAI's
    ErrorResponse fields. A property of the prefix: a new endpoint under it inherits it."""
    return path.startswith("/v1/audio/") or path == "/v1/models" or path.startswith("/v1/models/")


def openai_error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status (what its SDKs expose as `error.type`)."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_response(
    status: int,
    code: str,
    message: str,
    extra: dict[str, Any] | None = None,
    param: str | None = None,
) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if has_request_context() and is_openai_path(request.path):
        body["type"] = openai_error_type(status)
        body["param"] = param or PARAM.get(code)
    body.update(extra or {})
    response = jsonify({"error": body})
    response.status_code = status
    return response


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    429: "too_many_requests",
    431: "request_header_fields_too_large",
    501: "not_implemented",
    503: "service_unavailable",
}


def _too_large(app: Flask) -> tuple[str, str]:
    """Which limit a 413 from Werkzeug hit: the body's size, or the multipart form's shape.

    Werkzeug raises the same exception for all three; a body within the size limit can only
    have broken a form limit (too many parts, or a text field held in memory too large).
    """
    limit = app.config.get("MAX_CONTENT_LENGTH")
    length = request.content_length
    # A chunked body has no length: it hit the size limit only if the limited stream that
    # Werkzeug reads it through is used up; otherwise the form's parser refused it.
    if length is None:
        within = not (isinstance(request.stream, LimitedStream) and request.stream.is_exhausted)
    else:
        within = limit is not None and length <= limit
    if limit is not None and within:
        parts = app.config.get("MAX_FORM_PARTS")
        field = app.config.get("MAX_FORM_MEMORY_SIZE")
        return (
            "form_too_large",
            f"the multipart form has more than {parts} parts or a text field larger than "
            f"{field} bytes; send the audio as one 'file' part and short fields",
        )
    return (
        "payload_too_large",
        f"the request body is larger than the limit of {limit} bytes (the setting "
        "api.max_upload_bytes, MURMUR_MAX_UPLOAD_BYTES, plus room for the form's fields)",
    )


def _caused_by_slow_body(err: BaseException) -> bool:
    # Werkzeug turns any OSError while reading the body into ClientDisconnected (400).
    from app.server import BodyReadTimeout

    cause: BaseException | None = err
    for _ in range(5):
        if cause is None:
            return False
        if isinstance(cause, BodyReadTimeout):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(Refused)
    def _refused(err: Refused) -> Response:
        response = error_response(err.status, err.code, err.message, err.extra, err.param)
        if err.code in RETRY_AFTER:
            response.headers["Retry-After"] = str(RETRY_AFTER[err.code])
        response.headers.update(getattr(err, "headers", {}))
        return response

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Response:
        status = err.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = err.description or err.name
        if status == 413:
            code, message = _too_large(app)
        if status == 404:
            message = "no such endpoint"
        if status == 400 and _caused_by_slow_body(err):
            return _too_slow()
        response = error_response(status, code, message)
        # Keep what the exception says about the resource (Allow on a 405, Retry-After).
        for name, value in err.get_headers():
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    from gunicorn.http.errors import NoMoreData, ParseException

    from app.server import BodyReadTimeout

    def _too_slow() -> Response:
        return error_response(408, "request_timeout", "the request body arrived too slowly")

    app.register_error_handler(BodyReadTimeout, lambda err: _too_slow())

    @app.errorhandler(ParseException)
    @app.errorhandler(NoMoreData)
    def _unreadable_body(err: Exception) -> Response:
        # gunicorn raises these from the request body's reader (a malformed or truncated
        # chunked body): the client's fault, never a server bug. The text is not echoed.
        return error_response(
            400, "invalid_body", "the request body is not valid HTTP/1.1 chunked encoding"
        )

    @app.errorhandler(Exception)
    def _unexpected(err: Exception) -> Response:
        from app.db import database_fault

        fault = database_fault(err)
        if fault is not None:
            # The driver's text may name the server or quote the statement: not echoed.
            log.warning("database fault answered %s: %s", fault, type(err).__name__)
            if fault == "insufficient_storage":
                return _refused(
                    Refused("insufficient_storage", "the database is full; retry later")
                )
            return _refused(
                Refused("database_unavailable", "the database is unavailable; retry shortly")
            )
        log.exception("unhandled error")
        return error_response(500, "internal_error", "the server failed to handle the request")
