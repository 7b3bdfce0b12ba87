"""Hostile input at the edges (issue 10, findings 6, 7, 12, 14): each gets a 4xx with a code,
never a 500, never invalid JSON, and no file left behind.

Every test runs on SQLite and on PostgreSQL (the `database_url` fixture); PostgreSQL is the
one that refuses NUL characters, so it is where a missed check shows as a 500.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text, update

from app import create_app
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.inputs import display_filename
from app.jobs.delivery import webhook_payload
from app.jobs.service import cursor_encode, get_job
from app.models import Job, WorkerState
from gpu_worker.protocol.bounds import MAX_SECONDS
from gpu_worker.protocol.transcript import Segment, Word
from gpu_worker.transcriber import _segments_from_faster_whisper
from tests.conftest import SIGNING_KEY, add_worker, auth
from tests.test_api_input import SPEECH, error_of, job_count, upload
from tests.test_worker_endpoints import call


def strict_json(raw: str | bytes) -> Any:
    """Parse as a strict JSON parser would: NaN and Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"the body holds {name}, which is not JSON")

    return json.loads(raw, parse_constant=refuse)


def audio_files(settings: Settings) -> list[Path]:
    """Every file under the audio store, staging included."""
    return sorted(p for p in Path(settings.storage_path).rglob("*") if p.is_file())


def running_job(client: Any, db: Database) -> tuple[Any, str]:
    worker = add_worker(db, state=WorkerState.READY)
    job_id = upload(client).get_json()["id"]
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    return worker, job_id


def post_raw(client: Any, worker: Any, path: str, raw: str) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        data=raw,
        headers={"Authorization": f"Bearer {token}"},
        content_type="application/json",
    )


# -- finding 6: non-finite numbers --------------------------------------------------------


@pytest.mark.parametrize(
    "segment",
    [
        '{"start": Infinity, "end": 1.0, "text": "x"}',
        '{"start": 0.0, "end": NaN, "text": "x"}',
        '{"start": 0.0, "end": 1e400, "text": "x"}',
        '{"start": 0.0, "end": 1e300, "text": "x"}',
        '{"start": -1.0, "end": 1.0, "text": "x"}',
        '{"start": 0.0, "end": 1.0, "text": "x", "avg_logprob": -Infinity}',
        '{"start": 0.0, "end": 1.0, "text": "x", "tokens": [1e400]}',
        '{"start": 0.0, "end": 1.0, "text": "x", "words": [{"word": "x", "start": 0, '
        '"end": Infinity}]}',
    ],
)
def test_a_result_with_a_non_finite_or_unbounded_number_is_refused(
    client: Any, db: Database, segment: str
) -> None:
    worker, job_id = running_job(client, db)
    raw = f'{{"transcript": {{"text": "x", "segments": [{segment}]}}, "processing_seconds": 1}}'
    response = post_raw(client, worker, f"/jobs/{job_id}/result", raw)
    error_of(response, 400, "invalid_body")
    listing = client.get("/v1/jobs", headers=auth())
    assert listing.status_code == 200
    assert strict_json(listing.get_data())["data"][0]["status"] == "running"


def test_a_non_finite_processing_time_is_refused(client: Any, db: Database) -> None:
    worker, job_id = running_job(client, db)
    raw = '{"transcript": {"text": "x", "segments": []}, "processing_seconds": Infinity}'
    error_of(post_raw(client, worker, f"/jobs/{job_id}/result", raw), 400, "invalid_body")


def test_unknown_result_fields_are_dropped_not_stored(client: Any, db: Database) -> None:
    worker, job_id = running_job(client, db)
    raw = (
        '{"transcript": {"text": "hi", "x": Infinity, "segments": [{"start": 0, "end": 1, '
        '"text": "hi", "avg_logprob": -0.5, "odd": NaN}]}, "processing_seconds": 1}'
    )
    assert post_raw(client, worker, f"/jobs/{job_id}/result", raw).get_json() == {"stored": True}
    with db.reader() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.transcript is not None
    assert "x" not in job.transcript and "odd" not in job.transcript["segments"][0]
    assert job.transcript["segments"][0]["avg_logprob"] == -0.5


def test_a_bad_stored_row_never_makes_invalid_json_or_a_500(
    client: Any, db: Database, database_url: str
) -> None:
    """A row written before the wire types refused non-finite numbers (here: by hand).

    SQLite's JSON column stores `Infinity` as Python writes it; PostgreSQL's refuses it, so
    there the transcript holds the largest finite numbers and the float columns the rest.
    """
    job_id = upload(client).get_json()["id"]
    inf, nan = (math.inf, math.nan) if database_url.startswith("sqlite") else (1e308, -1e308)
    transcript = {
        "text": "hello",
        "language": "en",
        "duration": inf,
        "segments": [
            {
                "start": nan,
                "end": inf,
                "text": "hello",
                "avg_logprob": -inf,
                "words": [{"word": "hello", "start": 1e308, "end": inf}],
            }
        ],
    }
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                status="succeeded",
                transcript=transcript,
                processing_seconds=math.inf,
                duration_seconds=math.nan,
            )
        )
    listing = client.get("/v1/jobs", headers=auth())
    assert listing.status_code == 200
    job = strict_json(listing.get_data())["data"][0]
    assert job["processing_seconds"] is None and job["duration_seconds"] is None
    assert strict_json(client.get(f"/v1/jobs/{job_id}", headers=auth()).get_data())["id"]
    for fmt in ("json", "verbose_json", "srt", "vtt", "txt"):
        response = client.get(f"/v1/jobs/{job_id}/transcript?format={fmt}", headers=auth())
        assert response.status_code == 200, (fmt, response.get_data(as_text=True))
        if fmt.endswith("json"):
            strict_json(response.get_data())
    vtt = client.get(f"/v1/jobs/{job_id}/transcript?format=vtt", headers=auth())
    assert " --> " in vtt.get_data(as_text=True)
    # The webhook body is built from the same job JSON, read as delivery reads it: no NaN
    # there either.
    json.dumps(webhook_payload(get_job(db, job_id)), allow_nan=False)


def test_the_worker_never_builds_a_non_finite_transcript() -> None:
    decoded = SimpleNamespace(
        start=0.0,
        end=1.0,
        text=" hi",
        tokens=[1],
        avg_logprob=-math.inf,
        no_speech_prob=math.nan,
        compression_ratio=1.0,
        temperature=0.0,
        words=[SimpleNamespace(word="hi", start=0.0, end=1.0, probability=math.nan)],
    )
    (segment,) = _segments_from_faster_whisper([decoded])
    # What a decoder could not measure is None ("never invented"); what it did stays.
    assert segment.avg_logprob is None and segment.no_speech_prob is None
    assert segment.words is not None and segment.words[0].probability is None
    assert segment.compression_ratio == 1.0
    for start in (math.inf, math.nan, -1.0, MAX_SECONDS * 2):
        with pytest.raises(ValidationError):
            Word(word="x", start=start, end=1.0, probability=None)
    # The wire model itself refuses what is not finite: clamping is the sender's job, and the
    # control plane validates with the same model.
    with pytest.raises(ValidationError):
        Segment(start=0.0, end=1.0, text="x", avg_logprob=-math.inf)


def test_the_reporter_never_sends_a_non_finite_counter() -> None:
    from gpu_worker.reporter import _seconds

    assert _seconds(math.nan) == 0.0 and _seconds(-math.inf) == 0.0
    assert _seconds(math.inf) == 0.0 and _seconds(1e300) == MAX_SECONDS
    assert _seconds(12.5) == 12.5


# -- finding 7: malformed input never reaches a 500 -----------------------------------------


def test_deeply_nested_json_is_400(client: Any, db: Database) -> None:
    for body in ("[" * 60_000, '{"url": ' + "[" * 5_000 + "]" * 5_000 + "}"):
        response = client.post(
            "/v1/jobs", data=body, headers=auth(), content_type="application/json"
        )
        error_of(response, 400, "invalid_json")
    assert job_count(db) == 0


@pytest.mark.parametrize(
    "raw",
    [
        '{"url": "http://127.0.0.1/\\ud800.wav"}',
        '{"url": "http://127.0.0.1/a\\u0000.wav"}',
        '{"url": "http://127.0.0.1/a.wav", "prompt": "a\\u0000b"}',
        '{"url": "http://127.0.0.1/a.wav", "language": NaN}',
    ],
)
def test_json_with_nul_surrogate_or_nan_is_400(client: Any, db: Database, raw: str) -> None:
    response = client.post("/v1/jobs", data=raw, headers=auth(), content_type="application/json")
    error_of(response, 400, "invalid_json")
    assert job_count(db) == 0


def test_nul_in_a_form_prompt_is_400_and_leaves_no_file(
    client: Any, db: Database, settings: Settings
) -> None:
    response = upload(client, prompt="before\x00after")
    assert "prompt contains a NUL" in error_of(response, 400, "invalid_text")
    assert job_count(db) == 0
    assert audio_files(settings) == []


@pytest.mark.parametrize("path", ["/v1/jobs/job_%00x", "/v1/jobs/a%00/transcript"])
def test_nul_in_a_job_id_is_400(client: Any, path: str) -> None:
    error_of(client.get(path, headers=auth()), 400, "invalid_text")
    error_of(client.delete(path.removesuffix("/transcript"), headers=auth()), 400, "invalid_text")


def test_nul_in_a_query_or_the_idempotency_key_is_400(client: Any, db: Database) -> None:
    error_of(client.get("/v1/jobs?status=%00", headers=auth()), 400, "invalid_text")
    response = upload(client, headers={**auth(), "Idempotency-Key": "k\x01"})
    error_of(response, 400, "invalid_text")
    assert job_count(db) == 0


def test_a_cursor_naming_a_nul_job_id_is_400(client: Any) -> None:
    forged = Job(id="job_\x00", created_at=datetime(2026, 1, 1, tzinfo=UTC))
    response = client.get(f"/v1/jobs?cursor={cursor_encode(forged)}", headers=auth())
    error_of(response, 400, "invalid_cursor")
    deep = base64.urlsafe_b64encode(b"[" * 100_000).decode()
    error_of(client.get(f"/v1/jobs?cursor={deep}", headers=auth()), 400, "invalid_cursor")


def test_nul_in_a_worker_failure_message_is_400(client: Any, db: Database) -> None:
    worker, job_id = running_job(client, db)
    body = {"code": "worker_error", "message": "bad\x00byte"}
    error_of(call(client, worker, f"/jobs/{job_id}/failure", body), 400, "invalid_body")
    assert call(client, worker, "/ready", {"runtime": {"a": "b\x00"}}).status_code == 400


def test_a_failed_insert_leaves_no_audio_behind(
    settings: Settings, db: Database, database_url: str
) -> None:
    """The database refuses the row (a trigger, as a full disk or a lost connection would):
    the stored audio goes with it."""
    with db.session() as s:
        if database_url.startswith("sqlite"):
            s.execute(
                text(
                    "CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
                )
            )
        else:
            s.execute(
                text(
                    "CREATE FUNCTION refuse_jobs() RETURNS trigger AS $$ BEGIN "
                    "RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql"
                )
            )
            s.execute(
                text(
                    "CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs "
                    "FOR EACH ROW EXECUTE FUNCTION refuse_jobs()"
                )
            )
    try:
        client = create_app(settings, db=db).test_client()
        response = upload(client)
        error_of(response, 500, "internal_error")
        assert audio_files(settings) == []
    finally:  # PostgreSQL's database is shared by the session's tests (tests/conftest.py)
        with db.session() as s:
            if database_url.startswith("sqlite"):
                s.execute(text("DROP TRIGGER refuse_jobs"))
            else:
                s.execute(text("DROP TRIGGER refuse_jobs ON jobs"))
                s.execute(text("DROP FUNCTION refuse_jobs()"))


# -- finding 12: an idempotency key reused with a different request ---------------------------


def test_a_reused_idempotency_key_with_other_audio_is_422(
    client: Any, db: Database, settings: Settings
) -> None:
    headers = {**auth(), "Idempotency-Key": "order-7"}
    first = upload(client, headers=headers)
    assert first.status_code == 202
    files = audio_files(settings)
    other = (Path(__file__).parent / "fixtures" / "silence-5s.wav").read_bytes()
    response = upload(client, other, headers=headers)
    assert "different request" in error_of(response, 422, "idempotency_key_reused")
    assert response.get_json()["error"]["job_id"] == first.get_json()["id"]
    changed_prompt = upload(client, headers=headers, prompt="another prompt")
    error_of(changed_prompt, 422, "idempotency_key_reused")
    assert job_count(db) == 1
    assert audio_files(settings) == files  # the refused uploads left nothing
    # The same audio under another display name is the same request: replayed.
    again = upload(client, SPEECH, name="renamed.wav", headers=headers)
    assert again.status_code == 202 and again.get_json()["id"] == first.get_json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"


def test_a_reused_idempotency_key_with_another_url_is_422(settings: Settings, db: Database) -> None:
    # Loopback URLs, allowed here: nothing fetches them (no control worker runs).
    loose = settings.model_copy(
        update={"api": settings.api.model_copy(update={"allow_private_urls": True})}
    )
    client = create_app(loose, db=db).test_client()
    headers = {**auth(), "Idempotency-Key": "url-7"}
    first = client.post("/v1/jobs", json={"url": "http://127.0.0.1:9/a.wav"}, headers=headers)
    assert first.status_code == 202
    same = client.post("/v1/jobs", json={"url": "http://127.0.0.1:9/a.wav"}, headers=headers)
    assert same.status_code == 202 and same.get_json()["id"] == first.get_json()["id"]
    other = client.post("/v1/jobs", json={"url": "http://127.0.0.1:9/b.wav"}, headers=headers)
    error_of(other, 422, "idempotency_key_reused")
    assert job_count(db) == 1


# -- finding 14: filenames are display text only ---------------------------------------------


def test_windows_paths_lose_their_components_too() -> None:
    assert display_filename("..\\..\\windows\\y.wav") == "y.wav"
    assert display_filename("\u2066x\u2069\u2028.wav") == "x.wav"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("../../etc/x", "x"),
        ("C:/Users/me/y.wav", "y.wav"),
        ("\u202egnp.exe", "gnp.exe"),
        ("a\x00b\x1b[31m.wav", "ab[31m.wav"),
        ("zero\u200bwidth.wav", "zerowidth.wav"),
        ("..", None),
        ("/", None),
        ("é" * 1000, "é" * 255),
    ],
)
def test_filenames_are_sanitised_display_text(
    client: Any, settings: Settings, name: str, shown: str | None
) -> None:
    response = upload(client, name=name)
    assert response.status_code == 202, response.get_data(as_text=True)
    assert response.get_json()["filename"] == shown
    # The stored audio is named by the store, never by the client.
    (stored,) = audio_files(settings)
    assert stored.parent == Path(settings.storage_path) and stored.name.endswith(".audio")


def test_upload_stream_is_hashed_then_saved_whole(client: Any, db: Database) -> None:
    """Hashing the upload for its fingerprint must not consume what is then stored."""
    response = upload(client, headers={**auth(), "Idempotency-Key": "hash-then-save"})
    assert response.status_code == 202
    with db.reader() as s:
        job = s.get(Job, response.get_json()["id"])
        assert job is not None and job.size_bytes == len(SPEECH)
        assert job.idempotency_hash is not None and len(job.idempotency_hash) == 64


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/audio/transcriptions"])
def test_a_form_part_without_a_name_is_400(client: Any, path: str) -> None:
    body = b"--XX\r\nContent-Disposition: form-data\r\n\r\nvalue\r\n--XX--\r\n"
    headers = {**auth(), "Content-Type": "multipart/form-data; boundary=XX"}
    error_of(client.post(path, data=body, headers=headers), 400, "unknown_field")


def test_the_api_encoder_writes_non_finite_numbers_as_null(
    settings: Settings, db: Database
) -> None:
    app = create_app(settings, db=db)
    body = app.json.dumps({"a": [math.inf, {"b": math.nan}], "c": 1.5, "d": -math.inf})
    assert strict_json(body) == {"a": [None, {"b": None}], "c": 1.5, "d": None}
