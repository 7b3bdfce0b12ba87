"""The length limit on the API: measured at the door, carried to the worker, reported back."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import create_app
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.models import Worker, WorkerState
from tests.audio_encode import lying_flac
from tests.conftest import (
    API_TOKEN,
    OTHER_TOKEN,
    REDIS_URL,
    SIGNING_KEY,
    add_worker,
    auth,
    make_settings,
    wait_for,
)
from tests.serving import serving_audio


def _limited(settings: Settings, seconds: float) -> Settings:
    return settings.model_copy(
        update={"api": settings.api.model_copy(update={"max_audio_seconds": seconds})}
    )


def _upload(client: Any, data: bytes, path: str = "/v1/jobs") -> Any:
    return client.post(
        path,
        data={"file": (io.BytesIO(data), "a.flac")},
        headers=auth(),
        content_type="multipart/form-data",
    )


def _call(client: Any, worker: Worker, path: str, body: dict[str, Any] | None = None) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_header_that_understates_the_length_is_refused_and_leaves_nothing(
    settings: Settings, db: Database
) -> None:
    client = create_app(_limited(settings, 120), db=db).test_client()
    response = _upload(client, lying_flac(seconds=600, stated_seconds=10))
    assert response.status_code == 413
    assert response.get_json() == {
        "error": {
            "code": "audio_too_long",
            "message": "the audio lasts more than 120 s; the limit is 120 s"
            " (the setting api.max_audio_seconds)",
        }
    }
    assert not any(p.is_file() for p in Path(settings.storage_path).rglob("*"))


def test_the_claim_carries_the_measured_length_and_the_jobs_limit(
    settings: Settings, db: Database
) -> None:
    client = create_app(_limited(settings, 120), db=db).test_client()
    worker = add_worker(db, state=WorkerState.READY)
    response = _upload(client, lying_flac(seconds=60, stated_seconds=10))
    assert response.status_code == 202, response.get_json()
    claim = _call(client, worker, f"/jobs/{response.get_json()['id']}/claim").get_json()["job"]
    assert claim["duration_seconds"] == 60  # counted, not the header's 10
    assert claim["max_audio_seconds"] == 120


def test_a_workers_audio_too_long_reaches_the_client_as_a_4xx(
    settings: Settings, db: Database
) -> None:
    client = create_app(settings, db=db).test_client()
    worker = add_worker(db, state=WorkerState.READY)
    answers: list[Any] = []

    def transcribe() -> None:
        answers.append(_upload(client, lying_flac(5, 5), "/v1/audio/transcriptions"))

    waiting = threading.Thread(target=transcribe, daemon=True)
    waiting.start()

    def submitted() -> str | None:
        jobs = client.get("/v1/jobs", headers=auth()).get_json()["data"]
        return str(jobs[0]["id"]) if jobs else None

    job_id = wait_for(submitted, 30, "the synchronous job to be created")
    assert _call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    message = "the audio lasts more than 4 s; the limit is 4 s"
    failure = {"code": "audio_too_long", "message": message}
    assert _call(client, worker, f"/jobs/{job_id}/failure", failure).get_json() == {"stored": True}
    waiting.join(timeout=30)
    assert answers, "the synchronous request did not answer"
    response = answers[0]
    assert response.status_code == 400
    assert response.headers["x-should-retry"] == "false"
    body = response.get_json()["error"]
    assert (body["code"], body["message"], body["job_id"]) == ("audio_too_long", message, job_id)
    job = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "audio_too_long"


@pytest.fixture
def lying_audio_url() -> Iterator[str]:
    """A loopback server whose /lying.flac says 10 s in its header and lasts 600 s."""
    with serving_audio(lying_flac(seconds=600, stated_seconds=10), "lying.flac") as url:
        yield url


def test_a_url_whose_header_understates_the_length_fails_its_job(
    database_url: str,
    clean_redis: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lying_audio_url: str,
) -> None:
    from tasks import context
    from tasks.jobs import fetch_audio

    config = tmp_path / "murmur.toml"
    config.write_text("[api]\nmax_audio_seconds = 120\nallow_private_urls = true\n")
    env = {
        "MURMUR_CONFIG": str(config),
        "MURMUR_DATABASE_URL": database_url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
    }
    settings = make_settings(database_url, REDIS_URL, tmp_path, **env)
    db = Database(settings.database_url)
    try:
        client = create_app(settings, db=db).test_client()
        response = client.post("/v1/jobs", json={"url": lying_audio_url}, headers=auth())
        assert response.status_code == 202, response.get_json()
        job_id = response.get_json()["id"]
        for name, value in env.items():  # the control worker's environment
            monkeypatch.setenv(name, value)
        context.reset()
        try:
            fetch_audio.run(job_id)
        finally:
            context.reset()
        job = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
    finally:
        db.dispose()
    assert job["status"] == "failed"
    assert job["error"] == {
        "code": "audio_too_long",
        "message": "the audio lasts more than 120 s; the limit is 120 s"
        " (the setting api.max_audio_seconds)",
    }
    assert not any(p.is_file() for p in Path(settings.storage_path).rglob("*"))
