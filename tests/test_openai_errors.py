"""Every error of the OpenAI-compatible endpoints (any path under /v1/audio/ or /v1/models)
has OpenAI's ErrorResponse shape: `type`, `message`, `param` and `code`, as OpenAI's own
schema (tests/fixtures/openai_error_response.schema.json, copied from openai/openai-openapi)
and the official `openai` client read it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import openai
import pytest

from tests.conftest import API_TOKEN, LiveApi, auth

SCHEMA = json.loads(
    (Path(__file__).parent / "fixtures" / "openai_error_response.schema.json").read_text()
)
VALIDATOR = jsonschema_rs.validator_for(SCHEMA)
SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "welcome.wav"


def _openai_error(response: Any, status: int, code: str, type_: str, param: str | None) -> None:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    errors = [e.message for e in VALIDATOR.iter_errors(body)]
    assert errors == [], errors
    error = body["error"]
    assert (error["code"], error["type"], error["param"]) == (code, type_, param)
    assert error["message"]


def _form(**fields: Any) -> dict[str, Any]:
    return {"file": (io.BytesIO(SAMPLE.read_bytes()), "welcome.wav"), **fields}


URL = "/v1/audio/transcriptions"


@pytest.mark.parametrize(
    ("send", "status", "code", "type_", "param"),
    [
        (lambda c: c.post(URL, data=_form()), 401, "unauthorized", "authentication_error", None),
        (
            lambda c: c.post(URL, json={"file": "x"}, headers=auth()),
            415,
            "unsupported_media_type",
            "invalid_request_error",
            None,
        ),
        (
            lambda c: c.post(
                URL,
                data={"model": "whisper-1"},
                content_type="multipart/form-data",
                headers=auth(),
            ),
            400,
            "missing_file",
            "invalid_request_error",
            "file",
        ),
        (
            lambda c: c.post(URL, data=_form(language="xx"), headers=auth()),
            400,
            "invalid_language",
            "invalid_request_error",
            "language",
        ),
        (
            lambda c: c.post(URL, data=_form(response_format="mp3"), headers=auth()),
            400,
            "invalid_response_format",
            "invalid_request_error",
            "response_format",
        ),
        (
            lambda c: c.post(URL, data=_form(colour="blue"), headers=auth()),
            400,
            "unknown_field",
            "invalid_request_error",
            "colour",
        ),
        (
            lambda c: c.post(URL, data=_form(prompt="a\x00b"), headers=auth()),
            400,
            "invalid_text",
            "invalid_request_error",
            "prompt",
        ),
        (
            lambda c: c.post(
                URL, data={"file": (io.BytesIO(b"not audio at all" * 64), "a.wav")}, headers=auth()
            ),
            400,
            "invalid_audio",
            "invalid_request_error",
            "file",
        ),
        (
            lambda c: c.get(URL, headers=auth()),
            405,
            "method_not_allowed",
            "invalid_request_error",
            None,
        ),
        # Paths under the prefixes inherit the shape, whatever endpoint is (not yet) there.
        (
            lambda c: c.post("/v1/audio/speechless", headers=auth()),
            404,
            None,
            "invalid_request_error",
            None,
        ),
        (
            lambda c: c.get("/v1/models/no-such-model-anywhere", headers=auth()),
            404,
            None,
            "invalid_request_error",
            None,
        ),
    ],
    ids=[
        "no-token",
        "json-body",
        "no-file",
        "language",
        "response-format",
        "unknown-field",
        "nul-in-prompt",
        "not-audio",
        "method",
        "unknown-audio-path",
        "unknown-model",
    ],
)
def test_openai_endpoint_errors_have_openais_shape(
    client: Any, send: Any, status: int, code: str | None, type_: str, param: str | None
) -> None:
    response = send(client)
    if code is None:  # the endpoint's own code, if it exists on this branch, else not_found
        code = response.get_json()["error"]["code"]
    _openai_error(response, status, code, type_, param)


def test_murmurs_own_errors_keep_their_shape(client: Any) -> None:
    body = client.get("/v1/jobs/job_nope", headers=auth()).get_json()
    assert body["error"]["code"] == "job_not_found" and body["error"]["message"]


def test_the_openai_client_reads_type_param_and_code(live_api: LiveApi) -> None:
    api = openai.OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad, SAMPLE.open("rb") as audio:
        api.audio.transcriptions.create(model="whisper-1", file=audio, language="xx")
    assert (bad.value.type, bad.value.param, bad.value.code) == (
        "invalid_request_error",
        "language",
        "invalid_language",
    )
    wrong = openai.OpenAI(base_url=f"{live_api.url}/v1", api_key="wrong-" + "k" * 40, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied, SAMPLE.open("rb") as audio:
        wrong.audio.transcriptions.create(model="whisper-1", file=audio)
    assert denied.value.type == "authentication_error" and denied.value.param is None
    assert denied.value.code == "unauthorized"
