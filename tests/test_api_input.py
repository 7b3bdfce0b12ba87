"""Every bad request gets a JSON error with a code and message, and leaves nothing behind."""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import Database
from app.models import Job
from tests.conftest import API_TOKEN, FIXTURES, auth

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()


def upload(
    client: Any,
    data: bytes = SPEECH,
    name: str = "a.wav",
    headers: dict[str, str] | None = None,
    path: str = "/v1/jobs",
    **fields: Any,
) -> Any:
    form: dict[str, Any] = {"file": (io.BytesIO(data), name), **fields}
    return client.post(
        path, data=form, headers=headers or auth(), content_type="multipart/form-data"
    )


def error_of(response: Any, status: int, code: str) -> str:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def job_count(db: Database) -> int:
    with db.session() as s:
        return int(s.execute(select(func.count()).select_from(Job)).scalar_one())


def test_missing_token_is_401(client: Any, db: Database) -> None:
    response = client.post("/v1/jobs", data={"file": (io.BytesIO(SPEECH), "a.wav")})
    assert error_of(response, 401, "unauthorized").startswith("missing bearer token")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert job_count(db) == 0


def test_wrong_token_is_401_and_not_echoed(client: Any, db: Database) -> None:
    response = upload(client, headers=auth("not-a-real-token-xyz"))
    message = error_of(response, 401, "unauthorized")
    assert "not-a-real-token-xyz" not in response.get_data(as_text=True)
    assert message == "invalid API token"
    assert job_count(db) == 0


def test_missing_file(client: Any, db: Database) -> None:
    response = client.post(
        "/v1/jobs", data={"language": "en"}, headers=auth(), content_type="multipart/form-data"
    )
    assert "field named 'file'" in error_of(response, 400, "missing_file")
    assert job_count(db) == 0


def test_empty_file(client: Any, db: Database) -> None:
    assert error_of(upload(client, b""), 400, "empty_file") == "the uploaded file is empty"
    assert job_count(db) == 0


def test_non_audio_named_wav(client: Any, db: Database) -> None:
    response = upload(client, b"this is plain text, not a RIFF file" * 20, "notes.wav")
    assert error_of(response, 400, "invalid_audio").startswith("the file is not audio")
    assert job_count(db) == 0


def test_truncated_wav_header(client: Any, db: Database) -> None:
    error_of(upload(client, SPEECH[:30], "cut.wav"), 400, "invalid_audio")
    assert job_count(db) == 0


def test_wav_header_without_samples(client: Any, db: Database) -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    error_of(upload(client, buf.getvalue(), "hollow.wav"), 400, "invalid_audio")


def test_file_over_size_cap_is_413_before_reading_body(live_api: Any) -> None:
    """The server answers 413 from the headers alone: the client never sends the body."""
    import socket

    limit = live_api.settings.api.max_upload_bytes
    declared = limit * 4
    host, port = live_api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            (
                f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_TOKEN}\r\n"
                f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {declared}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
        )
        sock.sendall(b"--x\r\n")  # a few bytes of a body that would be 100 MB
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
        head, body = reply.split(b"\r\n\r\n", 1)
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(body) < length:
            body += sock.recv(65536)
    assert b" 413 " in head.split(b"\r\n")[0], reply[:300]
    import json

    error = json.loads(body)["error"]
    assert error["code"] == "payload_too_large"
    assert str(limit + 64 * 1024) in error["message"]
    assert job_count(live_api.db) == 0


def test_invalid_language(client: Any) -> None:
    message = error_of(upload(client, language="klingon"), 400, "invalid_language")
    assert "ISO 639-1" in message


def test_language_the_english_only_model_cannot_do(settings: Any, db: Database) -> None:
    from app.factory import create_app

    profile = settings.profiles[0].model_copy(update={"model": "tiny.en"})
    english_only = create_app(settings.model_copy(update={"profiles": (profile,)}), db=db)
    refused = upload(english_only.test_client(), language="fr")
    message = error_of(refused, 400, "unsupported_language")
    assert "English-only" in message


def test_malformed_json(client: Any, db: Database) -> None:
    response = client.post(
        "/v1/jobs", data="{not json", headers=auth(), content_type="application/json"
    )
    assert error_of(response, 400, "invalid_json") == "the request body is not a JSON object"
    assert job_count(db) == 0


def test_unsupported_media_type(client: Any) -> None:
    response = client.post("/v1/jobs", data=SPEECH, headers=auth(), content_type="audio/wav")
    error_of(response, 415, "unsupported_media_type")


def test_unknown_json_field(client: Any) -> None:
    response = client.post(
        "/v1/jobs", json={"url": "https://example.com/a.wav", "colour": "red"}, headers=auth()
    )
    assert "colour" in error_of(response, 400, "unknown_field")


@pytest.mark.parametrize(
    ("url", "code", "needle"),
    [
        ("file:///etc/passwd", "invalid_url", "http or https, not file"),
        ("ftp://example.com/a.wav", "invalid_url", "http or https, not ftp"),
        ("https://user:secret@example.com/a.wav", "invalid_url", "must not contain credentials"),
        ("http://127.0.0.1/a.wav", "forbidden_url", "private, loopback or link-local"),
        ("http://localhost:8000/a.wav", "forbidden_url", "private, loopback or link-local"),
        ("http://169.254.169.254/latest/meta-data", "forbidden_url", "link-local"),
        ("http://10.1.2.3/a.wav", "forbidden_url", "private"),
        ("http://192.168.0.10/a.wav", "forbidden_url", "private"),
        ("http://[::1]/a.wav", "forbidden_url", "loopback"),
        ("http://[::ffff:127.0.0.1]/a.wav", "forbidden_url", "loopback"),
        ("http://[64:ff9b::a9fe:a9fe]/latest", "forbidden_url", "link-local"),  # NAT64
        ("http://[2002:7f00:1::]/a.wav", "forbidden_url", "loopback"),  # 6to4
        ("http://[::7f00:1]/a.wav", "forbidden_url", "loopback"),  # IPv4-compatible
        ("not a url", "invalid_url", "http or https"),
    ],
)
def test_url_ssrf_rejected(client: Any, db: Database, url: str, code: str, needle: str) -> None:
    response = client.post("/v1/jobs", json={"url": url}, headers=auth())
    assert needle in error_of(response, 400, code)
    assert "secret" not in response.get_data(as_text=True)
    assert job_count(db) == 0


def test_unknown_job_is_404(client: Any) -> None:
    response = client.get("/v1/jobs/job_doesnotexist", headers=auth())
    assert error_of(response, 404, "job_not_found") == "no job with id job_doesnotexist"


def test_unknown_transcript_format(client: Any) -> None:
    job = upload(client).get_json()
    response = client.get(f"/v1/jobs/{job['id']}/transcript?format=docx", headers=auth())
    assert "json, verbose_json, txt" in error_of(response, 400, "invalid_format")


def test_transcript_not_ready_is_409(client: Any) -> None:
    job = upload(client).get_json()
    response = client.get(f"/v1/jobs/{job['id']}/transcript", headers=auth())
    assert "not ready" in error_of(response, 409, "job_not_finished")


def test_unknown_openai_response_format(client: Any, db: Database) -> None:
    response = upload(
        client, path="/v1/audio/transcriptions", model="whisper-1", response_format="docx"
    )
    assert "json, text, srt, vtt, verbose_json" in error_of(
        response, 400, "invalid_response_format"
    )
    assert job_count(db) == 0


def test_jobs_are_private_to_their_token(client: Any) -> None:
    job = upload(client).get_json()
    other = "test-api-token-" + "b" * 32
    response = client.get(f"/v1/jobs/{job['id']}", headers=auth(other))
    error_of(response, 404, "job_not_found")


def test_bad_list_parameters(client: Any) -> None:
    error_of(client.get("/v1/jobs?limit=0", headers=auth()), 400, "invalid_limit")
    error_of(client.get("/v1/jobs?status=sleeping", headers=auth()), 400, "invalid_status")
    error_of(client.get("/v1/jobs?cursor=zzz", headers=auth()), 400, "invalid_cursor")


def test_unknown_route_is_json_404(client: Any) -> None:
    error_of(client.get("/v2/nothing", headers=auth()), 404, "not_found")


def test_accepted_job_row_exists_with_location(client: Any, db: Database) -> None:
    response = upload(client)
    assert response.status_code == 202
    job = response.get_json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued"  # no worker yet: it waits for the fleet
    assert job["duration_seconds"] == pytest.approx(6.6, abs=0.1)
    with db.session() as s:
        assert s.get(Job, job["id"]) is not None


def test_idempotency_key_returns_the_same_job(client: Any, db: Database) -> None:
    headers = {**auth(), "Idempotency-Key": "order-42"}
    first = upload(client, headers=headers)
    second = upload(client, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.get_json()["id"] == second.get_json()["id"]
    assert second.headers["Idempotent-Replayed"] == "true"
    other = upload(
        client, headers={**auth("test-api-token-" + "b" * 32), "Idempotency-Key": "order-42"}
    )
    assert other.get_json()["id"] != first.get_json()["id"]  # keys are scoped per token
    assert job_count(db) == 2


def test_cancel_then_cancel_again_is_409(client: Any) -> None:
    job = upload(client).get_json()
    response = client.delete(f"/v1/jobs/{job['id']}", headers=auth())
    assert response.status_code == 200
    assert response.get_json()["status"] == "cancelled"
    again = client.delete(f"/v1/jobs/{job['id']}", headers=auth())
    assert "already finished with status cancelled" in error_of(again, 409, "job_finished")


def test_list_is_paginated(client: Any) -> None:
    ids = [upload(client).get_json()["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        url = "/v1/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(url, headers=auth()).get_json()
        seen += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))
    queued = client.get("/v1/jobs?status=queued", headers=auth()).get_json()["data"]
    assert {j["id"] for j in queued} == set(ids)


def test_healthz_and_openapi(client: Any) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok"}
    doc = client.get("/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    assert {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/transcript",
        "/v1/audio/transcriptions",
    } <= set(doc["paths"])


def test_readyz_names_the_failed_dependency(client: Any, settings: Any, tmp_path: Path) -> None:
    ok = client.get("/readyz")
    assert ok.status_code == 200
    assert ok.get_json()["checks"] == {
        "database": "ok",
        "broker": "ok",
        "storage": "ok",
        "control_plane": "ok",
    }
    from app import create_app
    from tests.conftest import make_settings

    broken = make_settings(settings.database_url, "redis://127.0.0.1:1/0", tmp_path)
    response = create_app(broken).test_client().get("/readyz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("failed")
    assert API_TOKEN not in response.get_data(as_text=True)


def test_url_job_refused_when_the_broker_is_down_leaves_nothing(
    settings: Any, db: Database, tmp_path: Path
) -> None:
    """Policy for URL jobs: nothing of the client's is stored yet, so answer 503 and keep no row;
    a retry with the same Idempotency-Key then creates the job afresh."""
    from app import create_app
    from app.celery_config import make_celery

    dead = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    client = create_app(dead, db=db, celery=make_celery(dead)).test_client()
    headers = {**auth(), "Idempotency-Key": "url-1"}
    response = client.post("/v1/jobs", json={"url": "https://93.184.215.14/a.wav"}, headers=headers)
    assert error_of(response, 503, "broker_unavailable").startswith("the job queue is unavailable")
    assert response.headers["Retry-After"] == "5"
    assert job_count(db) == 0
