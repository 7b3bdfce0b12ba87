"""How the API is served: one gunicorn command line, and a thread worker whose own errors are JSON.

Invariants:
- `murmur api` (production, docker/) and `make up`/`make demo` (app/stack.py) build their
  gunicorn command here, so both run the same worker class, limits and thread budget.
- Each process gets `threads` general threads plus `api.sync_max_waiting` threads for
  synchronous transcriptions; app/jobs/waiting.py never lets more than that many wait, so a
  waiting request never takes a thread that any other request needs.
- An error gunicorn answers itself (a request it cannot parse: headers too large, URI too
  long, bad request line) has the API's JSON shape {"error": {"code", "message"}} and never
  echoes the request back (a request line can carry a signed URL's signature).
- gunicorn's error log never holds request text: a refused request is logged as its
  exception class only, a failed one by method and path without the query string, since a
  request or header line can carry an API token or a signature (`_RequestTextFilter`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from app.config import Settings

log = logging.getLogger(__name__)

WORKER_CLASS = "app.server.JsonErrorThreadWorker"

_GUNICORN_ERRORS = {
    400: ("bad_request", "the request is not valid HTTP"),
    403: ("forbidden", "the request is forbidden"),
    414: ("uri_too_long", "the request line is longer than the server accepts"),
    417: ("expectation_failed", "the Expect header asks for something the server does not do"),
    431: (
        "request_header_fields_too_large",
        "the request headers are larger or more numerous than the server accepts",
    ),
    500: ("internal_error", "the server failed to handle the request"),
    501: ("not_implemented", "the request uses a transfer coding the server does not support"),
}


def gunicorn_args(
    settings: Settings, *, workers: int, threads: int, access_log: bool = True
) -> list[str]:
    """gunicorn's arguments (after the program name) for the API with these settings."""
    args = [
        "app:create_app()",
        "--bind",
        f"{settings.api.host}:{settings.api.port}",
        "--workers",
        str(workers),
        "--threads",
        str(threads + settings.api.sync_max_waiting),
        "--worker-class",
        WORKER_CLASS,
        # Above the longest synchronous wait (sync_timeout_seconds is at most 590 s).
        "--timeout",
        "620",
        "--graceful-timeout",
        "30",
    ]
    if access_log:
        args += [
            "--access-logfile",
            "-",
            # The path only: a query string can carry a signed audio URL's signature.
            "--access-logformat",
            '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(B)s %(L)ss',
        ]
    return args


def json_error_bytes(status: int, reason: str) -> bytes:
    """A complete HTTP/1.1 error answer with the API's JSON error body."""
    code, message = _GUNICORN_ERRORS.get(status, ("http_error", reason or "the request failed"))
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _CapturedAnswer:
    """Stands in for the client socket while gunicorn writes its HTML error, to keep only the
    status line; everything else (gunicorn's status mapping, logging, access log) is its own."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.data = b""

    def gettimeout(self) -> float:
        return 0.0  # so gunicorn's write_nonblock calls sendall directly

    def sendall(self, data: bytes) -> None:
        self.data += data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def status(self) -> tuple[int, str] | None:
        line = self.data.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            return None
        return int(parts[1]), parts[2] if len(parts) > 2 else ""


_handling = threading.local()  # the exception this thread's handle_error is logging


class _RequestTextFilter(logging.Filter):
    """Rewrites gunicorn's own error-log lines about a request so they carry no request text.

    gunicorn logs "Invalid request from ip=…: <exception text>" (the raw request or header
    line) and "Error handling request <method> <uri>" with a traceback; both can hold an API
    token or a signed URL's signature. What is kept: the address, the exception class, the
    method and the path.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str):
            return True
        exc = getattr(_handling, "exc", None)
        name = type(exc).__name__ if exc is not None else "error"
        if record.msg.startswith("Invalid request from ip="):
            record.msg = record.msg.split(": ", 1)[0] + f": {name} (request text not logged)"
            record.args = ()
        elif record.msg.startswith("Error handling request"):
            req = getattr(_handling, "req", None)
            method = getattr(req, "method", None) or "-"
            path = getattr(req, "path", None) or "-"
            record.msg = "Error handling request %s %s: %s (request text not logged)"
            record.args = (method, path, name)
            record.exc_info = None
            record.exc_text = None
        return True


class JsonErrorThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, answering the errors it raises itself in the JSON shape."""

    def init_process(self) -> None:
        error_log = self.log.error_log
        if not any(isinstance(f, _RequestTextFilter) for f in error_log.filters):
            error_log.addFilter(_RequestTextFilter())
        super().init_process()

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        captured = _CapturedAnswer(client)
        _handling.exc, _handling.req = exc, req
        try:
            super().handle_error(req, captured, addr, exc)
        finally:
            _handling.exc = _handling.req = None
        status = captured.status()
        if status is None:
            return
        try:
            util.write_nonblock(client, json_error_bytes(*status))
        except Exception:
            log.debug("failed to send an error answer")
