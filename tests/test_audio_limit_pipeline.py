"""On real parts: a worker that decodes past the job's limit fails it, and the client sees why."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from app.services import utc_clock
from tests.conftest import FIXTURES, LiveApi, api_get, auth, wait_for

pytestmark = pytest.mark.slow


def test_the_worker_enforces_the_limit_and_the_sync_client_gets_a_4xx(
    live_api: LiveApi, start_worker: Any
) -> None:
    from app.celery_config import make_celery
    from app.jobs.dispatch import dispatch_job

    answers: list[requests.Response] = []

    def transcribe() -> None:
        with (FIXTURES / "speech-90s.wav").open("rb") as fh:
            answers.append(
                requests.post(
                    f"{live_api.url}/v1/audio/transcriptions",
                    headers=auth(),
                    files={"file": ("talk.wav", fh)},
                    data={"model": "whisper-1"},
                    timeout=180,
                )
            )

    # No worker yet: the job is accepted under the 4 h limit and waits, queued.
    waiting = threading.Thread(target=transcribe, daemon=True)
    waiting.start()

    def queued() -> str | None:
        jobs = api_get(live_api, "/v1/jobs").json()["data"]
        return str(jobs[0]["id"]) if jobs else None

    job_id = wait_for(queued, 30, "the synchronous job to be accepted")
    # The operator lowers the limit before a worker claims it: the claim carries the new one.
    live_api.settings.__dict__["api"] = live_api.settings.api.model_copy(
        update={"max_audio_seconds": 60.0}
    )
    start_worker()
    assert dispatch_job(
        live_api.db, make_celery(live_api.settings), job_id, "local-cpu", now=utc_clock()
    )
    waiting.join(timeout=180)
    assert answers, "the synchronous request did not answer"
    response = answers[0]
    assert response.status_code == 400, response.text
    assert response.headers["x-should-retry"] == "false"
    assert response.json()["error"] == {
        "code": "audio_too_long",
        "message": "the audio lasts more than 60 s; the limit is 60 s",
        # OpenAI's ErrorResponse fields, as on every error of the OpenAI endpoints
        "type": "invalid_request_error",
        "param": "file",
        "job_id": job_id,
    }
    job = api_get(live_api, f"/v1/jobs/{job_id}").json()
    assert job["status"] == "failed"
    assert job["error"]["code"] == "audio_too_long"
