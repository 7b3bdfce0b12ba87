"""A URL fetch waiting for a slot is retried until its own deadline, not Celery's default cap
(issue 32 §5): `self.retry(max_retries=None)` alone means "the task's default" (3), so the 4th
"no slot free" raised MaxRetriesExceededError and the job sat queued until the 10-minute
resend sweep. Real processes: the API and an I/O worker; the URLs are on a loopback server."""

from __future__ import annotations

import time
import wave
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from app.credentials import token_fingerprint
from app.jobs.io_slots import IoSlots
from tests.conftest import API_TOKEN, LiveApi, Proc, auth
from tests.serving import serving_audio

pytestmark = [pytest.mark.slow, pytest.mark.serial]

# Longer than the first three back-offs together (busy_countdown: at most 1 + 2 + 4 s), so
# that every waiting fetch meets "no slot" a fourth time while the slots are held.
HOLD_SECONDS = 12.0


@pytest.fixture()
def audio_url(tmp_path: Path) -> Iterator[str]:
    wav = tmp_path / "a.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x01\x00" * 16000 * 2)
    with serving_audio(wav.read_bytes(), "a.wav") as url:
        yield url


def _job(live: LiveApi, job_id: str) -> dict[str, Any]:
    response = requests.get(f"{live.url}/v1/jobs/{job_id}", headers=auth(), timeout=10)
    return dict(response.json())


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_fetches_waiting_for_a_slot_outlast_celery_s_retry_cap(
    live_api: LiveApi, io_worker: Proc, audio_url: str
) -> None:
    settings = live_api.settings
    slots = IoSlots(redis.Redis.from_url(settings.redis_url), settings.io)
    owner = token_fingerprint(API_TOKEN)
    jobs: list[str] = []
    with ExitStack() as held:
        for _ in range(settings.io.fetches_per_token):  # every slot of the token, held
            held.enter_context(slots.held(slots.fetches, owner))
        for _ in range(settings.io.fetches_per_token + 1):  # more jobs than it has slots
            answer = requests.post(
                f"{live_api.url}/v1/jobs", json={"url": audio_url}, headers=auth(), timeout=30
            )
            assert answer.status_code == 202, answer.text
            jobs.append(answer.json()["id"])
        time.sleep(HOLD_SECONDS)
        assert all(_job(live_api, j)["duration_seconds"] is None for j in jobs)
    # The slots are free: every fetch, still retrying, gets its audio (the next back-off is
    # at most 30 s; the resend sweep would take 10 minutes).
    deadline = time.monotonic() + 90
    pending = set(jobs)
    while pending and time.monotonic() < deadline:
        pending = {j for j in pending if _job(live_api, j)["duration_seconds"] is None}
        time.sleep(0.5)
    assert not pending, (
        [_job(live_api, j) for j in pending],
        io_worker.output()[-3000:],
    )
    assert all(_job(live_api, j)["status"] == "queued" for j in jobs)
    assert "MaxRetriesExceeded" not in io_worker.output()
