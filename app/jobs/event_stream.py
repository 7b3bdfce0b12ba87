"""A job's events as it happens: status, progress, segments and its outcome.

`job_events` is the one source of a job's events for every streaming surface: the Server-Sent
Events of GET /v1/jobs/<id>/events (`sse`), OpenAI's `stream=true` (app/jobs/openai_stream.py)
and the CLI's `--follow` (through the former). It yields `Emitted(kind, data, cursor)`, or
`None` for a heartbeat, from three sources: the job's row (status, the final JSON), its hot
progress in Redis (app/jobs/progress.py: attempts, progress, segments) and, once it succeeded,
its stored transcript.

Invariants:
- The cursor after each event is its SSE `id:` (`Cursor.encode`): the Redis entry read up to,
  the attempt whose segments were sent and how many, and the last status sent. Resuming from
  it (Last-Event-ID) sends what came after, never an event twice; a resume after `done` is
  told so (`Cursor.finished`), so the endpoint can answer 204 and a browser's EventSource stops.
- A redelivered job's new attempt is an `attempt` event; segments of earlier attempts are not
  sent after it (a fresh stream skips them altogether). Once the job succeeded, the segments
  not yet sent are sent from the stored transcript (the authoritative text: the worker's last
  buffered segments, a re-decoded loop), then `done` with the job's JSON, and the stream ends.
- Waiting holds no connection: the thread parks in the process's EventHub (app/jobs/event_hub.py)
  and the database is read once at the start, when a `status` mark arrives, and once per
  heartbeat (the net for a change whose mark was lost).
- A failure of Redis while streaming only slows the stream down to its heartbeats; a failure
  of the database ends it with an `error` event (the caller formats it).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import redis

from app.errors import Refused
from app.jobs.progress import Event
from app.models import FINISHED_STATES

log = logging.getLogger(__name__)

# Resume ids: "<redis entry id>.<attempt>.<segments sent>.<status sent>".
_CURSOR = re.compile(r"(\d{1,20}-\d{1,20})\.(\d{1,6})\.(\d{1,9})\.([a-z]{0,16})")
DONE = "done"
# How often a waiting stream looks at its client (and its own heartbeat clock).
TICK_SECONDS = 1.0


@dataclass(frozen=True)
class Cursor:
    entry: str = "0-0"
    attempt: int = 0
    sent: int = 0
    status: str = ""

    def encode(self) -> str:
        return f"{self.entry}.{self.attempt}.{self.sent}.{self.status}"

    @property
    def finished(self) -> bool:
        """Whether `done` was sent: nothing follows it."""
        return self.status == DONE

    @classmethod
    def parse(cls, value: str) -> Cursor:
        match = _CURSOR.fullmatch(value)
        if match is None:
            raise Refused(
                "invalid_last_event_id",
                "Last-Event-ID must be the id of an event this stream sent",
            )
        entry, attempt, sent, status = match.groups()
        return cls(entry, int(attempt), int(sent), status)


@dataclass(frozen=True)
class Emitted:
    kind: str  # status | attempt | progress | segment | done
    data: dict[str, Any]
    cursor: Cursor


class EventSource(Protocol):
    """Where a job's events come from (app/jobs/views.py binds it to the services)."""

    def job(self) -> dict[str, Any]:
        """The job's JSON as GET /v1/jobs/<id> shows it (one short database read)."""
        ...

    def events(self, after: str) -> list[Event]:
        """Hot events after Redis entry `after`, oldest first (bounded)."""
        ...

    def latest_attempt(self) -> int:
        """The attempt the job's hot progress is at (0 when none reported)."""
        ...

    def segments(self) -> list[dict[str, Any]]:
        """The stored transcript's segments (a succeeded job's)."""
        ...

    def wait(self, after: str, timeout: float) -> bool:
        """Block until an event after `after` may be there, or `timeout` passes."""
        ...

    def eta(self, job: dict[str, Any], done_seconds: float, total_seconds: float) -> float | None:
        """Seconds until the job is done, when they can be estimated."""
        ...


def _segment(data: dict[str, Any], words: bool) -> dict[str, Any]:
    keys = ("id", "start", "end", "text", "speaker") + (("words",) if words else ())
    return {k: data[k] for k in keys if data.get(k) is not None}


class _Stream:
    """One stream's state: the cursor, the job as last read, and what was seen."""

    def __init__(self, source: EventSource, cursor: Cursor, words: bool) -> None:
        self.source = source
        self.cursor = cursor
        self.words = words
        # A fresh stream skips the segments of attempts already superseded.
        self.floor = cursor.attempt if cursor.entry != "0-0" else source.latest_attempt()
        self.job = source.job()

    def emit(self, kind: str, data: dict[str, Any], **moved: Any) -> Emitted:
        self.cursor = replace(self.cursor, **moved)
        return Emitted(kind, data, self.cursor)

    def status(self) -> Iterator[Emitted]:
        status = str(self.job["status"])
        if status != self.cursor.status:
            yield self.emit("status", {"status": status}, status=status)

    def hot(self) -> tuple[list[Emitted], bool]:
        """The hot events since the cursor; and whether a status mark was among them."""
        try:
            events = self.source.events(self.cursor.entry)
        except redis.RedisError as exc:
            # The stream waits as usual (its heartbeats read the job), never spins on Redis.
            log.warning("event stream: hot events unavailable: %s", type(exc).__name__)
            return [], False
        out: list[Emitted] = []
        marked = False
        for event in events:
            marked |= event.type == "status"
            out.extend(self._one(event))
            self.cursor = replace(self.cursor, entry=event.id)
        if out:  # the last event's id covers the entries read after it
            out[-1] = replace(out[-1], cursor=self.cursor)
        return out, marked

    def _one(self, event: Event) -> Iterator[Emitted]:
        if event.attempt < max(self.floor, self.cursor.attempt):
            return
        if event.type == "attempt" and event.attempt > self.cursor.attempt:
            # Segments this stream sent of an earlier attempt are superseded; a first attempt
            # is no news.
            superseded = self.cursor.attempt > 0
            self.cursor = replace(self.cursor, attempt=event.attempt, sent=0)
            if superseded or event.attempt > 1:
                yield self.emit("attempt", {"attempt": event.attempt, "superseded": superseded})
        elif event.type == "segment" and event.attempt == self.cursor.attempt:
            sent = self.cursor.sent + 1
            yield self.emit("segment", _segment(event.data, self.words), entry=event.id, sent=sent)
        elif event.type == "progress" and event.attempt == self.cursor.attempt:
            done = float(event.data.get("done_seconds") or 0.0)
            total = float(event.data.get("total_seconds") or 0.0)
            data = {
                "progress": round(min(float(event.data.get("progress") or 0.0), 0.999), 4),
                "done_seconds": done,
                "total_seconds": total,
                "eta_seconds": self.source.eta(self.job, done, total),
            }
            yield self.emit("progress", data, entry=event.id)

    def ending(self) -> Iterator[Emitted]:
        """The segments not sent yet from the stored transcript, then `done`."""
        if self.job["status"] == "succeeded":
            for segment in self.source.segments()[self.cursor.sent :]:
                sent = self.cursor.sent + 1
                yield self.emit("segment", _segment(segment, self.words), sent=sent)
        yield self.emit(DONE, self.job, status=DONE)


def job_events(
    source: EventSource,
    cursor: Cursor,
    *,
    heartbeat_seconds: float,
    words: bool = False,
    client_gone: Callable[[], bool] = lambda: False,
) -> Iterator[Emitted | None]:
    """The job's events from `cursor` on (module docstring); `None` is a heartbeat. Ends after
    `done`, or when the client has gone."""
    stream = _Stream(source, cursor, words)
    if cursor.finished:
        return
    while True:
        yield from stream.status()
        if stream.job["status"] in FINISHED_STATES:
            yield from stream.ending()
            return
        emitted, marked = stream.hot()
        yield from emitted
        if marked:
            stream.job = source.job()
            continue
        waited = 0.0
        while not source.wait(stream.cursor.entry, TICK_SECONDS):
            if client_gone():
                return
            waited += TICK_SECONDS
            if waited >= heartbeat_seconds:
                yield None
                stream.job = source.job()
                break


def sse(emitted: Emitted | None) -> str:
    """One event (or a heartbeat comment) in the text/event-stream format."""
    if emitted is None:
        return ": heartbeat\n\n"
    data = json.dumps(emitted.data, separators=(",", ":"), allow_nan=False)
    return f"id: {emitted.cursor.encode()}\nevent: {emitted.kind}\ndata: {data}\n\n"
