"""The hot progress store (app/jobs/progress.py) against a real Redis."""

from __future__ import annotations

import pytest
import redis

from app.jobs import progress


def _seg(i: int, attempt: int = 1) -> dict[str, object]:
    return {"id": i, "start": float(i), "end": i + 1.0, "text": f" a{attempt}s{i}"}


def _report(client: redis.Redis, attempt: int, seq: int, done: float, segs: list[int]) -> int:
    verdict, _ = progress.report(
        client,
        "job-1",
        attempt=attempt,
        seq=seq,
        done_seconds=done,
        total_seconds=100.0,
        segments=[_seg(i, attempt) for i in segs],
    )
    return verdict


def test_reports_apply_once_and_progress_never_decreases(clean_redis: redis.Redis) -> None:
    assert progress.standing(clean_redis, "job-1") is None
    assert _report(clean_redis, 1, 1, 30.0, [0, 1]) == progress.APPLIED
    assert _report(clean_redis, 1, 1, 30.0, [0, 1]) == progress.DUPLICATE  # a retried report
    assert _report(clean_redis, 1, 2, 20.0, [2]) == progress.APPLIED  # lower done_seconds
    standing = progress.standing(clean_redis, "job-1")
    assert standing is not None and standing.progress == pytest.approx(0.3)
    events = progress.events_after(clean_redis, "job-1")
    assert [e.type for e in events] == ["attempt", "segment", "segment", "progress"] + [
        "segment",
        "progress",
    ]
    assert [s["id"] for s in progress.current_segments(events)] == [0, 1, 2]
    # Resuming after an event id gives exactly the later events.
    later = progress.events_after(clean_redis, "job-1", after=events[3].id)
    assert [e.id for e in later] == [e.id for e in events[4:]]


def test_a_new_attempt_supersedes_earlier_segments(clean_redis: redis.Redis) -> None:
    _report(clean_redis, 1, 1, 50.0, [0, 1, 2])
    assert _report(clean_redis, 2, 1, 10.0, [0]) == progress.APPLIED
    assert _report(clean_redis, 1, 2, 90.0, [3]) == progress.STALE  # the first worker, late
    standing = progress.standing(clean_redis, "job-1")
    assert standing is not None and (standing.attempt, standing.progress) == (2, 0.1)
    segments = progress.current_segments(progress.events_after(clean_redis, "job-1"))
    assert [s["text"] for s in segments] == [" a2s0"]


def test_reports_are_bounded_and_keys_expire(clean_redis: redis.Redis) -> None:
    with pytest.raises(progress.ReportError):
        _report(clean_redis, 1, 1, 1.0, list(range(progress.MAX_SEGMENTS_PER_REPORT + 1)))
    with pytest.raises(progress.ReportError):
        _report(clean_redis, 0, 1, 1.0, [])
    _report(clean_redis, 1, 1, 1.0, [0])
    assert all(
        clean_redis.ttl(k) > progress.ENDED_TTL_S
        for k in clean_redis.keys("murmur:progress:job-1:*")
    )
    progress.mark_status(clean_redis, "job-1", ended=True)
    ttls = [clean_redis.ttl(k) for k in clean_redis.keys("murmur:progress:job-1:*")]
    assert len(ttls) == 2 and all(0 < t <= progress.ENDED_TTL_S for t in ttls)
