"""Streams of a job as it runs, bound to the services: its JSON with hot progress, and the
text/event-stream responses of GET /v1/jobs/<id>/events and OpenAI's `stream=true`.

Invariants:
- A stream is refused before anything is read or stored: the process's stream slots (503)
  and the token's leases (429), app/jobs/stream_limits.py; both are released when the server
  closes the response, iterated or not.
- The events come from `event_stream.job_events`; this module only binds its source to the
  database, Redis and the process's EventHub, and writes the wire format. An error after the
  stream started (the database gone, the job failed for OpenAI's client) is an `error` event,
  never a truncated stream.
- Responses are marked uncacheable and unbuffered (`X-Accel-Buffering: no`; the Caddy front
  flushes text/event-stream at once, docker/Caddyfile).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
from flask import Response, current_app

from app.context import Services
from app.db import as_utc
from app.errors import STATUS, Refused
from app.jobs import parts, progress, service
from app.jobs.event_hub import EventHub
from app.jobs.event_stream import Cursor, Emitted, job_events, sse
from app.jobs.openai_stream import data_line, openai_events
from app.jobs.stream_limits import LEASE_HEARTBEATS, Held, StreamSlots, TokenLease
from app.models import Job

log = logging.getLogger(__name__)

# Where `create_app` keeps the process's EventHub and StreamSlots (the app's extensions).
EVENT_HUB = "murmur.event_hub"
STREAM_SLOTS = "murmur.stream_slots"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# What a browser's EventSource waits before it reconnects (ms).
RETRY_MS = 3000


def job_view(svc: Services, job: Job) -> dict[str, Any]:
    """The job's JSON with its hot `progress` and `eta_seconds` (app/jobs/progress.py), and
    `parts` for a job cut into parts (app/jobs/parts.py)."""
    body = service.job_json(job)
    counted = parts.summary(svc.db, job.id)
    if counted is not None:
        body["parts"] = counted
    return {**body, **progress.progress_fields(svc.redis, body, _running_seconds(svc, job))}


def _running_seconds(svc: Services, job: Job) -> float | None:
    started = as_utc(job.started_at) if job.started_at else None
    return (svc.clock() - started).total_seconds() if started else None


class JobSource:
    """`event_stream.EventSource` on the services: one job of one owner."""

    def __init__(self, svc: Services, hub: EventHub, job_id: str, owner: str) -> None:
        self._svc = svc
        self._hub = hub
        self._job_id = job_id
        self._owner = owner
        self._running: float | None = None

    def job(self) -> dict[str, Any]:
        job = service.get_job(self._svc.db, self._job_id, self._owner)
        self._running = _running_seconds(self._svc, job)
        return job_view(self._svc, job)

    def events(self, after: str) -> list[progress.Event]:
        return progress.events_after(self._svc.redis, self._job_id, after)

    def latest_attempt(self) -> int:
        try:
            standing = progress.standing(self._svc.redis, self._job_id)
        except redis.RedisError:
            return 0
        return standing.attempt if standing else 0

    def segments(self) -> list[dict[str, Any]]:
        return list(self.transcript().get("segments", []))

    def transcript(self) -> dict[str, Any]:
        return service.get_transcript(self._svc.db, self._job_id) or {}

    def wait(self, after: str, timeout: float) -> bool:
        return self._hub.wait(self._job_id, after, timeout)

    def eta(self, job: dict[str, Any], done_seconds: float, total_seconds: float) -> float | None:
        return progress.eta_seconds(
            self._svc.redis, job, done_seconds, total_seconds, self._running
        )


def hub() -> EventHub:
    found: EventHub = current_app.extensions[EVENT_HUB]
    return found


def hold_stream(svc: Services, owner: str) -> tuple[TokenLease, list[Callable[[], None]]]:
    """A stream slot of this process, then a lease of the token (module docstring); the
    lease and the releases of both, or the refusal (nothing held)."""
    slots: StreamSlots = current_app.extensions[STREAM_SLOTS]
    release_slot = slots.take()
    heartbeat = svc.settings.api.stream_heartbeat_seconds
    lease = TokenLease(svc.redis, owner, heartbeat * LEASE_HEARTBEATS)
    try:
        lease.take(svc.settings.api.streams_per_token)
    except redis.RedisError as exc:
        release_slot()
        raise Refused(
            "broker_unavailable", "live events are unavailable (Redis does not answer)"
        ) from exc
    except Refused:
        release_slot()
        raise
    return lease, [lease.release, release_slot]


def error_event(exc: BaseException) -> dict[str, Any]:
    """The `error` event's payload: the API's error shape (and OpenAI's fields)."""
    if isinstance(exc, Refused):
        code, message = exc.code, exc.message
        kind = "server_error" if STATUS.get(code, 500) >= 500 else "invalid_request_error"
    else:
        log.exception("event stream failed")
        code, message, kind = "internal_error", "the stream failed on the server", "server_error"
    return {"error": {"code": code, "message": message, "type": kind, "param": None}}


def sse_body(events: Iterator[Emitted | None], lease: TokenLease) -> Iterator[str]:
    """The text/event-stream of `events`; heartbeats renew the lease."""
    yield f"retry: {RETRY_MS}\n\n"
    try:
        for emitted in events:
            if emitted is None:
                lease.renew()
            yield sse(emitted)
    except Exception as exc:  # the stream ends with its error, never truncated
        yield sse_error(error_event(exc))


def sse_error(payload: dict[str, Any]) -> str:
    return f"event: error\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def stream_response(body: Iterable[str], releases: list[Callable[[], None]]) -> Response:
    return Response(Held(body, releases), mimetype="text/event-stream", headers=SSE_HEADERS)


def events_response(
    svc: Services, job_id: str, owner: str, last_event_id: str | None, gone: Callable[[], bool]
) -> Response:
    """GET /v1/jobs/<id>/events: the job's Server-Sent Events from `last_event_id` on."""
    cursor = Cursor.parse(last_event_id) if last_event_id else Cursor()
    job = service.get_job(svc.db, job_id, owner)  # 404 for another owner's job, first
    if cursor.finished:
        return Response(status=204)  # `done` was sent: a browser's EventSource stops
    lease, releases = hold_stream(svc, owner)
    events = job_events(
        JobSource(svc, hub(), job_id, owner),
        cursor,
        heartbeat_seconds=svc.settings.api.stream_heartbeat_seconds,
        words=bool(job.word_timestamps),
        client_gone=gone,
    )
    return stream_response(sse_body(events, lease), releases)


def openai_body(events: Iterator[dict[str, Any] | None], lease: TokenLease) -> Iterator[str]:
    """OpenAI's `data:` lines of `events`; heartbeats renew the lease; an error ends it."""
    try:
        for event in events:
            if event is None:
                lease.renew()
            yield data_line(event)
    except Exception as exc:  # the stream ends with its error, never truncated
        yield data_line(error_event(exc))


def openai_stream_response(
    svc: Services,
    owner: str,
    submit: Callable[[], dict[str, Any]],
    *,
    diarized: bool,
    gone: Callable[[], bool],
) -> Response:
    """POST /v1/audio/transcriptions with stream=true: the stream is held first (slot and
    lease), then `submit` stores and queues the job, then its events stream as OpenAI's."""
    lease, releases = hold_stream(svc, owner)
    try:
        job = submit()
    except BaseException:
        for release in releases:
            release()
        raise
    source = JobSource(svc, hub(), str(job["id"]), owner)
    events = job_events(
        source,
        Cursor(),
        heartbeat_seconds=svc.settings.api.stream_heartbeat_seconds,
        client_gone=gone,
    )
    body = openai_body(openai_events(events, source.transcript, diarized=diarized), lease)
    response = stream_response(body, releases)
    response.headers["X-Murmur-Job-Id"] = str(job["id"])
    return response
