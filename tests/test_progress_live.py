"""Hot progress end to end: a real worker (faster-whisper on the CPU, tiny.en) reports at its
per-segment checkpoint and the job shows intermediate progress; the live view's segments are
the final transcript's, each once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from app.jobs import progress
from tests.conftest import REDIS_URL, LiveApi, api_get
from tests.test_cancel_running import live_api_env, long_speech, upload  # noqa: F401
from tests.test_pipeline import transcript, wait_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    # One database for the live run (SQLite, `make demo`'s; the streaming tests run on
    # PostgreSQL): the job's rows behave alike on both, as the parallel tier checks, and a
    # second live run costs the serial tier 80 s.
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]


def test_a_running_job_reports_progress_and_its_segments(
    live_api: LiveApi, start_worker: Any, tmp_path: Path
) -> None:
    start_worker()
    job = upload(live_api, long_speech(tmp_path / "long.wav"))
    seen: list[float] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        body = api_get(live_api, f"/v1/jobs/{job['id']}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            break
        if body["status"] == "running" and body["progress"] is not None:
            seen.append(body["progress"])
        time.sleep(0.3)
    done = wait_job(live_api, job["id"], timeout=30)
    assert done["status"] == "succeeded" and done["progress"] == 1.0
    assert seen == sorted(seen)  # never decreasing
    assert any(0 < p < 1 for p in seen), seen

    client = redis.Redis.from_url(REDIS_URL)
    live = progress.current_segments(progress.events_after(client, job["id"], count=100_000))
    final = transcript(live_api, job["id"], "verbose_json").json()["segments"]
    assert [s["text"] for s in live] == [s["text"] for s in final]
