"""docker/Caddyfile, run by Debian's caddy with `tls internal` in front of the production
gunicorn command on loopback: what passes, what is refused at the edge, the body cap, HSTS,
and a synchronous transcription that outlasts the wait without being cut off."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from sqlalchemy import select, update

from app.config import ApiSettings
from app.credentials import InstanceCredential, sign_audio_url
from app.db import Database
from app.jobs.service import DONE_CHANNEL
from app.models import Job, JobStatus, WorkerState
from tests.conftest import (
    ADMIN_TOKEN,
    API_TOKEN,
    FIXTURES,
    ROOT,
    SIGNING_KEY,
    Proc,
    add_worker,
    auth,
    free_port,
    start_process,
    wait_for,
)
from tests.serving import Gunicorn, gunicorn_api

CADDYFILE = ROOT / "docker" / "Caddyfile"
SPEECH = FIXTURES / "speech-short.wav"
SCRAPE_TOKEN = "test-scrape-token-" + "f" * 32
# docker/Caddyfile's default cap: the API's upload cap plus its 64 KiB of form framing.
MAX_BODY = ApiSettings().max_upload_bytes + 64 * 1024

pytestmark = pytest.mark.skipif(
    shutil.which("caddy") is None, reason="caddy is not installed (Debian: apt-get install caddy)"
)


@dataclass
class Edge:
    url: str
    port: int
    ca: str
    api: Gunicorn
    db: Database

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", verify=self.ca, timeout=30, **kw)

    def api_paths(self) -> list[str]:
        """Every path gunicorn's access log shows, in order (what reached the API)."""
        lines = self.api.proc.output().splitlines()
        return [line.split('"')[1].split(" ")[1] for line in lines if line.count('"') >= 2]


def _caddy_env(tmp_path: Path, https_port: int, upstream: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "MURMUR_DOMAIN": f"127.0.0.1:{https_port}",
        "MURMUR_TLS": "internal",
        "MURMUR_BIND": "127.0.0.1",
        "MURMUR_UPSTREAM": upstream,
        "MURMUR_HTTP_PORT": str(free_port()),
        "MURMUR_HTTPS_PORT": str(https_port),
        "MURMUR_CADDY_ADMIN": f"127.0.0.1:{free_port()}",
    }


@contextmanager
def _running_edge(tmp_path: Path, api: Gunicorn, **extra_env: str) -> Iterator[Edge]:
    port = free_port()
    env = {**_caddy_env(tmp_path, port, api.url.removeprefix("http://")), **extra_env}
    args = ["caddy", "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"]
    proc: Proc = start_process(args, env, tmp_path / "caddy.log")
    ca = tmp_path / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
    url = f"https://127.0.0.1:{port}"

    def up() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"caddy exited:\n{proc.output()}")
        if not ca.exists():
            return False
        try:  # a path the edge answers itself, so the API's access log stays untouched
            return requests.get(f"{url}/ready-probe", verify=str(ca), timeout=2).status_code == 404
        except requests.RequestException:
            return False

    db = Database(api.env["MURMUR_DATABASE_URL"])
    try:
        wait_for(up, 30, "caddy to serve HTTPS with its internal CA", step=0.2)
        yield Edge(url, port, str(ca), api, db)
    finally:
        proc.stop()
        db.dispose()


def _api(tmp_path: Path, redis_url: str) -> AbstractContextManager[Gunicorn]:
    return gunicorn_api(
        tmp_path,
        redis_url,
        workers=1,
        threads=2,
        MURMUR_SCRAPE_TOKEN=SCRAPE_TOKEN,
        MURMUR_SYNC_TIMEOUT_SECONDS="120",
        MURMUR_STREAM_HEARTBEAT_SECONDS="2",
    )


@pytest.fixture()
def edge(tmp_path: Path, redis_url: str, clean_redis: redis.Redis) -> Iterator[Edge]:
    with _api(tmp_path, redis_url) as api, _running_edge(tmp_path, api) as running:
        yield running


def _submit(edge: Edge) -> str:
    with SPEECH.open("rb") as fh:
        answer = requests.post(
            f"{edge.url}/v1/jobs", headers=auth(), files={"file": fh}, verify=edge.ca, timeout=30
        )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def test_the_public_routes_pass_with_hsts(edge: Edge) -> None:
    job_id = _submit(edge)
    listed = edge.get("/v1/jobs", headers=auth())
    assert listed.status_code == 200
    assert "max-age=31536000" in listed.headers["Strict-Transport-Security"]
    assert edge.get(f"/v1/jobs/{job_id}", headers=auth()).json()["id"] == job_id
    # Not finished yet: the API itself answers (JSON error shape, not the edge's 404).
    transcript = edge.get(f"/v1/jobs/{job_id}/transcript", headers=auth())
    assert transcript.status_code == 409 and "error" in transcript.json()
    # The API still asks for its own credentials behind the edge.
    assert edge.get("/v1/jobs").status_code == 401

    # A worker's callback and its signed audio URL.
    worker = add_worker(edge.db, state=WorkerState.READY)
    cred = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id)
    beat = requests.post(
        f"{edge.url}/internal/workers/{worker.id}/{worker.instance_id}/heartbeat",
        headers={"Authorization": f"Bearer {cred.token}"},
        verify=edge.ca,
        timeout=30,
    )
    assert beat.status_code == 200, beat.text
    with edge.db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.RUNNING.value, worker_id=worker.id, attempts=1)
        )
    query = sign_audio_url(SIGNING_KEY, job_id, worker.id, 1, 60)
    audio = edge.get(f"/internal/audio/{job_id}?{query}")
    assert audio.status_code == 200 and audio.content == SPEECH.read_bytes()

    # The API's description and its page, public as on the API itself.
    assert edge.get("/openapi.json").json()["openapi"] == "3.0.3"
    page = edge.get("/docs")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    css = edge.get("/docs/assets/swagger-ui.css")
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")
    assert edge.get("/v1/models", headers=auth()).json()["object"] == "list"
    # whisper-asr-webservice's endpoints pass, and want a token like the rest.
    for path in ("/asr", "/detect-language"):
        with SPEECH.open("rb") as fh:
            answer = requests.post(
                f"{edge.url}{path}", files={"audio_file": fh}, verify=edge.ca, timeout=30
            )
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"

    # /metrics passes, and the API still wants the scrape token.
    assert edge.get("/metrics").status_code == 401
    scraped = edge.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert scraped.status_code == 200 and "murmur_" in scraped.text


@pytest.mark.parametrize(
    "path",
    [
        "/v1/fleet",
        "/v1/workers/w-1/diagnostics",
        "/readyz",
        "/healthz",
        "/",
        "/docs/other",
        "/asrx",
        "/flower/",
        "/grafana/",
        "/internal/other",
        "/v1/jobsx",
        # Dot segments must not walk from a public prefix to a private route.
        "/v1/jobs/../fleet",
        "/v1/jobs/%2e%2e/fleet",
        "/internal/workers/../../v1/fleet",
    ],
)
def test_every_other_route_is_refused_at_the_edge(edge: Edge, path: str) -> None:
    before = len(edge.api_paths())
    context = ssl.create_default_context(cafile=edge.ca)
    conn = http.client.HTTPSConnection("127.0.0.1", edge.port, context=context, timeout=30)
    try:  # http.client sends the path as written, dot segments included
        conn.request("GET", path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        answer = conn.getresponse()
        body = json.loads(answer.read())
    finally:
        conn.close()
    assert answer.status == 404
    assert body["error"]["code"] == "not_found"
    time.sleep(0.3)  # an access log line would be written by now
    assert edge.api_paths()[before:] == []


def test_an_oversize_body_is_refused_at_the_edge(edge: Edge) -> None:
    before = len(edge.api_paths())
    # A client that announces its length and waits for 100-continue (curl does, for big
    # bodies) reads the edge's 413 before sending a byte of the body.
    context = ssl.create_default_context(cafile=edge.ca)
    conn = http.client.HTTPSConnection("127.0.0.1", edge.port, context=context, timeout=30)
    try:
        conn.putrequest("POST", "/v1/jobs")
        for name, value in {
            **auth(),
            "Content-Type": "application/octet-stream",
            "Content-Length": str(MAX_BODY + 1),
            "Expect": "100-continue",
        }.items():
            conn.putheader(name, value)
        conn.endheaders()
        answer = conn.getresponse()
        body = json.loads(answer.read())
    finally:
        conn.close()
    assert answer.status == 413
    assert body["error"]["code"] == "payload_too_large"
    # A client that sends it all at once is cut off: the 413, or a closed connection.
    try:
        eager = requests.post(
            f"{edge.url}/v1/jobs",
            headers={**auth(), "Content-Type": "application/octet-stream"},
            data=b"\0" * (MAX_BODY + 1),
            verify=edge.ca,
            timeout=60,
        )
        assert eager.status_code == 413
    except requests.ConnectionError:
        pass
    time.sleep(0.3)
    assert edge.api_paths()[before:] == []
    # A file of the largest size the API takes passes, and the API itself judges it (it is
    # not audio: refused there).
    at_cap = requests.post(
        f"{edge.url}/v1/jobs",
        headers=auth(),
        files={"file": ("big.wav", b"\0" * ApiSettings().max_upload_bytes)},
        verify=edge.ca,
        timeout=60,
    )
    assert 400 <= at_cap.status_code < 500 and "error" in at_cap.json()
    time.sleep(0.3)
    assert edge.api_paths()[before:] == ["/v1/jobs"]


def test_a_chunked_oversize_body_is_cut_off_at_the_cap(edge: Edge) -> None:
    def chunks() -> Iterator[bytes]:
        block = b"\0" * (1024 * 1024)
        for _ in range(MAX_BODY // len(block) + 2):
            yield block

    try:
        answer = requests.post(
            f"{edge.url}/v1/jobs",
            # A form, so the API reads the body (another type is refused 415 before that).
            headers={**auth(), "Content-Type": "multipart/form-data; boundary=x"},
            data=chunks(),
            verify=edge.ca,
            timeout=60,
        )
    except requests.ConnectionError:
        return  # the edge closed the connection mid-upload: refused
    assert answer.status_code in (400, 413), answer.text
    assert "error" in answer.json()
    with edge.db.session() as s:
        assert list(s.execute(select(Job)).scalars()) == []


def test_a_long_synchronous_transcription_is_not_cut_off(edge: Edge) -> None:
    """The client waits past every default a proxy might impose; the answer still arrives."""
    answer: dict[str, Any] = {}

    def call() -> None:
        with SPEECH.open("rb") as fh:
            answer["response"] = requests.post(
                f"{edge.url}/v1/audio/transcriptions",
                headers=auth(),
                files={"file": fh},
                data={"model": "whisper-1"},
                verify=edge.ca,
                timeout=120,
            )

    thread = threading.Thread(target=call, daemon=True)
    started = time.monotonic()
    thread.start()

    def stored() -> str | None:
        with edge.db.session() as s:
            job = s.execute(select(Job)).scalars().first()
            return job.id if job is not None else None

    job_id = wait_for(stored, 30, "the synchronous job to be stored")
    time.sleep(15)  # an edge timeout shorter than this would have answered 502/504 by now
    transcript = {"text": "finished after a long wait", "language": "en", "segments": []}
    with edge.db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.SUCCEEDED.value, transcript=transcript)
        )
    broker = redis.Redis.from_url(edge.api.env["MURMUR_REDIS_URL"])
    broker.publish(DONE_CHANNEL + job_id, "succeeded")
    thread.join(60)
    assert not thread.is_alive()
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert response.json()["text"] == "finished after a long wait"
    assert time.monotonic() - started >= 15


def test_the_edge_timeouts_cover_the_longest_sync_wait_and_upload(tmp_path: Path) -> None:
    """Read from Caddy's own adaptation of the file, against the API's limits."""
    env = _caddy_env(tmp_path, free_port(), "127.0.0.1:1")
    adapted = subprocess.run(
        ["caddy", "adapt", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        env=env,
        capture_output=True,
        check=True,
        timeout=30,
    )
    config = json.loads(adapted.stdout)
    (server,) = config["apps"]["http"]["servers"].values()
    ns = 1_000_000_000
    longest_sync = ApiSettings.model_fields["sync_timeout_seconds"].metadata
    most = max(m.le for m in longest_sync if getattr(m, "le", None) is not None)
    assert server["write_timeout"] / ns > most + server["read_timeout"] / ns
    dumped = json.dumps(config)
    assert f'"max_size": {MAX_BODY}' in dumped
    assert f'"response_header_timeout": {600 * ns}' in dumped and most < 600


def test_the_front_adds_the_operators_token_for_wasr_clients_only(
    tmp_path: Path, redis_url: str, clean_redis: redis.Redis
) -> None:
    """MURMUR_WASR_TOKEN: a tokenless /asr request gets it; a sent token is kept; nothing else
    gets it."""
    with (
        _api(tmp_path, redis_url) as api,
        _running_edge(tmp_path, api, MURMUR_WASR_TOKEN=API_TOKEN) as edge,
    ):

        def asr(**headers: str) -> requests.Response:
            # A bad output: the API answers 400 once the token is accepted, stores nothing.
            with SPEECH.open("rb") as fh:
                return requests.post(
                    f"{edge.url}/asr?output=docx",
                    files={"audio_file": fh},
                    headers=headers,
                    verify=edge.ca,
                    timeout=30,
                )

        assert asr().json()["error"]["code"] == "invalid_format"
        refused = asr(Authorization="Bearer not-a-token")
        assert refused.status_code == 401
        assert edge.get("/v1/jobs").status_code == 401


def test_an_event_stream_passes_the_edge_unbuffered(edge: Edge) -> None:
    """A queued job's stream through the front: its first event and the heartbeats arrive as
    the API writes them, not when the stream ends (it never does while the job waits)."""
    job_id = _submit(edge)
    started = time.monotonic()
    with requests.get(
        f"{edge.url}/v1/jobs/{job_id}/events",
        headers=auth(),
        verify=edge.ca,
        stream=True,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = response.iter_lines(decode_unicode=True)
        assert next(line for line in lines if line.startswith("event: ")) == "event: status"
        assert next(line for line in lines if line.startswith(":")) == ": heartbeat"
    assert time.monotonic() - started < 25
