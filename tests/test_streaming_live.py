"""Watching a job happen, end to end: a real worker (faster-whisper on the CPU, tiny.en) reports
its segments and the API streams them — OpenAI's SDK with `stream=True`, the job's Server-Sent
Events with a resume, and a job whose worker is killed mid-way and redelivered (issue 30). The
job's progress on a long file: tests/test_progress_live.py."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import redis
import requests
from celery import Celery
from openai import OpenAI

from app.cli_follow import parse_events, segment_line
from app.jobs.dispatch import dispatch_job, requeue_job, withdraw_messages
from app.models import Job, JobStatus
from app.services import utc_clock
from tests.conftest import API_TOKEN, FIXTURES, REDIS_URL, LiveApi, api_get, auth, wait_for
from tests.test_cancel_running import TINY_PROFILE, long_speech, upload
from tests.test_cli import client_env, murmur
from tests.test_pipeline import transcript

# `serial`: the first delta's time is compared with the whole job's, which a parallel test
# sharing the two cores would skew. On PostgreSQL alone, production's database (the progress
# test runs live on SQLite): the rows behave alike on both, as the parallel tier checks, and a
# second live run of each would cost the serial tier over two minutes.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
]

SCHEMAS = json.loads((FIXTURES / "openai-audio-models-schemas.json").read_text())
STREAM_EVENT = jsonschema_rs.validator_for(
    {"$ref": "#/components/schemas/CreateTranscriptionResponseStreamEvent", **SCHEMAS}
)


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_PROFILE)
    return {"MURMUR_CONFIG": str(config), "MURMUR_STREAM_HEARTBEAT_SECONDS": "2"}


def sse_events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """{"id", "event", "data"} per event, read as the CLI reads them."""
    return parse_events(response.iter_lines(decode_unicode=True))


def open_events(live: LiveApi, job_id: str, last_id: str | None = None) -> requests.Response:
    headers = {**auth(), **({"Last-Event-ID": last_id} if last_id else {})}
    response = requests.get(
        f"{live.url}/v1/jobs/{job_id}/events", headers=headers, stream=True, timeout=60
    )
    assert response.status_code in (200, 204), response.text
    return response


def test_the_sdk_streams_a_long_file_as_it_is_transcribed(
    live_api: LiveApi, start_worker: Any, tmp_path: Path
) -> None:
    start_worker()
    client = OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)
    events: list[tuple[float, dict[str, Any]]] = []
    started = time.monotonic()
    with long_speech(tmp_path / "six-minutes.wav", 4).open("rb") as fh:
        stream = client.audio.transcriptions.create(model="whisper-1", file=fh, stream=True)
        for event in stream:
            events.append((time.monotonic() - started, event.model_dump(exclude_none=True)))
    deltas = [(t, e) for t, e in events if e["type"] == "transcript.text.delta"]
    done_at, done = events[-1]
    assert done["type"] == "transcript.text.done"
    for _, event in events:
        STREAM_EVENT.validate(event)
    assert len(deltas) >= 2
    assert deltas[0][0] < 0.75 * done_at, (deltas[0][0], done_at)
    assert "".join(e["delta"] for _, e in deltas) == done["text"]
    # The text is the job's stored transcript, as the non-streaming answer gives it.
    job_id = api_get(live_api, "/v1/jobs").json()["data"][0]["id"]
    assert transcript(live_api, job_id, "json").json()["text"] == done["text"]
    assert done["usage"]["output_tokens"] > 0 and done["usage"]["type"] == "tokens"


def test_a_failed_job_ends_the_sdk_stream_with_an_error(live_api: LiveApi) -> None:
    """No worker: the job is cancelled while the stream waits; the SDK raises, not truncates."""
    client = OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)

    def cancel_the_job() -> None:
        def queued() -> str | None:
            data = api_get(live_api, "/v1/jobs").json()["data"]
            return data[0]["id"] if data else None

        job_id = wait_for(queued, 30, "the streamed job to be stored")
        requests.delete(f"{live_api.url}/v1/jobs/{job_id}", headers=auth(), timeout=10)

    threading.Timer(0.5, cancel_the_job).start()
    with (FIXTURES / "speech-short.wav").open("rb") as fh:
        stream = client.audio.transcriptions.create(model="whisper-1", file=fh, stream=True)
        with pytest.raises(Exception) as raised:
            list(stream)
    assert "cancelled" in str(raised.value)


def test_the_events_stream_resumes_without_repeats(
    live_api: LiveApi, start_worker: Any, tmp_path: Path
) -> None:
    start_worker()
    job = upload(live_api, long_speech(tmp_path / "three-minutes.wav", 2))
    first = open_events(live_api, job["id"])
    seen: list[dict[str, Any]] = []
    for event in sse_events(first):
        seen.append(event)
        if sum(e["event"] == "segment" for e in seen) >= 2:
            break
    first.close()  # the client drops mid-stream
    resumed = open_events(live_api, job["id"], seen[-1]["id"])
    rest = list(sse_events(resumed))
    assert rest[-1]["event"] == "done" and rest[-1]["data"]["status"] == "succeeded"
    ids = [e["id"] for e in seen + rest]
    assert len(ids) == len(set(ids))  # no event twice
    segments = [e["data"] for e in seen + rest if e["event"] == "segment"]
    final = transcript(live_api, job["id"], "verbose_json").json()["segments"]
    assert [s["text"] for s in segments] == [s["text"] for s in final]
    progress = [e["data"]["progress"] for e in seen + rest if e["event"] == "progress"]
    assert progress == sorted(progress) and all(0 < p < 1 for p in progress)
    # After done, a resume is told there is nothing more; a fresh stream replays it all.
    assert open_events(live_api, job["id"], rest[-1]["id"]).status_code == 204
    replay = list(sse_events(open_events(live_api, job["id"])))
    assert [e["data"]["text"] for e in replay if e["event"] == "segment"] == [
        s["text"] for s in final
    ]
    assert [e["event"] for e in replay][0] == "status" and replay[-1]["event"] == "done"


def test_a_job_redelivered_mid_way_streams_each_segment_once(
    live_api: LiveApi, start_worker: Any, tmp_path: Path
) -> None:
    _, first_worker = start_worker()
    job = upload(live_api, long_speech(tmp_path / "six-minutes.wav", 4))
    stream = open_events(live_api, job["id"])
    events = sse_events(stream)
    seen: list[dict[str, Any]] = []
    for event in events:
        seen.append(event)
        if event["event"] == "segment":
            break
    first_worker.popen.send_signal(signal.SIGKILL)  # mid-way: no result, no failure report
    first_worker.popen.wait(30)
    # What the fleet does for a worker that died: the job back to the queue, its message
    # withdrawn, then dispatched to the next worker of the profile.
    assert requeue_job(live_api.db, job["id"], "local-cpu")
    withdraw_messages(redis.Redis.from_url(REDIS_URL), "local-cpu", [job["id"]])
    start_worker()
    celery = Celery(broker=live_api.settings.redis_url)
    assert dispatch_job(live_api.db, celery, job["id"], "local-cpu", now=utc_clock())
    for event in events:
        seen.append(event)
    assert seen[-1]["event"] == "done" and seen[-1]["data"]["status"] == "succeeded"
    kinds = [e["event"] for e in seen]
    assert kinds.count("attempt") == 1
    assert seen[kinds.index("attempt")]["data"] == {"attempt": 2, "superseded": True}
    after = seen[kinds.index("attempt") + 1 :]
    final = transcript(live_api, job["id"], "verbose_json").json()["segments"]
    assert [e["data"]["text"] for e in after if e["event"] == "segment"] == [
        s["text"] for s in final
    ]
    texts = [s["text"] for s in final]
    assert len(texts) == len(set(zip(texts, [s["start"] for s in final], strict=True)))
    with live_api.db.session() as s:
        row = s.get(Job, job["id"])
        assert row is not None and row.attempts == 2 and row.status == JobStatus.SUCCEEDED.value


def test_the_cli_follows_a_job_to_its_end(
    live_api: LiveApi, start_worker: Any, tmp_path: Path
) -> None:
    start_worker()
    env = client_env(live_api)
    path = long_speech(tmp_path / "three-minutes.wav", 2)
    followed = murmur(["submit", str(path), "--follow", "--progress"], env, timeout=300)
    assert followed.returncode == 0, followed.stderr
    job_id = api_get(live_api, "/v1/jobs").json()["data"][0]["id"]
    final = transcript(live_api, job_id, "verbose_json").json()["segments"]
    assert followed.stdout.splitlines() == [segment_line(s) for s in final]
    # The bar is driven by real progress: seconds of audio done of the total, with an ETA.
    total = api_get(live_api, f"/v1/jobs/{job_id}").json()["duration_seconds"]
    assert re.search(rf"\b\d+/{total:.0f} s audio, eta \d+ s", followed.stderr), followed.stderr
    assert f"{job_id} running" in followed.stderr and "100%" in followed.stderr
    # Following an ended job replays it.
    again = murmur(["follow", job_id, "--no-progress"], env)
    assert again.returncode == 0 and again.stdout == followed.stdout
