"""Issue 31 at the HTTP edge, no worker needed: whisper-asr-webservice's /asr and
/detect-language refuse what they cannot take (before anything is stored) and need a token;
/v1/jobs takes initial_prompt, vad_filter and temperature and hands them to the worker's
claim; the OpenAI endpoints use temperature and refuse, with the reason, what they do not do;
/docs and every file it names are served from the API itself."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from sqlalchemy import func, select

from app.api_docs import ASSET_PREFIX, ASSETS
from app.credentials import InstanceCredential
from app.db import Database
from app.models import Job, WorkerState
from tests.conftest import FIXTURES, SIGNING_KEY, add_worker, auth
from tests.test_api_input import error_of, upload

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()


def jobs(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0)


def wasr_post(
    client: Any, path: str = "/asr", query: str = "", part: str = "audio_file", **headers: str
) -> Any:
    """A request as whisper-asr-webservice's clients send it: options in the query string,
    the audio as the multipart part `audio_file`."""
    return client.post(
        f"{path}?{query}" if query else path,
        data={part: (io.BytesIO(SPEECH), "speech.wav")},
        headers={**auth(), **headers},
        content_type="multipart/form-data",
    )


# -- /asr and /detect-language: refusals --------------------------------------------------------


@pytest.mark.parametrize("path", ["/asr", "/detect-language"])
def test_the_wasr_endpoints_need_a_token(client: Any, db: Database, path: str) -> None:
    answer = client.post(
        path,
        data={"audio_file": (io.BytesIO(SPEECH), "speech.wav")},
        content_type="multipart/form-data",
    )
    error_of(answer, 401, "unauthorized")
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert jobs(db) == 0


@pytest.mark.parametrize(
    ("path", "query", "part", "status", "code", "named"),
    [
        ("/asr", "output=docx", "audio_file", 400, "invalid_format", "txt, vtt, srt"),
        ("/asr", "task=summarise", "audio_file", 400, "invalid_task", "transcribe"),
        ("/asr", "language=xx", "audio_file", 400, "invalid_language", "xx"),
        ("/asr", "vad_filter=maybe", "audio_file", 400, "invalid_parameter", "vad_filter"),
        ("/asr", "encode=perhaps", "audio_file", 400, "invalid_parameter", "encode"),
        ("/asr", "word_timestamps=2", "audio_file", 400, "invalid_parameter", "word_timestamps"),
        ("/asr", "diarize=true&min_speakers=0", "audio_file", 400, "invalid_parameter", "min"),
        ("/asr", "min_speakers=3&max_speakers=2", "audio_file", 400, "invalid_parameter", "max"),
        ("/asr", "temperature=0.2", "audio_file", 400, "unknown_field", "temperature"),
        ("/asr", "output=srt&output=vtt", "audio_file", 400, "duplicate_field", "output"),
        ("/asr", "", "file", 400, "unknown_field", "file"),
        ("/asr", "diarize=true", "audio_file", 400, "diarization_unavailable", "diariz"),
        ("/detect-language", "language=de", "audio_file", 400, "unknown_field", "language"),
        ("/detect-language", "", "audio", 400, "unknown_field", "audio"),
    ],
)
def test_a_bad_wasr_request_is_refused_before_anything_is_stored(
    client: Any,
    db: Database,
    path: str,
    query: str,
    part: str,
    status: int,
    code: str,
    named: str,
) -> None:
    message = error_of(wasr_post(client, path, query, part), status, code)
    assert named in message
    assert jobs(db) == 0


def test_a_wasr_request_without_audio_names_the_part(client: Any, db: Database) -> None:
    answer = client.post("/asr", data={}, headers=auth(), content_type="multipart/form-data")
    assert "audio_file" in error_of(answer, 400, "missing_file")
    answer = client.post("/asr", data=SPEECH, headers=auth(), content_type="audio/wav")
    error_of(answer, 415, "unsupported_media_type")
    assert jobs(db) == 0


# -- /v1/jobs: initial_prompt, vad_filter, temperature --------------------------------------


def test_the_decoding_options_land_on_the_job_and_reach_the_worker(
    client: Any, db: Database
) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    answer = upload(client, initial_prompt="Murmur, Caddy.", vad_filter="false", temperature="0.6")
    assert answer.status_code == 202, answer.get_data(as_text=True)
    job = answer.get_json()
    assert (job["temperature"], job["vad_filter"]) == (0.6, False)
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    claimed = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}/jobs/{job['id']}/claim",
        headers={"Authorization": f"Bearer {token}"},
        json={},
    )
    assert claimed.status_code == 200, claimed.get_data(as_text=True)
    wire = claimed.get_json()["job"]
    assert (wire["prompt"], wire["vad_filter"], wire["temperature"]) == (
        "Murmur, Caddy.",
        False,
        0.6,
    )
    # A job that sets none keeps the worker's defaults.
    plain = upload(client).get_json()
    assert (plain["temperature"], plain["vad_filter"]) == (None, True)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"temperature": "banana"}, "temperature"),
        ({"temperature": "1.5"}, "temperature"),
        ({"temperature": "-0.1"}, "temperature"),
        ({"temperature": "nan"}, "temperature"),
        ({"vad_filter": "sometimes"}, "vad_filter"),
        ({"prompt": "a", "initial_prompt": "b"}, "initial_prompt"),
        ({"initial_prompt": "x" * 2001}, "initial_prompt"),
    ],
)
def test_a_bad_decoding_option_is_refused(
    client: Any, db: Database, fields: dict[str, str], named: str
) -> None:
    assert named in error_of(upload(client, **fields), 400, "invalid_parameter")
    assert jobs(db) == 0


def test_an_idempotency_key_tells_decoding_options_apart(client: Any, db: Database) -> None:
    key = {**auth(), "Idempotency-Key": "wasr-options-1"}
    first = upload(client, headers=key, vad_filter="false")
    assert first.status_code == 202
    again = upload(client, headers=key, vad_filter="false")
    assert again.get_json()["id"] == first.get_json()["id"]
    error_of(upload(client, headers=key), 422, "idempotency_key_reused")
    error_of(
        upload(client, headers=key, vad_filter="false", temperature="0"),
        422,
        "idempotency_key_reused",
    )
    assert jobs(db) == 1


# -- the OpenAI endpoints: every field used or refused ------------------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "named"),
    [
        ("/v1/audio/transcriptions", {"temperature": "banana"}, "temperature"),
        ("/v1/audio/transcriptions", {"temperature": "2"}, "temperature"),
        ("/v1/audio/translations", {"temperature": "banana"}, "temperature"),
        ("/v1/audio/transcriptions", {"chunking_strategy": '{"type": "server_vad"}'}, "auto"),
        ("/v1/audio/transcriptions", {"include[]": "logprobs"}, "include[]"),
        ("/v1/audio/transcriptions", {"known_speaker_names[]": "ann"}, "known_speaker_names"),
        ("/v1/audio/transcriptions", {"known_speaker_references[]": "x"}, "known_speaker_ref"),
        ("/v1/audio/translations", {"stream": "true"}, "stream"),
        ("/v1/audio/translations", {"include[]": "logprobs"}, "include[]"),
        ("/v1/audio/translations", {"language": "de"}, "language"),
        ("/v1/audio/translations", {"timestamp_granularities[]": "word"}, "timestamp_gran"),
    ],
)
def test_an_openai_field_murmur_does_not_do_is_refused_with_the_reason(
    client: Any, db: Database, path: str, fields: dict[str, str], named: str
) -> None:
    message = error_of(upload(client, path=path, **fields), 400, "invalid_parameter")
    assert named in message
    assert jobs(db) == 0


# -- /docs ------------------------------------------------------------------------------------


def test_the_docs_page_and_every_file_it_names_come_from_the_api(client: Any) -> None:
    page = client.get("/docs")  # public, like /openapi.json: no token
    assert page.status_code == 200
    assert page.mimetype == "text/html"
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    html = page.get_data(as_text=True)
    assert "<script>" not in html  # nothing inline: the CSP allows this origin's files only
    named = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert named and all(url.startswith(ASSET_PREFIX) for url in named), named
    types = {".css": "text/css", ".js": "text/javascript", ".png": "image/png"}
    scripts = ""
    for url in named:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.mimetype == types[url[url.rindex(".") :]], url
        assert asset.content_length or asset.get_data(), url
        if url.endswith(".js"):
            scripts += asset.get_data(as_text=True)
    # The files the page names are exactly what is served; the start-up script asks for this
    # API's document and never for Swagger's online validator.
    assert {url.removeprefix(ASSET_PREFIX) for url in named} >= set(ASSETS) - {"index.css"}
    start = client.get(f"{ASSET_PREFIX}murmur-docs.js").get_data(as_text=True)
    assert '"/openapi.json"' in start and "validatorUrl: null" in start
    assert "SwaggerUIBundle" in scripts
    document = client.get("/openapi.json")
    assert document.status_code == 200 and "/asr" in document.get_json()["paths"]
    for outside in ("../openapi.py", "..%2Fapi_docs.py", "oauth2-redirect.html", "LICENSE"):
        error_of(client.get(f"{ASSET_PREFIX}{outside}"), 404, "not_found")
