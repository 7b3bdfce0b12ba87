"""One clock: every timestamp the API writes on a job or worker row comes from the injected
`Services.clock` (app/services.py), so a test (or a replay) controls them all."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

from app.config import Settings
from app.db import Database
from app.factory import create_app
from app.fleet.snapshot import as_utc
from app.models import Job, Worker, WorkerState
from tests.conftest import FIXTURES, FakeClock, add_worker, auth
from tests.test_worker_endpoints import TRANSCRIPT, call

T0 = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def _submit(client: Any) -> str:
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO((FIXTURES / "speech-short.wav").read_bytes()), "a.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.get_json()
    return str(response.get_json()["id"])


def _rows(db: Database, job_id: str, worker_id: str) -> tuple[Job, Worker]:
    with db.reader() as s:
        job, worker = s.get(Job, job_id), s.get(Worker, worker_id)
    assert job is not None and worker is not None
    return job, worker


def test_a_job_and_its_worker_are_stamped_by_the_injected_clock(
    settings: Settings, db: Database
) -> None:
    clock = FakeClock(T0)
    client = create_app(settings, db=db, clock=clock).test_client()
    worker = add_worker(db, state=WorkerState.READY)

    job_id = _submit(client)  # a live worker: routed in the same transaction
    job, _ = _rows(db, job_id, worker.id)
    assert as_utc(job.created_at) == T0 and as_utc(job.dispatched_at) == T0

    claimed_at = clock.advance(5)
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    job, row = _rows(db, job_id, worker.id)
    assert as_utc(job.started_at) == claimed_at
    assert as_utc(row.last_seen_at) == claimed_at and as_utc(row.first_job_at) == claimed_at

    heard_at = clock.advance(7)
    assert call(client, worker, "/heartbeat").status_code == 200
    assert as_utc(_rows(db, job_id, worker.id)[1].last_seen_at) == heard_at

    done_at = clock.advance(11)
    body = {"transcript": TRANSCRIPT, "processing_seconds": 1.0}
    assert call(client, worker, f"/jobs/{job_id}/result", body).get_json() == {"stored": True}
    job, row = _rows(db, job_id, worker.id)
    assert as_utc(job.finished_at) == done_at and as_utc(row.idle_since) == done_at

    other = _submit(client)
    cancelled_at = clock.advance(13)
    assert client.delete(f"/v1/jobs/{other}", headers=auth()).status_code == 200
    assert as_utc(_rows(db, other, worker.id)[0].finished_at) == cancelled_at
