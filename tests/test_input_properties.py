"""Property tests: no job submission and no worker result, however hostile, reaches a 5xx.

Through the real Flask app on SQLite and PostgreSQL (the `database_url` fixture) with real
Redis: arbitrary text, Unicode, nesting and types in every field and header. Every refusal
is the JSON error shape with a code, and a refused request leaves no file in the audio store.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import event, example, given
from hypothesis import strategies as st

from app import create_app
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.models import WorkerState
from tests.conftest import FIXTURES, REDIS_URL, SIGNING_KEY, add_worker, auth, make_settings
from tests.hostile import (
    PROPERTY_SETTINGS,
    assert_answer,
    dumps,
    encodable_texts,
    extra_headers,
    header_texts,
    json_values,
    mutated_audio,
    mutations,
    nasty_floats,
    numbers,
    pin_urls,
    raw_bodies,
    replaced,
    stored_files,
    strict_json,
    texts,
)

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
JSON_FIELDS = ["url", "language", "prompt", "word_timestamps", "webhook_url"]
FORM_FIELDS = ["language", "prompt", "word_timestamps", "webhook_url"]
FORMATS = ("json", "verbose_json", "txt", "srt", "vtt")


@pytest.fixture()
def app_settings(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Settings:
    # Private URLs allowed so that loopback URL jobs are accepted and reach the database;
    # nothing fetches them (no control worker runs in these tests).
    settings = make_settings(database_url, REDIS_URL, tmp_path)
    return settings.model_copy(
        update={"api": settings.api.model_copy(update={"allow_private_urls": True})}
    )


@pytest.fixture()
def api(app_settings: Settings) -> Iterator[tuple[Any, Database]]:
    database = Database(app_settings.database_url)
    yield create_app(app_settings, db=database).test_client(), database
    database.dispose()


def _headers(key: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    # Drawn headers replace the defaults, the bearer token included (then: 401 in the shape).
    headers = {**auth(), **(extra or {})}
    if key is not None:
        headers["Idempotency-Key"] = key
    return headers


def _check_files(settings: Settings, before: set[Path], response: Any) -> None:
    after = stored_files(settings.storage_path)
    staging = Path(settings.storage_path) / ".staging"
    assert not any(p.parent == staging for p in after), "a staged upload was left behind"
    if response.status_code >= 400:
        assert after == before, f"refused with {response.status_code}, files left behind"
    else:
        assert len(after - before) <= 1 and before <= after


VALID_URL_JOB = {
    "url": "http://127.0.0.1:9/a.wav",
    "language": "en",
    "prompt": "names: Ada",
    "word_timestamps": True,
}
json_bodies = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(JSON_FIELDS), texts), json_values, max_size=6),
    mutations(VALID_URL_JOB),
    mutations(VALID_URL_JOB, texts),  # right types, hostile text
    json_values,
).map(pin_urls)


@PROPERTY_SETTINGS
@given(
    body=st.one_of(json_bodies.map(dumps), raw_bodies),
    key=st.one_of(st.none(), header_texts),
    headers=extra_headers,
    content_type=st.sampled_from(
        ["application/json", "application/json; charset=utf-8", "text/plain", "application/x"]
    ),
)
# The inputs of issue 10 run on every run, whatever else is drawn.
@example(body="[" * 100_000, key=None, headers={}, content_type="application/json")
@example(
    body='{"url": "http://127.0.0.1:9/\\ud800"}',
    key=None,
    headers={},
    content_type="application/json",
)
@example(
    body='{"url": "http://127.0.0.1:9/a", "prompt": "a\\u0000"}',
    key="k",
    headers={},
    content_type="application/json",
)
def test_json_submissions_never_fail_the_server(
    api: tuple[Any, Database],
    app_settings: Settings,
    body: str,
    key: str | None,
    headers: dict[str, str],
    content_type: str,
) -> None:
    client, _ = api
    before = stored_files(app_settings.storage_path)
    response = client.post(
        "/v1/jobs",
        data=body.encode("utf-8", "surrogatepass"),
        headers=_headers(key, headers),
        content_type=content_type,
    )
    answer = assert_answer(response)
    event(f"answered {response.status_code}")
    if response.status_code == 202:
        assert answer["source"] == "url" and answer["id"]
    _check_files(app_settings, before, response)


@PROPERTY_SETTINGS
@given(
    fields=st.dictionaries(
        st.one_of(st.sampled_from(FORM_FIELDS), encodable_texts), encodable_texts, max_size=5
    ),
    audio=st.one_of(st.none(), st.just(SPEECH), st.binary(max_size=512), mutated_audio(SPEECH)),
    filename=encodable_texts,
    key=st.one_of(st.none(), header_texts),
    headers=extra_headers,
)
@example(fields={"prompt": "a\x00"}, audio=SPEECH, filename="../../etc/x", key=None, headers={})
@example(fields={}, audio=SPEECH, filename="\u202egnp.exe", key="k\x00", headers={})
def test_uploads_never_fail_the_server_nor_leave_files(
    api: tuple[Any, Database],
    app_settings: Settings,
    fields: dict[str, str],
    audio: bytes | None,
    filename: str,
    key: str | None,
    headers: dict[str, str],
) -> None:
    client, _ = api
    form: dict[str, Any] = {k: v for k, v in pin_urls(fields).items() if k != "file"}
    if audio is not None:
        form["file"] = (io.BytesIO(audio), filename)
    before = stored_files(app_settings.storage_path)
    response = client.post(
        "/v1/jobs", data=form, headers=_headers(key, headers), content_type="multipart/form-data"
    )
    answer = assert_answer(response)
    event(f"answered {response.status_code}")
    if response.status_code == 202:
        shown = answer["filename"]
        assert shown is None or ("/" not in shown and "\u202e" not in shown and len(shown) <= 255)
    _check_files(app_settings, before, response)


VALID_RESULT = {
    "transcript": {
        "text": "Hello there.",
        "language": "en",
        "duration": 6.6,
        "segments": [
            {
                "id": 0,
                "start": 0.0,
                "end": 3.2,
                "text": " Hello there.",
                "tokens": [50364, 2425],
                "avg_logprob": -0.2,
                "no_speech_prob": 0.01,
                "compression_ratio": 1.2,
                "temperature": 0.0,
                "words": [{"word": "Hello", "start": 0.0, "end": 0.4, "probability": 0.9}],
            }
        ],
    },
    "processing_seconds": 1.5,
}


@PROPERTY_SETTINGS
@given(
    body=st.one_of(
        mutations(VALID_RESULT).map(dumps),
        mutations(VALID_RESULT, numbers).map(dumps),  # right shape, hostile numbers
        mutations(VALID_RESULT, nasty_floats).map(dumps),
        mutations(VALID_RESULT, texts).map(dumps),
        json_values.map(dumps),
        raw_bodies,
    )
)
@example(body=dumps(replaced(VALID_RESULT, [(("transcript", "segments", 0, "end"), math.inf)])))
@example(body=dumps(VALID_RESULT).replace('"duration": 6.6', '"duration": 1e400'))
def test_worker_results_never_fail_the_server_nor_break_the_api_json(
    api: tuple[Any, Database], body: str
) -> None:
    client, db = api
    worker = add_worker(db, state=WorkerState.READY)
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    base = f"/internal/workers/{worker.id}/{worker.instance_id}"
    submitted = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(SPEECH), "a.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    job_id = submitted.get_json()["id"]
    claim = client.post(f"{base}/jobs/{job_id}/claim", headers={"Authorization": f"Bearer {token}"})
    assert claim.status_code == 200
    response = client.post(
        f"{base}/jobs/{job_id}/result",
        data=body.encode("utf-8", "surrogatepass"),
        headers={"Authorization": f"Bearer {token}"},
        content_type="application/json",
    )
    answer = assert_answer(response)
    event(f"answered {response.status_code} {answer if response.status_code == 200 else ''}")
    # Whatever was stored, every way of reading it back is a 2xx in strict JSON (or text).
    listing = client.get("/v1/jobs?limit=100", headers=auth())
    assert listing.status_code == 200
    strict_json(listing.get_data())
    job = assert_answer(client.get(f"/v1/jobs/{job_id}", headers=auth()))
    if response.status_code == 200 and answer == {"stored": True}:
        assert job["status"] == "succeeded"
        for fmt in FORMATS:
            rendered = client.get(f"/v1/jobs/{job_id}/transcript?format={fmt}", headers=auth())
            assert rendered.status_code == 200, (fmt, rendered.get_data()[:500])
            assert_answer(rendered)
