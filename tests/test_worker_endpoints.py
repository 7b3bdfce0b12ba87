"""The workers' side door: one worker per job, results only from the holder, hand-back, liveness."""

from __future__ import annotations

import io
from typing import Any

from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.models import Job, Worker, WorkerState
from gpu_worker.protocol import routes
from tests.conftest import FIXTURES, SIGNING_KEY, add_worker, auth

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
TRANSCRIPT = {"text": "hello", "segments": [{"start": 0.0, "end": 1.0, "text": "hello"}]}


def submit(client: Any) -> str:
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(SPEECH), "a.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202
    return str(response.get_json()["id"])


def call(client: Any, worker: Worker, path: str, body: dict[str, Any] | None = None) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {token}"},
    )


def test_every_protocol_route_is_served(client: Any) -> None:
    served = {
        (rule.rule, method)
        for rule in client.application.url_map.iter_rules()
        for method in rule.methods or ()
    }
    worker_routes = (
        routes.READY,
        routes.HEARTBEAT,
        routes.REPORT,
        routes.CLAIM,
        routes.STATUS,
        routes.RELEASE,
        routes.RESULT,
        routes.FAILURE,
        routes.PROGRESS,
        routes.BOOT_FAILURE,
    )
    for route in worker_routes:
        rule = routes.flask_rule(routes.INTERNAL_PREFIX, routes.WORKER_PREFIX, route)
        assert (rule, "POST") in served, rule
    assert (routes.flask_rule(routes.INTERNAL_PREFIX, routes.AUDIO), "GET") in served


def test_a_job_runs_on_one_worker_and_only_its_holder_may_finish_it(
    client: Any, db: Database
) -> None:
    first = add_worker(db, state=WorkerState.READY)
    second = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, first, f"/jobs/{job_id}/claim").status_code == 200
    # A second delivery of the same message to another live worker is refused...
    refused = call(client, second, f"/jobs/{job_id}/claim")
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "job_not_claimable"
    # ...and that worker's word on the job is ignored.
    answer = call(
        client,
        second,
        f"/jobs/{job_id}/result",
        {"transcript": TRANSCRIPT, "processing_seconds": 1.0},
    )
    assert answer.get_json() == {"stored": False}
    assert call(
        client, second, f"/jobs/{job_id}/failure", {"code": "worker_error", "message": "x"}
    ).get_json() == {"stored": False}
    assert client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()["status"] == "running"
    stored = call(
        client,
        first,
        f"/jobs/{job_id}/result",
        {"transcript": TRANSCRIPT, "processing_seconds": 1.0},
    )
    assert stored.get_json() == {"stored": True}
    assert client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()["text"] == "hello"


def test_a_handed_back_job_goes_to_the_next_worker(client: Any, db: Database) -> None:
    draining = add_worker(db, state=WorkerState.READY)
    fresh = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, draining, f"/jobs/{job_id}/claim").status_code == 200
    assert call(client, draining, f"/jobs/{job_id}/release").get_json() == {"released": True}
    assert client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()["status"] == "dispatched"
    assert call(client, fresh, f"/jobs/{job_id}/claim").status_code == 200
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.worker_id == fresh.id and job.attempts == 2
        holder = s.get(Worker, draining.id)
        assert holder is not None and holder.current_job_id is None


def test_a_dead_holders_job_can_be_claimed_again(client: Any, db: Database) -> None:
    dead = add_worker(db, state=WorkerState.READY)
    other = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, dead, f"/jobs/{job_id}/claim").status_code == 200
    with db.session() as s:
        row = s.get(Worker, dead.id)
        assert row is not None
        row.state = WorkerState.DELETED.value
    assert call(client, other, f"/jobs/{job_id}/claim").status_code == 200


def test_too_many_attempts_fails_the_job_visibly(
    client: Any, db: Database, settings: Settings
) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    for _ in range(settings.fleet.max_attempts):
        assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 409
    job = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "too_many_attempts"


def test_heartbeat_marks_the_worker_seen_and_needs_its_credential(
    client: Any, db: Database
) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    assert call(client, worker, "/heartbeat").get_json() == {"ok": True}
    with db.reader() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.last_seen_at is not None
    forged = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}/heartbeat",
        headers={"Authorization": "Bearer " + "0" * 64},
    )
    assert forged.status_code == 401
    assert forged.get_json()["error"]["code"] == "unauthorized"
    other_instance = client.post(
        f"/internal/workers/{worker.id}/not-its-instance/heartbeat",
        headers={
            "Authorization": "Bearer "
            + InstanceCredential.derive(SIGNING_KEY, worker.id, "not-its-instance").token
        },
    )
    assert other_instance.status_code == 403
    assert other_instance.get_json()["error"]["code"] == "unknown_worker"


def test_the_worker_heartbeat_reaches_the_control_plane(live_api: Any) -> None:
    from pydantic import SecretStr

    from gpu_worker.client import ControlPlaneClient
    from gpu_worker.heartbeat import Heartbeat

    worker = add_worker(live_api.db, state=WorkerState.READY)
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token

    def beat(secret: str) -> bool:
        client = ControlPlaneClient(
            live_api.url, worker.id, worker.instance_id or "", SecretStr(secret)
        )
        return Heartbeat(client, interval_seconds=30).beat()

    assert beat(token) is True
    with live_api.db.reader() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.last_seen_at is not None
    assert beat("0" * 64) is False  # a forged credential is refused, and the thread goes on


RESULT = {"transcript": TRANSCRIPT, "processing_seconds": 1.0}


def _jobs_done(db: Database, worker: Worker) -> int:
    with db.reader() as s:
        row = s.get(Worker, worker.id)
        assert row is not None
        return row.jobs_done


def test_a_refused_result_frees_the_worker_but_is_not_counted(client: Any, db: Database) -> None:
    holder = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    assert call(client, holder, f"/jobs/{job_id}/claim").status_code == 200
    assert client.delete(f"/v1/jobs/{job_id}", headers=auth()).status_code == 200
    late = call(client, holder, f"/jobs/{job_id}/result", RESULT)
    assert late.get_json() == {"stored": False}
    failure = call(
        client, holder, f"/jobs/{job_id}/failure", {"code": "cancelled", "message": "stopped"}
    )
    assert failure.get_json() == {"stored": False}
    assert _jobs_done(db, holder) == 0
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "cancelled" and job.transcript is None
        row = s.get(Worker, holder.id)
        assert row is not None and row.current_job_id is None and row.idle_since is not None
    # A stored result still counts.
    other = submit(client)
    assert call(client, holder, f"/jobs/{other}/claim").status_code == 200
    stored = call(client, holder, f"/jobs/{other}/result", RESULT)
    assert stored.get_json() == {"stored": True}
    assert _jobs_done(db, holder) == 1


def _audio_path(client: Any, worker: Worker, job_id: str) -> str:
    claimed = call(client, worker, f"/jobs/{job_id}/claim")
    assert claimed.status_code == 200
    url: str = claimed.get_json()["job"]["audio_url"]
    return url[url.index("/internal/audio/") :]


def test_a_signed_audio_url_stops_working_once_the_job_is_not_running(
    client: Any, db: Database
) -> None:
    # Each job is submitted beside an idle worker, which claims it (a token's second job is
    # not dispatched at submission while its first waits on the queue: app/jobs/service.py).
    worker, other, third = (add_worker(db, state=WorkerState.READY) for _ in range(3))
    finished = submit(client)
    path = _audio_path(client, worker, finished)
    cancelled = submit(client)
    cancelled_path = _audio_path(client, other, cancelled)
    handed_back = submit(client)
    released_path = _audio_path(client, third, handed_back)

    assert client.get(path).status_code == 200
    assert call(client, worker, f"/jobs/{finished}/result", RESULT).get_json() == {"stored": True}
    assert client.delete(f"/v1/jobs/{cancelled}", headers=auth()).status_code == 200
    assert call(client, third, f"/jobs/{handed_back}/release").get_json() == {"released": True}

    for stale in (path, cancelled_path, released_path):
        refused = client.get(stale)
        assert refused.status_code == 410, stale
        assert refused.get_json()["error"]["code"] == "audio_url_expired"
        assert "sig=" not in refused.get_json()["error"]["message"]


def test_a_signed_audio_url_serves_only_the_claim_that_issued_it(client: Any, db: Database) -> None:
    """A URL from an earlier claim stays refused while the job runs again (issue 10, L4)."""
    first = add_worker(db, state=WorkerState.READY)
    second = add_worker(db, state=WorkerState.READY)
    job_id = submit(client)
    earlier = _audio_path(client, first, job_id)
    assert call(client, first, f"/jobs/{job_id}/release").get_json() == {"released": True}
    current = _audio_path(client, second, job_id)  # running again, on another worker
    assert client.get(current).status_code == 200
    refused = client.get(earlier)
    assert refused.status_code == 410, refused.get_json()
    assert refused.get_json()["error"]["code"] == "audio_url_expired"

    # The same worker claiming again (a redelivery) gets a new URL; the old one stops.
    again = _audio_path(client, second, job_id)
    assert client.get(again).status_code == 200
    assert client.get(current).status_code == 410

    # The claim named in the URL is signed: naming the current holder instead is refused.
    forged = earlier.replace(f"worker={first.id}", f"worker={second.id}").replace(
        "attempt=1", "attempt=3"
    )
    assert forged != earlier
    assert client.get(forged).status_code == 403
    assert client.get(forged).get_json()["error"]["code"] == "invalid_signature"
