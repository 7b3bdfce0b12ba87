"""The job options of issue 20 at the HTTP edge: task, model, diarize and speaker bounds on
POST /v1/jobs (form and JSON) and the OpenAI endpoints; each bad value is one JSON refusal,
before any audio is stored, and good ones land on the job row and in its JSON."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import Database
from app.errors import Refused
from app.jobs import requests
from app.models import Job
from tests.conftest import auth
from tests.test_api_input import error_of, upload


def jobs(db: Database) -> int:
    with db.session() as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"task": "summarise"}, "invalid_task"),
        ({"min_speakers": "0", "diarize": "true"}, "invalid_parameter"),
        ({"max_speakers": "21", "diarize": "true"}, "invalid_parameter"),
        ({"min_speakers": "3", "max_speakers": "2", "diarize": "true"}, "invalid_parameter"),
        ({"diarize": "maybe"}, "invalid_parameter"),
        ({"model": "whisper-9"}, "model_not_found"),
        ({"diarize": "true"}, "diarization_unavailable"),
        ({"model": "gpt-4o-transcribe-diarize"}, "diarization_unavailable"),
    ],
)
def test_a_bad_option_is_refused_before_anything_is_stored(
    client: Any, db: Database, fields: dict[str, str], code: str
) -> None:
    error_of(upload(client, **fields), 400, code)
    assert jobs(db) == 0


def test_the_options_land_on_the_job(client: Any, db: Database) -> None:
    response = upload(client, task="translate", model="base", language="de")
    assert response.status_code == 202, response.get_data(as_text=True)
    job = response.get_json()
    assert (job["task"], job["model"], job["language"], job["diarize"]) == (
        "translate",
        "base",
        "de",
        False,
    )


def test_a_json_url_job_takes_the_same_options() -> None:
    known = requests.Deployment(
        default_language=None, english_only=False, webhooks=False, resolve=lambda v, _: v
    )
    body = {
        "url": "https://example.com/a.mp3",
        "task": "translate",
        "model": "whisper-1",
        "diarize": True,
        "min_speakers": 2,
        "max_speakers": 2,
    }
    options = requests.parse(requests.UrlJob, body, known).options()
    assert (options.task, options.model, options.diarize) == ("translate", "whisper-1", True)
    assert (options.min_speakers, options.max_speakers) == (2, 2)
    with pytest.raises(Refused) as refused:
        requests.parse(requests.UrlJob, {**body, "min_speakers": 3}, known)
    assert refused.value.code == "invalid_parameter"


def test_the_openai_endpoints_refuse_what_no_profile_serves(client: Any, db: Database) -> None:
    path = "/v1/audio/transcriptions"
    error_of(
        upload(client, path=path, response_format="diarized_json"), 400, "diarization_unavailable"
    )
    error_of(upload(client, path=path, model="gpt-4o-transcribe"), 400, "model_not_found")
    error_of(
        upload(client, path="/v1/audio/translations", response_format="diarized_json"),
        400,
        "invalid_response_format",
    )
    error_of(upload(client, path="/v1/audio/translations", language="de"), 400, "invalid_parameter")
    assert jobs(db) == 0


def test_the_model_list_needs_a_token(client: Any) -> None:
    assert client.get("/v1/models").status_code == 401
    listed = client.get("/v1/models", headers=auth()).get_json()
    assert [m["id"] for m in listed["data"]] == ["base", "whisper-1"]
    assert client.get("/v1/models/base", headers=auth()).get_json()["object"] == "model"
    error_of(client.get("/v1/models/tiny.en", headers=auth()), 404, "model_not_found")
