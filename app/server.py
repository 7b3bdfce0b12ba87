"""How the API is served: one gunicorn command line, and a thread worker whose own errors are JSON.

Invariants:
- `murmur api` (production, docker/) and `make up`/`make demo` (scripts/stack.py) build their
  gunicorn command here, so both run the same worker class, limits and thread budget.
- Each process gets `threads` general threads plus `api.sync_max_waiting` threads for
  synchronous transcriptions and `api.stream_max_open` for event streams; app/jobs/waiting.py
  and app/jobs/stream_limits.py never let more than that many wait or stream, so neither
  takes a thread that any other request needs.
- An error gunicorn answers itself (a request it cannot parse: headers too large, URI too
  long, bad request line) has the API's JSON shape {"error": {"code", "message"}} and never
  echoes the request back (a request line can carry a signed URL's signature).
- No client holds a thread by sending slowly: a request's head must arrive within
  `HEAD_SECONDS` of its first byte, and its body at `MIN_BODY_BYTES_PER_SECOND` on average
  after that (`_ReadDeadline`). A late head is answered 408 and the connection closed; a late
  body raises `BodyReadTimeout` into the app, which answers 408 (app/errors.py). This is the
  server's own guard; the TLS front (docker/Caddyfile) buffers requests as a second layer.
- An answer given before the request body was read (a refused upload: a bad token, a bad
  field) reaches the client whole: the rest of the body is read and dropped before the
  refusal is written (`read_refused_body`, a Flask after-request hook: a client or TLS front
  still sending never gets an answer in the middle of its upload, which Caddy's proxy could
  cut off under load), and again before the connection is reused or closed
  (`_drain_unread_body`, for what the app never saw), each up to the upload limit and for
  `UNREAD_BODY_SECONDS`. Closing a socket with unread data resets it, and the reset can
  destroy the answer before the client or the TLS front has read it.
- gunicorn's error log never holds request text: a refused request is logged as its
  exception class only, a failed one by method and path without the query string, since a
  request or header line can carry an API token or a signature (`_RequestTextFilter`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from typing import Any

from flask import current_app, request
from gunicorn import util
from gunicorn.workers.gthread import ThreadWorker

from app.config import Settings

log = logging.getLogger(__name__)

WORKER_CLASS = "app.server.JsonErrorThreadWorker"

# A request head is a few hundred bytes: ten seconds is generous for any real client.
HEAD_SECONDS = 10.0
# 256 kbit/s: a 25 MB upload may take 13 minutes; a client slower than that on average is
# refused rather than allowed to hold a thread for longer.
MIN_BODY_BYTES_PER_SECOND = 32 * 1024
# How long a refused request's unread body is read and dropped, at most (nginx lingers 5 s
# per read, 30 s in all); a client still sending after that is closed on.
UNREAD_BODY_SECONDS = 10.0
_DEFAULT_BODY_LIMIT = 64 * 1024 * 1024  # when the app names no MAX_CONTENT_LENGTH

_GUNICORN_ERRORS = {
    400: ("bad_request", "the request is not valid HTTP"),
    403: ("forbidden", "the request is forbidden"),
    414: ("uri_too_long", "the request line is longer than the server accepts"),
    417: ("expectation_failed", "the Expect header asks for something the server does not do"),
    431: (
        "request_header_fields_too_large",
        "the request headers are larger or more numerous than the server accepts",
    ),
    408: ("request_timeout", "the request did not arrive in time"),
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
        str(threads + settings.api.sync_max_waiting + settings.api.stream_max_open),
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


class BodyReadTimeout(TimeoutError):
    """The request body arrived slower than `MIN_BODY_BYTES_PER_SECOND` allows."""


class _HeadReadTimeout(Exception):
    """The request head did not arrive within `HEAD_SECONDS` (not an OSError, so that gunicorn
    hands it to `handle_error`, which answers 408)."""


class _ReadDeadline:
    """Stands in for the client socket in gunicorn's request parser: every `recv` waits at
    most until the request's deadline, which starts at HEAD_SECONDS and grows by one second
    per MIN_BODY_BYTES_PER_SECOND bytes received. Past it, reading is shut down (later reads
    see the end of the stream, so the connection closes after the answer) and the read fails.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.in_head = True
        self._started = time.monotonic()
        self._received = 0
        self._expired = False

    def start_request(self) -> None:
        self.in_head = True
        self._started = time.monotonic()
        self._received = 0

    def recv(self, size: int) -> bytes:
        if self._expired:
            return b""
        deadline = self._started + HEAD_SECONDS + self._received / MIN_BODY_BYTES_PER_SECOND
        remaining = deadline - time.monotonic()
        prior = self._sock.gettimeout()  # gunicorn's own drain sets one; keep the smaller
        try:
            if remaining > 0:
                self._sock.settimeout(remaining if prior is None else min(prior, remaining))
                try:
                    data = self._sock.recv(size)
                except TimeoutError:
                    if prior is not None and prior < remaining:
                        raise  # gunicorn's own timeout, not the request's deadline
                else:
                    self._received += len(data)
                    return data
        finally:
            self._sock.settimeout(prior)
        self._expired = True
        with contextlib.suppress(OSError):  # the client may have gone already
            self._sock.shutdown(socket.SHUT_RD)
        if self.in_head:
            raise _HeadReadTimeout()
        raise BodyReadTimeout("the request body arrived too slowly")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


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

    def handle(self, conn: Any) -> Any:
        reader = getattr(conn, "murmur_deadline", None)
        if reader is not None:
            reader.start_request()  # a kept-alive connection's next request
        elif not getattr(conn, "murmur_wrapped", False):
            conn.murmur_wrapped = True
            init = conn.init

            def init_with_deadline() -> None:
                init()  # creates the parser that reads from conn.sock
                sock: socket.socket = conn.sock
                unreader = getattr(conn.parser, "unreader", None)
                if unreader is not None and getattr(unreader, "sock", None) is sock:
                    conn.murmur_deadline = unreader.sock = _ReadDeadline(sock)

            conn.init = init_with_deadline
        return super().handle(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        reader = getattr(conn, "murmur_deadline", None)
        if reader is not None:
            reader.in_head = False
        return super().handle_request(req, conn)

    def _keepalive_after(self, conn: Any, keepalive: bool) -> bool:
        # gunicorn's own drain stops at 64 KiB, and its closing one (util.close_graceful)
        # at 64 KiB too: a refused 200 KB upload was answered, then reset under the answer.
        return _drain_unread_body(conn.parser, self._unread_body_limit()) and bool(
            super()._keepalive_after(conn, keepalive)
        )

    def _unread_body_limit(self) -> int:
        config = getattr(getattr(self, "wsgi", None), "config", None)
        limit = config.get("MAX_CONTENT_LENGTH") if isinstance(config, dict) else None
        return int(limit) if limit else _DEFAULT_BODY_LIMIT

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        if isinstance(exc, _HeadReadTimeout):
            self.log.warning("request head not received within %.0f s; closed", HEAD_SECONDS)
            try:
                util.write_nonblock(client, json_error_bytes(408, "Request Timeout"))
            except Exception:
                log.debug("failed to send an error answer")
            return
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


def _drain_unread_body(parser: Any, limit: int) -> bool:
    """Read and drop what the app left of the request's body; False when some is left.

    Nothing is read of a body declared longer than `limit` (its refusal closes the
    connection), nor past `limit` bytes or `UNREAD_BODY_SECONDS`. The request's own read
    deadline (`_ReadDeadline`) still applies to every read.
    """
    request: Any = getattr(parser, "mesg", None)
    body = getattr(request, "body", None)
    if request is None or body is None:
        return True
    if getattr(body, "failed", False) is True:  # where the next request starts is unknown
        return False
    declared = next((v for k, v in request.headers if k == "CONTENT-LENGTH"), None)
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return False
    deadline = time.monotonic() + UNREAD_BODY_SECONDS
    sock = getattr(getattr(parser, "unreader", None), "sock", None)
    if sock is None:  # not a socket this worker reads itself: gunicorn's own bounded drain
        return bool(parser.finish_body(deadline=deadline))
    prior = sock.gettimeout()
    drained = 0
    try:
        while drained <= limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sock.settimeout(remaining if prior is None else min(prior, remaining))
            data = body.read(64 * 1024)
            if not data:
                return True
            drained += len(data)
        return False
    except Exception:  # noqa: BLE001 - a timeout, a reset, a malformed chunk: close instead
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(prior)


def read_refused_body(response: Any) -> Any:
    """Flask after-request hook: a refusal (4xx, 5xx but 413) waits until the request's body is in,
    read and dropped, so the client is answered after its upload, not during it. Bounded as
    `_drain_unread_body`: not at all for a body declared over the app's limit (its 413 closes
    the connection), at most that many bytes and `UNREAD_BODY_SECONDS`; a read that fails is
    left to the connection's own drain."""
    if response.status_code < 400 or response.status_code == 413:
        return response  # a body refused as too large is not read (its route said so)
    declared = request.content_length
    limit = current_app.config.get("MAX_CONTENT_LENGTH") or _DEFAULT_BODY_LIMIT
    if declared is not None and declared > limit:
        return response
    if not declared and not request.headers.get("Transfer-Encoding"):
        return response  # no body
    deadline = time.monotonic() + UNREAD_BODY_SECONDS
    sock = client_socket(request.environ)
    prior = sock.gettimeout() if sock is not None else None
    read = 0
    try:
        while read <= limit:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if sock is not None:  # a client that stops sending holds this thread no longer
                sock.settimeout(remaining if prior is None else min(prior, remaining))
            data = request.stream.read(64 * 1024)
            if not data:
                break
            read += len(data)
    except Exception:  # noqa: BLE001 - a reset, a timeout, a malformed chunk: the answer stands
        log.debug("the refused request's body could not be read whole")
    finally:
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.settimeout(prior)
    return response


def client_socket(environ: dict[str, Any]) -> socket.socket | None:
    """The request's connection, where the server exposes it (gunicorn, Werkzeug's server)."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    return sock if isinstance(sock, socket.socket) else None


def client_gone(sock: socket.socket | None) -> bool:
    """True once the client has closed or reset its connection; False when it cannot tell.

    The request was read whole, so a readable socket holds either the client's end of stream
    (a peek reads nothing) or a pipelined next request (still there).
    """
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError, ValueError):
        return False  # nothing to read after all, or a TLS socket that cannot peek
    except OSError:
        return True  # reset by the peer
