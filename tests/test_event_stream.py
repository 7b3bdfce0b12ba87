"""A job's event stream (app/jobs/event_stream.py) over the real hot-progress store and a real
EventHub on Redis: resume without repeats, superseded attempts, the ending from the stored
transcript, heartbeats and the hub's wake-ups."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from app.errors import Refused
from app.jobs import progress
from app.jobs.event_hub import EventHub
from app.jobs.event_stream import Cursor, Emitted, job_events, sse
from tests.conftest import REDIS_URL

JOB = "job-ev"


class Source:
    """The job's row and transcript in memory; its hot events in the real Redis store."""

    def __init__(self, client: redis.Redis, hub: EventHub) -> None:
        self.client = client
        self.hub = hub
        self.status = "running"
        self.final: list[dict[str, Any]] = []
        self.reads = 0

    def job(self) -> dict[str, Any]:
        self.reads += 1
        return {"id": JOB, "status": self.status}

    def events(self, after: str) -> list[progress.Event]:
        return progress.events_after(self.client, JOB, after)

    def latest_attempt(self) -> int:
        standing = progress.standing(self.client, JOB)
        return standing.attempt if standing else 0

    def segments(self) -> list[dict[str, Any]]:
        return self.final

    def wait(self, after: str, timeout: float) -> bool:
        return self.hub.wait(JOB, after, timeout)

    def eta(self, job: dict[str, Any], done_seconds: float, total_seconds: float) -> float | None:
        return None


@pytest.fixture()
def hub() -> Iterator[EventHub]:
    found = EventHub(lambda: redis.Redis.from_url(REDIS_URL, socket_timeout=5))
    yield found
    found.stop()


@pytest.fixture()
def source(clean_redis: redis.Redis, hub: EventHub) -> Source:
    return Source(clean_redis, hub)


def _seg(i: int, attempt: int = 1) -> dict[str, Any]:
    return {"id": i, "start": float(i), "end": i + 1.0, "text": f" a{attempt}s{i}"}


def _report(source: Source, attempt: int, seq: int, segs: list[int]) -> None:
    progress.report(
        source.client,
        JOB,
        attempt=attempt,
        seq=seq,
        done_seconds=float(max(segs, default=0) + 1),
        total_seconds=100.0,
        segments=[_seg(i, attempt) for i in segs],
    )


def _take(events: Iterator[Emitted | None], until: str) -> list[Emitted]:
    """Events up to and including the first of kind `until` (heartbeats dropped)."""
    out: list[Emitted] = []
    for emitted in events:
        if emitted is None:
            continue
        out.append(emitted)
        if emitted.kind == until:
            return out
    raise AssertionError(f"the stream ended before a {until!r} event: {out}")


def _finish(source: Source, status: str = "succeeded") -> None:
    source.status = status
    progress.mark_status(source.client, JOB, ended=True)


def test_a_stream_sends_status_progress_segments_then_done(source: Source) -> None:
    _report(source, 1, 1, [0, 1])
    events = job_events(source, Cursor(), heartbeat_seconds=30)
    first = _take(events, "progress")
    assert [e.kind for e in first] == ["status", "segment", "segment", "progress"]
    assert first[0].data == {"status": "running"}
    assert [e.data["text"] for e in first if e.kind == "segment"] == [" a1s0", " a1s1"]
    # Later reports wake the waiting stream through the hub.
    threading.Timer(0.3, _report, (source, 1, 2, [2])).start()
    assert [e.data.get("id") for e in _take(events, "progress")] == [2, None]
    # The job succeeds: the stored transcript's segments not sent yet, then done.
    source.final = [_seg(i) for i in range(4)]
    threading.Timer(0.3, _finish, (source,)).start()
    rest = list(e for e in events if e is not None)
    assert [e.kind for e in rest] == ["status", "segment", "done"]
    assert rest[1].data["text"] == " a1s3"
    assert rest[-1].cursor.finished and rest[0].data == {"status": "succeeded"}


def test_resuming_from_any_event_sends_the_rest_once(source: Source) -> None:
    _report(source, 1, 1, [0, 1, 2])
    _report(source, 1, 2, [3])
    source.final = [_seg(i) for i in range(5)]
    _finish(source)
    whole = [e for e in job_events(source, Cursor(), heartbeat_seconds=30) if e is not None]
    ids = [e.cursor.encode() for e in whole]
    assert len(set(ids)) == len(ids)
    for index, emitted in enumerate(whole[:-1]):
        resumed = job_events(source, Cursor.parse(ids[index]), heartbeat_seconds=30)
        rest = [e for e in resumed if e is not None]
        assert [(e.kind, e.data) for e in rest] == [(e.kind, e.data) for e in whole[index + 1 :]]
    # After done there is nothing more: the endpoint answers 204.
    assert Cursor.parse(ids[-1]).finished
    assert list(job_events(source, Cursor.parse(ids[-1]), heartbeat_seconds=30)) == []


def test_a_new_attempt_supersedes_the_segments_sent(source: Source) -> None:
    _report(source, 1, 1, [0, 1, 2])
    events = job_events(source, Cursor(), heartbeat_seconds=30)
    assert [e.data.get("text") for e in _take(events, "progress")][1:4] == [
        " a1s0",
        " a1s1",
        " a1s2",
    ]
    _report(source, 2, 1, [0])  # redelivered: the second worker's first report
    again = _take(events, "progress")
    assert [e.kind for e in again] == ["attempt", "segment", "progress"]
    assert again[0].data == {"attempt": 2, "superseded": True}
    assert again[1].data["text"] == " a2s0"
    # A late report of the first attempt changes nothing.
    _report(source, 1, 9, [3])
    # A stream opened now skips the superseded attempt altogether.
    fresh = _take(job_events(source, Cursor(), heartbeat_seconds=30), "progress")
    assert [(e.kind, e.data) for e in fresh][:3] == [
        ("status", {"status": "running"}),
        ("attempt", {"attempt": 2, "superseded": False}),  # nothing of attempt 1 was sent
        ("segment", _seg(0, 2)),
    ]


def test_a_stream_opened_after_the_end_replays_the_transcript(source: Source) -> None:
    source.final = [_seg(i) for i in range(3)]
    _finish(source)  # the hot events hold no segment (expired, or none reported)
    replay = [e for e in job_events(source, Cursor(), heartbeat_seconds=30) if e is not None]
    assert [e.kind for e in replay] == ["status", "segment", "segment", "segment", "done"]


def test_a_failed_job_ends_with_done_and_no_segments(source: Source) -> None:
    _report(source, 1, 1, [0])
    _finish(source, "failed")
    ended = [e for e in job_events(source, Cursor(), heartbeat_seconds=30) if e is not None]
    assert [(e.kind, e.data) for e in ended] == [
        ("status", {"status": "failed"}),
        ("done", {"id": JOB, "status": "failed"}),
    ]


def test_a_quiet_stream_sends_heartbeats_and_rereads_the_job(source: Source) -> None:
    events = job_events(source, Cursor(), heartbeat_seconds=1.0)
    assert next(events) is not None  # status
    reads = source.reads
    started = time.monotonic()
    assert next(events) is None  # a heartbeat
    assert time.monotonic() - started >= 0.9
    # A status changed in the row alone (no mark in Redis) is read after the heartbeat: the
    # net for a change whose mark was lost.
    source.status = "cancelled"
    rest = [e for e in events if e is not None]
    assert [e.kind for e in rest] == ["status", "done"]
    assert source.reads == reads + 1


def test_a_stream_ends_when_its_client_has_gone(source: Source, hub: EventHub) -> None:
    gone = threading.Event()
    events = job_events(source, Cursor(), heartbeat_seconds=30, client_gone=gone.is_set)
    assert next(events) is not None
    threading.Timer(0.2, gone.set).start()
    assert list(events) == []
    assert hub.waiting() == 0


def test_bad_resume_ids_are_refused() -> None:
    for value in ("", "abc", "1-0.1.2", "1-0.1.2.running.x", "1-0.-1.0.queued", "x" * 500):
        with pytest.raises(Refused) as refused:
            Cursor.parse(value)
        assert refused.value.code == "invalid_last_event_id"
    assert Cursor.parse("17-3.2.5.running") == Cursor("17-3", 2, 5, "running")


def test_the_wire_format_has_an_id_an_event_and_one_data_line() -> None:
    emitted = Emitted("segment", {"id": 0, "text": "two\nlines"}, Cursor("5-0", 1, 1, "running"))
    assert sse(emitted) == (
        'id: 5-0.1.1.running\nevent: segment\ndata: {"id":0,"text":"two\\nlines"}\n\n'
    )
    assert sse(None) == ": heartbeat\n\n"


def test_the_hub_wakes_every_waiter_of_a_job_and_no_other(
    clean_redis: redis.Redis, hub: EventHub
) -> None:
    woke: dict[str, bool] = {}

    def wait(name: str, job: str) -> None:
        woke[name] = hub.wait(job, "0-0", 5.0)

    threads = [
        threading.Thread(target=wait, args=(name, job))
        for name, job in (("a1", "job-a"), ("a2", "job-a"), ("b", "job-b"))
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    progress.mark_status(clean_redis, "job-a", ended=False)
    for thread in threads[:2]:
        thread.join(5)
    assert woke == {"a1": True, "a2": True}
    threads[2].join(6)
    assert woke["b"] is False and hub.waiting() == 0
    # An entry already there wakes at once (no lost wake-up between a read and a wait).
    started = time.monotonic()
    assert hub.wait("job-a", "0-0", 5.0) and time.monotonic() - started < 2


def test_a_redis_outage_slows_the_stream_to_its_heartbeats(source: Source) -> None:
    """Hot events unavailable: no spin on the database, and the outcome still arrives."""

    class Down(Source):
        def events(self, after: str) -> list[progress.Event]:
            raise redis.ConnectionError("down")

    down = Down(source.client, source.hub)
    events = job_events(down, Cursor(), heartbeat_seconds=1.0)
    assert next(events) is not None  # status, from the database
    assert next(events) is None  # a heartbeat, after waiting
    assert down.reads == 1  # the job was read once at the start, not in a loop
    down.status = "succeeded"
    assert [e.kind for e in events if e is not None] == ["status", "done"]
