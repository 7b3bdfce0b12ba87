"""One JSON error shape for every rejected request: {"error": {"code": ..., "message": ...}}."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A request the API refuses, with the status, a stable code and a message for people."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}
        self.headers = headers or {}


def error_response(
    status: int, code: str, message: str, extra: dict[str, Any] | None = None
) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    body.update(extra or {})
    response = jsonify({"error": body})
    response.status_code = status
    return response


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(err: ApiError) -> Response:
        response = error_response(err.status, err.code, err.message, err.extra)
        response.headers.update(err.headers)
        return response

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Response:
        status = err.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        message = err.description or err.name
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH")
            message = f"the request body is larger than the limit of {limit} bytes"
        if status == 404:
            message = "no such endpoint"
        return error_response(status, code, message)

    @app.errorhandler(Exception)
    def _unexpected(err: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "the server failed to handle the request")
