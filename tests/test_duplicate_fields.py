"""One value per name (issue 21 §6): a repeated form part, query parameter or JSON key is
`400 duplicate_field` naming it, before anything is stored, so a proxy or WAF in front can
never read a different value than Murmur does."""

from __future__ import annotations

import io
from typing import Any

import pytest

from app.config import Settings
from app.db import Database
from tests.conftest import auth
from tests.hostile import stored_files
from tests.test_api_input import SPEECH, error_of, job_count

SYNC = "/v1/audio/transcriptions"


def post_form(client: Any, form: Any, path: str = "/v1/jobs") -> Any:
    return client.post(path, data=form, headers=auth(), content_type="multipart/form-data")


def audio(name: str = "a.wav") -> tuple[io.BytesIO, str]:
    return (io.BytesIO(SPEECH), name)


@pytest.mark.parametrize("path", ["/v1/jobs", SYNC])
def test_a_second_file_part_is_refused(
    client: Any, db: Database, settings: Settings, path: str
) -> None:
    before = stored_files(settings.storage_path)
    response = post_form(client, {"file": [audio("a.wav"), audio("b.wav")]}, path)
    message = error_of(response, 400, "duplicate_field")
    assert message == "form field given more than once (send one value each): file"
    assert job_count(db) == 0
    assert stored_files(settings.storage_path) == before


@pytest.mark.parametrize("path", ["/v1/jobs", SYNC])
def test_a_repeated_text_field_is_refused_even_when_the_values_agree(
    client: Any, db: Database, path: str
) -> None:
    response = post_form(client, {"file": audio(), "language": ["en", "en"]}, path)
    assert error_of(response, 400, "duplicate_field").endswith(": language")
    assert job_count(db) == 0


def test_nine_hundred_language_fields_are_refused(client: Any, db: Database) -> None:
    response = post_form(client, {"file": audio(), "language": ["en"] * 900})
    assert error_of(response, 400, "duplicate_field").endswith(": language")
    assert job_count(db) == 0


def test_every_repeated_field_is_named_and_a_strange_name_is_escaped(client: Any) -> None:
    form = {"file": [audio(), audio()], "prompt": ["a", "b"], "x\x1by": ["1", "2"]}
    message = error_of(post_form(client, form), 400, "duplicate_field")
    assert message.endswith(": file, prompt, x\\x1by")
    assert "\x1b" not in message


def test_a_text_part_named_file_beside_the_file_part_is_a_duplicate(client: Any) -> None:
    response = post_form(client, {"file": [audio(), "not audio"]})
    assert error_of(response, 400, "duplicate_field").endswith(": file")


def test_a_second_file_part_under_another_name_is_unknown(client: Any, db: Database) -> None:
    response = post_form(client, {"file": audio(), "audio": audio("b.wav")})
    assert error_of(response, 400, "unknown_field") == "unknown form field(s): audio"
    assert job_count(db) == 0


def test_a_list_field_may_repeat(client: Any) -> None:
    # OpenAI's `timestamp_granularities[]` is a list: repeating it is how a client sends it.
    # (No audio part: the refusal that follows shows the repetition itself passed.)
    form = {"timestamp_granularities[]": ["word", "segment"], "response_format": "json"}
    error_of(post_form(client, form, SYNC), 400, "missing_file")
    form["response_format"] = ["json", "text"]
    assert error_of(post_form(client, form, SYNC), 400, "duplicate_field").endswith(
        ": response_format"
    )


def test_a_repeated_query_parameter_is_refused(client: Any) -> None:
    response = client.get("/v1/jobs?limit=1&limit=100", headers=auth())
    message = error_of(response, 400, "duplicate_field")
    assert message == "query parameter given more than once (send one value each): limit"
    assert client.get("/v1/jobs?limit=1", headers=auth()).status_code == 200


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ('{"url": "https://example.com/a.wav", "url": "https://example.com/b.wav"}', "url"),
        ('{"url": "https://example.com/a.wav", "prompt": "a", "prompt": "a"}', "prompt"),
        ('{"url": "https://example.com/a.wav", "x": {"k": 1, "k": 2}}', "k"),
    ],
)
def test_a_json_key_given_twice_is_refused(client: Any, db: Database, body: str, name: str) -> None:
    response = client.post("/v1/jobs", data=body, headers=auth(), content_type="application/json")
    message = error_of(response, 400, "duplicate_field")
    assert message == f"JSON field given more than once (send one value each): {name}"
    assert job_count(db) == 0
