"""whisper-asr-webservice's clients against the real stack: requests as they send them (the
audio as the multipart part `audio_file`, options in the query string, as its README's curl
lines do) to a live API with a real worker process running faster-whisper (the CPU profile's
multilingual Whisper base).

Each request is an ordinary job (listed under the caller's token), its answer has
whisper-asr-webservice's shape, and the decoding options (`encode=false` PCM, `vad_filter`,
OpenAI's `temperature`) reach faster-whisper for real.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import pytest
import requests

from app.jobs.formats import FORMATS
from tests.conftest import FIXTURES, ROOT, LiveApi, api_get, auth
from tests.test_pipeline import SRT_ARROW, VTT_ARROW, assert_monotonic, parse_cues

pytestmark = pytest.mark.slow

SPEECH = FIXTURES / "speech-short.wav"
LONG = FIXTURES / "speech-90s.wav"
GERMAN = ROOT / "samples" / "guten-morgen.wav"


def wasr(
    live: LiveApi, path: str, audio: bytes, name: str = "speech-short.wav", **query: str
) -> requests.Response:
    """curl -F audio_file=@speech-short.wav "$URL/asr?output=json" (with a token)."""
    return requests.post(
        f"{live.url}{path}",
        params=query,
        files={"audio_file": (name, audio)},
        headers=auth(),
        timeout=120,
    )


def pcm(path: Path) -> bytes:
    """The 16 kHz mono 16-bit samples of a WAV fixture: what a client sends with encode=false."""
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        return w.readframes(w.getnframes())


def listed(live: LiveApi) -> dict[str, dict[str, Any]]:
    page = api_get(live, "/v1/jobs", params={"limit": 100}).json()
    return {job["id"]: job for job in page["data"]}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_wasr_clients_get_their_shapes_from_ordinary_jobs(
    live_api: LiveApi, start_worker: Any
) -> None:
    start_worker()
    audio = SPEECH.read_bytes()

    # Defaults: task=transcribe, output=txt, as a file named after the upload.
    text = wasr(live_api, "/asr", audio)
    assert text.status_code == 200, text.text
    assert text.headers["Content-Disposition"] == 'attachment; filename="speech-short.wav.txt"'
    assert text.headers["Content-Type"].startswith("text/plain")
    assert "fox" in text.text.lower()

    as_json = wasr(live_api, "/asr", audio, output="json", word_timestamps="true", language="en")
    assert as_json.status_code == 200, as_json.text
    body = as_json.json()
    assert set(body) == {"text", "segments", "language"}
    assert body["language"] == "en" and "fox" in body["text"].lower()
    first = body["segments"][0]
    assert {"id", "seek", "start", "end", "text", "tokens", "temperature"} <= set(first)
    assert first["words"] and set(first["words"][0]) == {"start", "end", "word", "probability"}
    no_words = wasr(live_api, "/asr", audio, output="json").json()
    assert all(seg["words"] is None for seg in no_words["segments"])

    srt = wasr(live_api, "/asr", audio, output="srt", task="transcribe")
    assert srt.headers["Content-Disposition"].endswith('.srt"')
    assert_monotonic(parse_cues(srt.text, SRT_ARROW))
    vtt = wasr(live_api, "/asr", audio, output="vtt", initial_prompt="Quick brown fox.")
    assert vtt.text.startswith("WEBVTT")
    assert_monotonic(parse_cues(vtt.text, VTT_ARROW))

    # encode=false: raw PCM, as Bazarr sends it.
    raw = wasr(live_api, "/asr", pcm(SPEECH), name="speech.pcm", encode="false")
    assert raw.status_code == 200, raw.text
    assert "fox" in raw.text.lower()

    # Without VAD the whole file is decoded, and the words are still found.
    unfiltered = wasr(live_api, "/asr", audio, vad_filter="false", output="json").json()
    assert "fox" in unfiltered["text"].lower()

    # Every answer was a job of this token's, with its options on it.
    jobs = listed(live_api)
    for answer in (text, as_json, srt, vtt, raw):
        job = jobs[answer.headers["X-Murmur-Job-Id"]]
        assert job["status"] == "succeeded"
    assert jobs[as_json.headers["X-Murmur-Job-Id"]]["word_timestamps"] is True
    assert jobs[raw.headers["X-Murmur-Job-Id"]]["duration_seconds"] == pytest.approx(6.6, abs=0.1)
    assert sum(1 for job in jobs.values() if job["vad_filter"] is False) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_detect_language_looks_at_the_first_30_seconds(
    live_api: LiveApi, start_worker: Any
) -> None:
    start_worker()
    detected = wasr(live_api, "/detect-language", LONG.read_bytes(), name="speech-90s.wav")
    assert detected.status_code == 200, detected.text
    body = detected.json()
    assert set(body) == {"detected_language", "language_code", "confidence"}
    assert (body["detected_language"], body["language_code"]) == ("english", "en")
    assert 0.5 < body["confidence"] <= 1.0
    job = listed(live_api)[detected.headers["X-Murmur-Job-Id"]]
    assert job["status"] == "succeeded"
    assert job["duration_seconds"] == pytest.approx(30.0, abs=0.05)

    # German, sent as Bazarr sends it: raw PCM.
    german = wasr(live_api, "/detect-language", pcm(GERMAN), name="de.pcm", encode="false")
    assert german.status_code == 200, german.text
    assert (german.json()["detected_language"], german.json()["language_code"]) == (
        "german",
        "de",
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_openai_temperature_decodes_at_that_temperature(
    live_api: LiveApi, start_worker: Any
) -> None:
    start_worker()
    with SPEECH.open("rb") as fh:
        answer = requests.post(
            f"{live_api.url}/v1/audio/transcriptions",
            headers=auth(),
            files={"file": ("speech-short.wav", fh)},
            data={"model": "whisper-1", "response_format": "verbose_json", "temperature": "0.6"},
            timeout=120,
        )
    assert answer.status_code == 200, answer.text
    segments = answer.json()["segments"]
    # One temperature, no fallback ladder: faster-whisper's default would start at 0.0.
    assert segments and all(seg["temperature"] == pytest.approx(0.6) for seg in segments)
    job = listed(live_api)[answer.headers["X-Murmur-Job-Id"]]
    assert job["temperature"] == pytest.approx(0.6)


@pytest.mark.skipif("tsv" not in FORMATS, reason="app/jobs/formats.py does not write tsv yet")
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_wasr_tsv_output(live_api: LiveApi, start_worker: Any) -> None:
    start_worker()
    answer = wasr(live_api, "/asr", SPEECH.read_bytes(), output="tsv")
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Disposition"] == 'attachment; filename="speech-short.wav.tsv"'
    lines = answer.text.splitlines()
    assert lines[0] == "start\tend\ttext"
    start, end, spoken = lines[1].split("\t", 2)
    assert 0 <= int(start) <= int(end) <= 7000 and spoken.strip()
