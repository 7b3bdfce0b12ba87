"""Languages, translation and model choice end to end, on the real Whisper base model, offline.

Two real worker processes: an English-only `english` profile (tiny.en) first in the
allowlist, then `local-cpu` serving multilingual Whisper base (assembled from its two
wheels). German and Spanish clips (espeak-ng) are detected, transcribed and translated to
English; the official `openai` client drives /v1/audio/translations, /v1/audio/transcriptions
and /v1/models, and every answer validates against the schemas OpenAI publishes
(tests/fixtures/openai-audio-models-schemas.json). Routing: the English-only profile never
gets a German job, and a request no profile can serve is refused at submission.

One test function on SQLite only: the two models load once for the whole module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import openai
import pytest
import requests

from tests.conftest import API_TOKEN, FIXTURES, ROOT, LiveApi, api_get, auth, wait_for

pytestmark = pytest.mark.slow

GERMAN = ROOT / "samples" / "guten-morgen.wav"
SPANISH = FIXTURES / "speech-es.wav"
ENGLISH = FIXTURES / "speech-short.wav"
SCHEMAS = json.loads((FIXTURES / "openai-audio-models-schemas.json").read_text())

CONFIG = """
[[profiles]]
name = "english"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "tiny.en"
compute_type = "int8"
vad = "silero"
batch_size = 8
max_workers = 1

[[profiles]]
name = "local-cpu"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "base"
compute_type = "int8"
vad = "silero"
batch_size = 8
max_workers = 1
"""


def conforms(body: Any, schema: str) -> None:
    """`body` is valid under OpenAI's published schema `schema`."""
    validator = jsonschema_rs.validator_for({"$ref": f"#/components/schemas/{schema}", **SCHEMAS})
    errors = [error.message for error in validator.iter_errors(body)]
    assert not errors, (schema, errors, body)


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "murmur.toml"
    config.write_text(CONFIG)
    return {"MURMUR_CONFIG": str(config)}


def _submit(live: LiveApi, audio: Path, **fields: str) -> requests.Response:
    with audio.open("rb") as handle:
        return requests.post(
            f"{live.url}/v1/jobs",
            headers=auth(),
            files={"file": (audio.name, handle)},
            data=fields,
            timeout=60,
        )


def _finished(live: LiveApi, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job: dict[str, Any] = api_get(live, f"/v1/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    job: dict[str, Any] = wait_for(done, 300, f"job {job_id} to finish", step=0.5)
    assert job["status"] == "succeeded", job
    return job


def _refused(response: requests.Response) -> tuple[int, str, str]:
    error = response.json()["error"]
    return response.status_code, error["code"], error["message"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_languages_translation_and_models_on_real_models(
    live_api: LiveApi, start_worker: Any
) -> None:
    start_worker("english")
    start_worker("local-cpu")
    client = openai.OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)

    # -- refused at submission, before any audio is stored ----------------------------------
    status, code, message = _refused(_submit(live_api, GERMAN, language="de", model="tiny.en"))
    assert (status, code) == (400, "unsupported_language")
    assert "English-only" in message and "base" in message and "tiny.en" in message
    status, code, _ = _refused(_submit(live_api, GERMAN, task="translate", model="tiny.en"))
    assert (status, code) == (400, "translation_unavailable")
    status, code, _ = _refused(_submit(live_api, GERMAN, diarize="true"))
    assert (status, code) == (400, "diarization_unavailable")
    status, code, message = _refused(_submit(live_api, GERMAN, model="large-v9"))
    assert (status, code) == (400, "model_not_found")
    assert "base" in message
    with pytest.raises(openai.BadRequestError) as unknown:
        client.audio.transcriptions.create(model="large-v9", file=GERMAN.open("rb"))
    assert unknown.value.status_code == 400
    assert unknown.value.body["code"] == "model_not_found"  # type: ignore[index]

    # -- a German file without a language: detected, on the multilingual profile only -------
    submitted = _submit(live_api, GERMAN)
    assert submitted.status_code == 202, submitted.text
    job = _finished(live_api, submitted.json()["id"])
    assert job["profile"] == "local-cpu"  # never the English-only profile first in line
    assert job["language"] == "de"
    assert 0.5 < job["language_probability"] <= 1.0
    assert job["task"] == "transcribe"
    assert "Morgen" in job["text"] and "Bahnhof" in job["text"], job["text"]
    short = api_get(live_api, f"/v1/jobs/{job['id']}/transcript?format=json").json()
    assert short["language"] == "de" and short["language_probability"] > 0.5
    verbose = api_get(live_api, f"/v1/jobs/{job['id']}/transcript?format=verbose_json").json()
    assert verbose["language"] == "de"  # Murmur's own API: the ISO 639-1 code
    conforms(verbose, "CreateTranscriptionResponseVerboseJson")
    # The worker computes word times for every job (subtitle cues need them); a client that
    # did not ask for words does not get them.
    assert "words" not in verbose and all("words" not in s for s in verbose["segments"])

    # -- model choice: tiny.en picks the English-only profile ------------------------------
    submitted = _submit(live_api, ENGLISH, model="tiny.en")
    english = _finished(live_api, submitted.json()["id"])
    assert (english["profile"], english["model"], english["language"]) == (
        "english",
        "tiny.en",
        "en",
    )

    # -- translation through the official client, unchanged ---------------------------------
    raw = client.audio.translations.with_raw_response.create(
        model="whisper-1", file=GERMAN.open("rb"), response_format="verbose_json"
    )
    body = raw.http_response.json()
    conforms(body, "CreateTranslationResponseVerboseJson")
    assert body["language"] == "english" and body["task"] == "translate"
    assert "morning" in body["text"].lower() and "Guten" not in body["text"], body["text"]
    assert "words" not in body, body
    translation = raw.parse()
    assert translation.text == body["text"]
    text = client.audio.translations.create(
        model="base", file=GERMAN.open("rb"), response_format="text"
    )
    assert "morning" in str(text).lower()

    # -- Spanish through the OpenAI transcriptions endpoint: OpenAI's language name ---------
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=SPANISH.open("rb"), response_format="verbose_json"
    )
    spanish = raw.http_response.json()
    conforms(spanish, "CreateTranscriptionResponseVerboseJson")
    assert spanish["language"] == "spanish"
    assert "Madrid" in spanish["text"] and "playa" in spanish["text"], spanish["text"]

    # -- /v1/models through the client --------------------------------------------------------
    listed = client.models.with_raw_response.list()
    conforms(listed.http_response.json(), "ListModelsResponse")
    ids = [model.id for model in listed.parse()]
    assert ids == ["tiny.en", "base", "whisper-1"]
    base = client.models.retrieve("base")
    conforms(base.model_dump(exclude_none=True), "Model")
    assert base.to_dict()["multilingual"] is True
    assert client.models.retrieve("whisper-1").to_dict()["alias_of"] == "tiny.en"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("large-v9")
