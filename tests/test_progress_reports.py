"""The worker's progress report route (routes.PROGRESS): held jobs only, once per seq, bounded,
a redelivered job's new attempt superseding the first worker's segments."""

from __future__ import annotations

from typing import Any

import redis

from app.db import Database
from app.jobs import progress
from app.models import WorkerState
from tests.conftest import add_worker, auth
from tests.test_worker_endpoints import TRANSCRIPT, call, submit


def _body(seq: int, done: float, texts: list[str]) -> dict[str, Any]:
    segments = [
        {"id": i, "start": float(i), "end": i + 1.0, "text": t} for i, t in enumerate(texts)
    ]
    return {"seq": seq, "done_seconds": done, "total_seconds": 10.0, "segments": segments}


def test_progress_reports_reach_the_hot_store_once(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    first = add_worker(db, state=WorkerState.READY)
    second = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    path = f"/jobs/{job_id}/progress"
    # Not claimed yet: not this worker's job.
    assert call(client, first, path, _body(1, 1.0, ["x"])).get_json() == {"accepted": False}
    assert call(client, first, f"/jobs/{job_id}/claim").status_code == 200
    for _ in range(2):  # a retried report is applied once
        answer = call(client, first, path, _body(1, 4.0, [" one"]))
        assert answer.status_code == 200 and answer.get_json() == {"accepted": True}
    standing = progress.standing(clean_redis, job_id)
    assert standing is not None and (standing.attempt, standing.progress) == (1, 0.4)
    assert len(progress.current_segments(progress.events_after(clean_redis, job_id))) == 1

    # Redelivered: the second worker's claim is attempt 2; the first one's reports are refused.
    assert call(client, first, f"/jobs/{job_id}/release").get_json() == {"released": True}
    assert call(client, second, f"/jobs/{job_id}/claim").status_code == 200
    assert call(client, first, path, _body(2, 9.0, [" late"])).get_json() == {"accepted": False}
    assert call(client, second, path, _body(1, 2.0, [" two"])).get_json() == {"accepted": True}
    events = progress.events_after(clean_redis, job_id)
    assert [s["text"] for s in progress.current_segments(events)] == [" two"]
    assert any(e.type == "attempt" and e.attempt == 2 for e in events)


def test_progress_reports_are_bounded_and_authenticated(client: Any, db: Database) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    too_many = call(client, worker, f"/jobs/{job_id}/progress", _body(1, 1.0, ["x"] * 65))
    assert too_many.status_code == 400
    assert too_many.get_json()["error"]["code"] == "invalid_body"
    forged = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}/jobs/{job_id}/progress",
        json=_body(1, 1.0, []),
        headers={"Authorization": "Bearer nope"},
    )
    assert forged.status_code == 401


def test_the_job_shows_progress_from_the_reports(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    queued = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
    assert queued["progress"] == 0.0 and queued["eta_seconds"] is None
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    seen = []
    for seq, done in enumerate((2.5, 5.0, 3.0), start=1):  # a lower report never lowers it
        assert (
            call(client, worker, f"/jobs/{job_id}/progress", _body(seq, done, [])).status_code
            == 200
        )
        seen.append(client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()["progress"])
    assert seen == [0.25, 0.5, 0.5]
    finished = call(
        client,
        worker,
        f"/jobs/{job_id}/result",
        {"transcript": TRANSCRIPT, "processing_seconds": 1.0},
    )
    assert finished.status_code == 200
    done = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
    assert done["status"] == "succeeded" and done["progress"] == 1.0


def test_a_stored_outcome_shortens_the_live_views_expiry(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    assert (
        call(client, worker, f"/jobs/{job_id}/progress", _body(1, 5.0, [" x"])).status_code == 200
    )
    assert clean_redis.ttl(f"murmur:progress:{job_id}:events") > progress.ENDED_TTL_S
    body = {"transcript": TRANSCRIPT, "processing_seconds": 1.0}
    assert call(client, worker, f"/jobs/{job_id}/result", body).get_json() == {"stored": True}
    assert 0 < clean_redis.ttl(f"murmur:progress:{job_id}:events") <= progress.ENDED_TTL_S
