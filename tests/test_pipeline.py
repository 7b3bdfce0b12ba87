"""End to end on real parts: HTTP API, Redis, a real Celery worker process, faster-whisper."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jiwer
import pytest
import requests
from celery import Celery
from sqlalchemy import select

from app.models import Job
from app.services import utc_clock
from gpu_worker.protocol.broker import TRANSCRIBE_TASK, unacked_keys
from tests.conftest import (
    API_TOKEN,
    FIXTURES,
    WEBHOOK_SECRET,
    LiveApi,
    api_get,
    auth,
    wait_for,
)

pytestmark = pytest.mark.slow


def wer(reference: str, hypothesis: str) -> float:
    clean = jiwer.Compose(
        [
            jiwer.ToLowerCase(),
            jiwer.RemovePunctuation(),
            jiwer.RemoveMultipleSpaces(),
            jiwer.Strip(),
            jiwer.ReduceToListOfListOfWords(),
        ]
    )
    return float(
        jiwer.wer(reference, hypothesis, reference_transform=clean, hypothesis_transform=clean)
    )


def submit(live: LiveApi, name: str, **fields: str) -> dict[str, Any]:
    with (FIXTURES / name).open("rb") as fh:
        response = requests.post(
            f"{live.url}/v1/jobs",
            headers=auth(),
            files={"file": (name, fh)},
            data=fields,
            timeout=60,
        )
    assert response.status_code == 202, response.text
    return dict(response.json())


def wait_job(live: LiveApi, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = api_get(live, f"/v1/jobs/{job_id}").json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return dict(wait_for(finished, timeout, f"job {job_id} to finish", step=0.2))


def transcript(live: LiveApi, job_id: str, fmt: str) -> requests.Response:
    response = api_get(live, f"/v1/jobs/{job_id}/transcript", params={"format": fmt})
    assert response.status_code == 200, response.text
    return response


def parse_timestamp(value: str) -> float:
    h, m, rest = value.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(rest)


def parse_cues(text: str, arrow_line: re.Pattern[str]) -> list[tuple[float, float, str]]:
    cues = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = arrow_line.fullmatch(line)
        if match:
            cues.append((parse_timestamp(match[1]), parse_timestamp(match[2]), lines[i + 1]))
    return cues


SRT_ARROW = re.compile(r"(\d{2}:\d{2}:\d{2},\d{3}) --> (\d{2}:\d{2}:\d{2},\d{3})")
VTT_ARROW = re.compile(r"(\d{2}:\d{2}:\d{2}\.\d{3}) --> (\d{2}:\d{2}:\d{2}\.\d{3})")


def assert_monotonic(cues: list[tuple[float, float, str]]) -> None:
    assert cues
    previous_end = 0.0
    for start, end, text in cues:
        assert start <= end, (start, end)
        assert start >= previous_end - 1e-6
        assert text.strip()
        previous_end = end


@pytest.mark.parametrize("fixture", ["speech-short", "speech-90s"])
def test_transcribes_fixture_within_wer(live_api: LiveApi, start_worker: Any, fixture: str) -> None:
    start_worker()
    job = submit(live_api, f"{fixture}.wav")
    assert job["status"] == "dispatched"  # a live worker exists: sent at once
    done = wait_job(live_api, job["id"], timeout=180)
    assert done["status"] == "succeeded", done
    reference = (FIXTURES / f"{fixture}.txt").read_text()
    text = transcript(live_api, job["id"], "txt").text
    assert wer(reference, text) <= 0.25, text
    assert done["text"].strip() == text.strip()


def test_every_output_format(live_api: LiveApi, start_worker: Any) -> None:
    start_worker()
    job = submit(live_api, "speech-short.wav", word_timestamps="true")
    assert wait_job(live_api, job["id"])["status"] == "succeeded"

    body = transcript(live_api, job["id"], "json").json()
    # The text and its language, detected here (no language was given): with its probability.
    assert set(body) == {"text", "language", "language_probability"}
    assert "fox" in body["text"].lower() and body["language"] == "en"

    verbose = transcript(live_api, job["id"], "verbose_json").json()
    assert verbose["duration"] == pytest.approx(6.6, abs=0.2)
    segs = verbose["segments"]
    assert segs and all(s["start"] <= s["end"] for s in segs)
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(segs, segs[1:], strict=False))
    words = verbose["words"]
    assert len(words) >= 10
    assert all(w["start"] <= w["end"] for w in words)
    assert all(a["start"] <= b["start"] for a, b in zip(words, words[1:], strict=False))

    srt = transcript(live_api, job["id"], "srt")
    assert srt.headers["Content-Type"].startswith("application/x-subrip")
    blocks = srt.text.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [str(i) for i in range(1, len(blocks) + 1)]
    assert_monotonic(parse_cues(srt.text, SRT_ARROW))

    vtt = transcript(live_api, job["id"], "vtt")
    assert vtt.text.startswith("WEBVTT\n")
    assert vtt.headers["Content-Type"].startswith("text/vtt")
    assert_monotonic(parse_cues(vtt.text, VTT_ARROW))

    txt = transcript(live_api, job["id"], "txt")
    assert txt.headers["Content-Type"].startswith("text/plain")


def test_silence_succeeds_with_empty_transcript(live_api: LiveApi, start_worker: Any) -> None:
    start_worker()
    job = submit(live_api, "silence-5s.wav")
    done = wait_job(live_api, job["id"])
    assert done["status"] == "succeeded", done
    assert transcript(live_api, job["id"], "txt").text.strip() == ""
    assert transcript(live_api, job["id"], "srt").text.strip() == ""


def test_task_delivered_twice_stores_one_transcript(live_api: LiveApi, start_worker: Any) -> None:
    worker, proc = start_worker()
    job = submit(live_api, "speech-short.wav")
    first = wait_job(live_api, job["id"])
    assert first["status"] == "succeeded"
    with live_api.db.session() as s:
        stored_before = s.get(Job, job["id"]).transcript  # type: ignore[union-attr]
    # Redeliver the same task id twice, as acks_late would after a lost ack.
    celery = Celery(broker=live_api.settings.redis_url)
    for _ in range(2):
        celery.send_task(TRANSCRIBE_TASK, args=[job["id"]], queue="transcribe.local-cpu")
    import redis

    broker = redis.Redis.from_url(live_api.settings.redis_url)
    wait_for(
        lambda: (
            broker.llen("transcribe.local-cpu") == 0
            and broker.hlen(unacked_keys("transcribe.local-cpu")["unacked_key"]) == 0
        ),
        60,
        "both redeliveries to be consumed and acknowledged",
    )
    with live_api.db.session() as s:
        row = s.get(Job, job["id"])
        assert row is not None
        assert row.status == "succeeded"
        assert row.attempts == 1
        assert row.transcript == stored_before
        assert row.finished_at is not None
    # And a result posted twice for the same job is stored once.
    from app.credentials import InstanceCredential

    cred = InstanceCredential.derive(
        live_api.settings.reveal("signing_key"), worker.id, worker.instance_id or ""
    )
    again = requests.post(
        f"{live_api.url}/internal/workers/{worker.id}/{worker.instance_id}/jobs/{job['id']}/result",
        headers={"Authorization": f"Bearer {cred.token}"},
        json={"transcript": {"text": "overwritten", "segments": []}, "processing_seconds": 1.0},
        timeout=10,
    )
    assert again.json() == {"stored": False}
    assert api_get(live_api, f"/v1/jobs/{job['id']}").json()["text"] == first["text"]


def test_cancel_queued_job_is_never_transcribed(live_api: LiveApi, start_worker: Any) -> None:
    job = submit(live_api, "speech-short.wav")  # no worker yet: stays queued
    assert job["status"] == "queued"
    cancelled = requests.delete(f"{live_api.url}/v1/jobs/{job['id']}", headers=auth(), timeout=10)
    assert cancelled.json()["status"] == "cancelled"
    from app.jobs.dispatch import dispatch_job

    assert not dispatch_job(
        live_api.db,
        Celery(broker=live_api.settings.redis_url),
        job["id"],
        "local-cpu",
        now=utc_clock(),
    )
    assert api_get(live_api, f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []
    fail_first = 0

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if _Receiver.fail_first > 0:
            _Receiver.fail_first -= 1
            self.send_response(503)
            self.end_headers()
            return
        _Receiver.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_webhook_is_signed_and_retried(
    live_api: LiveApi, start_worker: Any, io_worker: Any
) -> None:
    _Receiver.received = []
    _Receiver.fail_first = 1  # the first delivery fails: the second, after back-off, lands
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        start_worker()
        hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
        job = submit(live_api, "speech-short.wav", webhook_url=hook)
        wait_for(lambda: _Receiver.received, 60, "the webhook")
    finally:
        server.shutdown()
    headers, body = _Receiver.received[0]
    signature = headers["X-Murmur-Signature"]
    timestamp, mac = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", signature).groups()  # type: ignore[union-attr]
    expected = hmac.new(
        WEBHOOK_SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(mac, expected)
    assert abs(int(timestamp) - time.time()) < 120
    payload = json.loads(body)
    assert payload["id"] == job["id"] and payload["event"] == "job.succeeded"
    assert "fox" in payload["text"].lower()
    wait_for(
        lambda: api_get(live_api, f"/v1/jobs/{job['id']}").json()["webhook_status"] == "delivered",
        10,
        "webhook status",
    )


class _AudioServer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/speech.wav":
            data = (FIXTURES / "speech-short.wav").read_bytes()
        elif self.path == "/page.html":
            data = b"<html><body>not audio</body></html>" * 50
        elif self.path == "/huge.wav":
            self.send_response(200)
            self.send_header("Content-Length", str(10**10))
            self.end_headers()
            return
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_url_jobs(live_api: LiveApi, start_worker: Any, io_worker: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AudioServer)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        start_worker()
        ids = {}
        for name in ("speech.wav", "page.html", "huge.wav", "missing.wav"):
            response = requests.post(
                f"{live_api.url}/v1/jobs",
                headers=auth(),
                json={"url": f"{base}/{name}"},
                timeout=10,
            )
            assert response.status_code == 202, response.text
            ids[name] = response.json()["id"]
        results = {name: wait_job(live_api, job_id) for name, job_id in ids.items()}
    finally:
        server.shutdown()
    assert results["speech.wav"]["status"] == "succeeded"
    assert "fox" in results["speech.wav"]["text"].lower()
    assert results["page.html"]["status"] == "failed"
    assert results["page.html"]["error"]["code"] == "url_not_audio"
    assert results["huge.wav"]["error"]["code"] == "url_too_large"
    # The refusal names the setting that raises the limit.
    assert "api.max_upload_bytes" in results["huge.wav"]["error"]["message"]
    assert results["missing.wav"]["error"] == {
        "code": "url_fetch_failed",
        "message": "the URL answered HTTP 404",
    }


def test_openai_client_works_unchanged(live_api: LiveApi, start_worker: Any) -> None:
    import openai

    start_worker()
    client = openai.OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN, max_retries=0)
    path = FIXTURES / "speech-short.wav"
    with path.open("rb") as fh:
        result = client.audio.transcriptions.create(model="whisper-1", file=fh)
    assert "fox" in result.text.lower()
    with path.open("rb") as fh:
        srt = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="srt")
    assert_monotonic(parse_cues(str(srt), SRT_ARROW))
    with path.open("rb") as fh:
        text = client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="text", language="en"
        )
    assert "fox" in str(text).lower()
    with path.open("rb") as fh:
        verbose = client.audio.transcriptions.create(
            model="whisper-1",
            file=fh,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    assert verbose.duration == pytest.approx(6.6, abs=0.2)
    assert verbose.words and verbose.segments
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{live_api.url}/v1", api_key="wrong", max_retries=0
        ).audio.transcriptions.create(model="whisper-1", file=path.open("rb"))


def test_openai_timeout_answers_504_with_job_id(live_api: LiveApi) -> None:
    import openai

    live_api.settings.__dict__["api"] = live_api.settings.api.model_copy(
        update={"sync_timeout_seconds": 1.0}
    )
    client = openai.OpenAI(base_url=f"{live_api.url}/v1", api_key=API_TOKEN)
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.audio.transcriptions.create(
            model="whisper-1", file=(FIXTURES / "speech-short.wav").open("rb")
        )
    assert time.monotonic() - started < 10, "the client retried a 504"
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "timeout"
    job_id = error["job_id"]
    assert api_get(live_api, f"/v1/jobs/{job_id}").json()["status"] == "queued"
    with live_api.db.session() as s:
        assert len(list(s.execute(select(Job)).scalars())) == 1  # no duplicate from retries


def test_broker_down_keeps_the_job_and_dispatches_it_later(
    live_api: LiveApi, tmp_path: Path
) -> None:
    """Policy: an upload accepted while the broker is down is kept (202, queued) and dispatched
    as soon as the broker answers again; nothing of the client's is lost."""
    from app import create_app
    from app.celery_config import make_celery
    from app.jobs.dispatch import dispatch_job
    from app.models import Worker, WorkerState
    from tests.conftest import add_worker

    add_worker(live_api.db, state=WorkerState.READY)  # a live worker: would dispatch at once
    dead = live_api.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    app = create_app(dead, db=live_api.db, celery=make_celery(dead))
    with (FIXTURES / "speech-short.wav").open("rb") as fh:
        response = app.test_client().post(
            "/v1/jobs",
            headers=auth(),
            data={"file": (fh, "speech-short.wav")},
            content_type="multipart/form-data",
        )
    assert response.status_code == 202
    job = response.get_json()
    assert job["status"] == "queued"
    with live_api.db.session() as s:
        row = s.get(Job, job["id"])
        assert row is not None and row.audio_key is not None
        assert s.execute(select(Worker)).scalars().first() is not None
    # The broker is back (the real one): the next dispatch sends it.
    celery = make_celery(live_api.settings)
    assert dispatch_job(live_api.db, celery, job["id"], "local-cpu", now=utc_clock())
    import redis

    assert redis.Redis.from_url(live_api.settings.redis_url).llen("transcribe.local-cpu") == 1
    assert api_get(live_api, f"/v1/jobs/{job['id']}").json()["status"] == "dispatched"


def test_compressed_upload_transcribes(live_api: LiveApi, start_worker: Any) -> None:
    from tests.audio_encode import encode

    start_worker()
    mp3 = encode(FIXTURES / "speech-short.wav", "mp3", "libmp3lame", 16000)
    response = requests.post(
        f"{live_api.url}/v1/jobs", headers=auth(), files={"file": ("memo.mp3", mp3)}, timeout=30
    )
    assert response.status_code == 202, response.text
    done = wait_job(live_api, response.json()["id"])
    assert done["status"] == "succeeded", done
    assert wer((FIXTURES / "speech-short.txt").read_text(), done["text"]) <= 0.25
