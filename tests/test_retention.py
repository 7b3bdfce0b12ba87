"""Retention: ended jobs lose their audio after `retention.audio_seconds`; owners purge jobs.

Runs on SQLite and PostgreSQL. The sweep is driven directly, and once through a real Celery
I/O worker (the task beat schedules); purges go through the HTTP API.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import tomllib
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from celery import Celery
from sqlalchemy import select, update

from app.celery_config import SWEEP_RETENTION, celery_config, make_celery
from app.config import Settings, load_settings
from app.db import Database
from app.jobs.retention import sweep_expired_audio
from app.models import Job, JobStatus, utcnow
from app.storage import LocalAudioStore
from tests.conftest import FIXTURES, OTHER_TOKEN, ROOT, LiveApi, Proc, auth, wait_for

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
TRANSCRIPT = {"text": "the quick brown fox", "language": "en", "segments": []}


def upload(client: Any, token: str | None = None) -> dict[str, Any]:
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(SPEECH), "a.wav")},
        headers=auth(token) if token else auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.get_data(as_text=True)
    body: dict[str, Any] = response.get_json()
    return body


def row(db: Database, job_id: str) -> Job | None:
    with db.session() as s:
        return s.get(Job, job_id)


def audio_path(settings: Settings, db: Database, job_id: str) -> Path:
    job = row(db, job_id)
    assert job is not None and job.audio_key is not None
    return Path(settings.storage_path) / job.audio_key


def end(db: Database, job_id: str, status: JobStatus, ago_seconds: float) -> None:
    """Play the end of a job, `ago_seconds` in the past (a worker's result, a cancel)."""
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                status=status.value,
                finished_at=utcnow() - timedelta(seconds=ago_seconds),
                transcript=TRANSCRIPT if status == JobStatus.SUCCEEDED else None,
            )
        )


def error_code(response: Any, status: int) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error"} and body["error"]["message"]
    return str(body["error"]["code"])


# --- purge ---------------------------------------------------------------------------------


def test_purge_removes_audio_transcript_and_job(
    client: Any, db: Database, settings: Settings
) -> None:
    job = upload(client)
    audio = audio_path(settings, db, job["id"])
    end(db, job["id"], JobStatus.SUCCEEDED, 5)
    assert client.get(f"/v1/jobs/{job['id']}/transcript", headers=auth()).status_code == 200

    response = client.delete(f"/v1/jobs/{job['id']}?purge=true", headers=auth())
    assert response.status_code == 204 and response.get_data() == b""

    assert not audio.exists()
    assert row(db, job["id"]) is None
    assert error_code(client.get(f"/v1/jobs/{job['id']}", headers=auth()), 404) == "job_not_found"
    transcript = client.get(f"/v1/jobs/{job['id']}/transcript", headers=auth())
    assert error_code(transcript, 404) == "job_not_found"
    listed = client.get("/v1/jobs", headers=auth()).get_json()["data"]
    assert job["id"] not in [j["id"] for j in listed]
    again = client.delete(f"/v1/jobs/{job['id']}?purge=true", headers=auth())
    assert error_code(again, 404) == "job_not_found"


def test_purge_after_cancel_and_after_retention(
    client: Any, db: Database, settings: Settings
) -> None:
    cancelled = upload(client)
    assert client.delete(f"/v1/jobs/{cancelled['id']}", headers=auth()).status_code == 200
    purged = client.delete(f"/v1/jobs/{cancelled['id']}?purge=1", headers=auth())
    assert purged.status_code == 204
    assert row(db, cancelled["id"]) is None

    swept = upload(client)  # its audio already went with retention: the purge still works
    end(db, swept["id"], JobStatus.FAILED, settings.retention.audio_seconds + 60)
    assert sweep_expired_audio(db, LocalAudioStore(settings.storage_path), settings, utcnow()) == 1
    assert client.delete(f"/v1/jobs/{swept['id']}?purge=true", headers=auth()).status_code == 204
    assert row(db, swept["id"]) is None
    assert list(Path(settings.storage_path).glob("*.audio")) == []


def test_purge_of_a_job_still_running_is_refused(
    client: Any, db: Database, settings: Settings
) -> None:
    job = upload(client)
    response = client.delete(f"/v1/jobs/{job['id']}?purge=true", headers=auth())
    assert error_code(response, 409) == "job_not_finished"
    assert "cancel it" in response.get_json()["error"]["message"]
    assert audio_path(settings, db, job["id"]).exists()
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()["status"] == "queued"


def test_purge_is_for_the_owner_only(client: Any, db: Database, settings: Settings) -> None:
    job = upload(client)
    end(db, job["id"], JobStatus.SUCCEEDED, 5)
    other = client.delete(f"/v1/jobs/{job['id']}?purge=true", headers=auth(OTHER_TOKEN))
    assert error_code(other, 404) == "job_not_found"
    assert audio_path(settings, db, job["id"]).exists()
    assert row(db, job["id"]) is not None


def test_purge_flag_must_be_a_boolean(client: Any, db: Database) -> None:
    job = upload(client)
    end(db, job["id"], JobStatus.SUCCEEDED, 5)
    response = client.delete(f"/v1/jobs/{job['id']}?purge=soon", headers=auth())
    assert error_code(response, 400) == "invalid_parameter"
    assert row(db, job["id"]) is not None


# --- the retention sweep -------------------------------------------------------------------


def test_sweep_deletes_only_audio_of_jobs_ended_long_enough_ago(
    client: Any, db: Database, settings: Settings
) -> None:
    keep = settings.retention.audio_seconds
    old_success = upload(client)
    old_failure = upload(client)
    recent = upload(client)
    waiting = upload(client)  # queued for longer than retention: must keep its audio
    end(db, old_success["id"], JobStatus.SUCCEEDED, keep + 60)
    end(db, old_failure["id"], JobStatus.FAILED, keep + 10)
    end(db, recent["id"], JobStatus.SUCCEEDED, keep - 60)
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == waiting["id"])
            .values(created_at=utcnow() - timedelta(seconds=keep * 2))
        )
    files = {
        j["id"]: audio_path(settings, db, j["id"])
        for j in (old_success, old_failure, recent, waiting)
    }
    store = LocalAudioStore(settings.storage_path)

    assert sweep_expired_audio(db, store, settings, utcnow()) == 2
    assert not files[old_success["id"]].exists() and not files[old_failure["id"]].exists()
    assert files[recent["id"]].exists() and files[waiting["id"]].exists()
    for job_id in (old_success["id"], old_failure["id"]):
        job = row(db, job_id)
        assert job is not None and job.audio_key is None
    # The job and its transcript stay: only the audio has a retention limit.
    kept = client.get(f"/v1/jobs/{old_success['id']}/transcript?format=txt", headers=auth())
    assert kept.status_code == 200 and "quick brown fox" in kept.get_data(as_text=True)
    assert sweep_expired_audio(db, store, settings, utcnow()) == 0  # idempotent


def test_sweep_works_in_batches(client: Any, db: Database, settings: Settings) -> None:
    jobs = [upload(client) for _ in range(5)]
    for job in jobs:
        end(db, job["id"], JobStatus.SUCCEEDED, settings.retention.audio_seconds + 1)
    small = settings.model_copy(
        update={"retention": settings.retention.model_copy(update={"batch_size": 2})}
    )
    store = LocalAudioStore(settings.storage_path)
    assert [sweep_expired_audio(db, store, small, utcnow()) for _ in range(4)] == [2, 2, 1, 0]
    assert list(Path(settings.storage_path).glob("*.audio")) == []


def test_sweep_finishes_what_a_crashed_sweep_left(
    client: Any, db: Database, settings: Settings
) -> None:
    job = upload(client)
    end(db, job["id"], JobStatus.SUCCEEDED, settings.retention.audio_seconds + 1)
    audio_path(settings, db, job["id"]).unlink()  # file gone, row not yet updated
    assert sweep_expired_audio(db, LocalAudioStore(settings.storage_path), settings, utcnow()) == 1
    swept = row(db, job["id"])
    assert swept is not None and swept.audio_key is None


def test_two_sweeps_at_once_delete_each_file_once(
    client: Any, db: Database, settings: Settings
) -> None:
    jobs = [upload(client) for _ in range(12)]
    for job in jobs:
        end(db, job["id"], JobStatus.SUCCEEDED, settings.retention.audio_seconds + 1)
    results: list[int] = []
    errors: list[BaseException] = []

    def sweep() -> None:
        other = Database(settings.database_url)  # as a second control worker would
        try:
            results.append(
                sweep_expired_audio(
                    other, LocalAudioStore(settings.storage_path), settings, utcnow()
                )
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            other.dispose()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sum(results) == 12  # each row cleared exactly once between the two
    with db.session() as s:
        left = s.execute(select(Job.id).where(Job.audio_key.is_not(None))).all()
    assert left == []
    assert list(Path(settings.storage_path).glob("*.audio")) == []


def test_stale_staging_files_are_removed(settings: Settings) -> None:
    import os
    import time

    store = LocalAudioStore(settings.storage_path)
    stale, fresh = store.staging_path(), store.staging_path()
    old = time.time() - 7200
    os.utime(stale, (old, old))
    assert store.remove_stale_staging(3600) == 1
    assert not stale.exists() and fresh.exists()


def test_beat_schedules_the_retention_sweep(settings: Settings) -> None:
    entry = celery_config(settings)["beat_schedule"]["retention"]
    assert entry["task"] == "murmur.control.sweep_retention"
    assert entry["schedule"] == settings.retention.sweep_interval_seconds
    assert entry["options"]["queue"] == "io"  # file and store I/O never delays the reconcile


@pytest.mark.slow
def test_the_io_worker_runs_the_sweep(live_api: LiveApi, io_worker: Proc) -> None:
    """The scheduled task, through the broker, on a real I/O worker."""
    response = requests.post(
        f"{live_api.url}/v1/jobs",
        files={"file": ("a.wav", SPEECH)},
        headers=auth(),
        timeout=30,
    )
    assert response.status_code == 202
    job_id = response.json()["id"]
    audio = audio_path(live_api.settings, live_api.db, job_id)
    end(live_api.db, job_id, JobStatus.SUCCEEDED, live_api.settings.retention.audio_seconds + 5)
    celery: Celery = make_celery(live_api.settings)
    try:
        SWEEP_RETENTION.send(celery)  # on the queue beat sends it to: `io`
        try:
            wait_for(lambda: not audio.exists(), 90, "the I/O worker to delete the audio")
            # The file goes first, then the row forgets it (a crash between leaves a key the
            # next sweep clears, never an unreferenced file): wait for the row too.
            wait_for(
                lambda: (job := row(live_api.db, job_id)) is not None and job.audio_key is None,
                30,
                "the row to forget its audio",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; I/O worker:\n{io_worker.output()[-3000:]}")
    finally:
        celery.close()


def test_validate_config_checks_the_retention_settings(tmp_path: Path) -> None:
    config = tmp_path / "murmur.toml"
    config.write_text("[retention]\naudio_seconds = -1\nbatch_size = 0\nkeep = 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "validate-config"],
        env={"PATH": "/usr/bin:/bin", "MURMUR_CONFIG": str(config)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "retention.audio_seconds: Input should be greater than or equal to 0" in result.stderr
    assert "retention.batch_size: Input should be greater than or equal to 1" in result.stderr
    assert "retention.keep: unknown field" in result.stderr


def test_the_example_config_documents_retention() -> None:
    raw = tomllib.loads((ROOT / "config" / "murmur.example.toml").read_text())
    assert set(raw["retention"]) == {"audio_seconds", "sweep_interval_seconds", "batch_size"}
    env = {"MURMUR_AUDIO_RETENTION_SECONDS": "3600"}
    assert (
        load_settings(ROOT / "config" / "murmur.example.toml", env).retention.audio_seconds == 3600
    )
