"""POST /v1/audio/transcriptions under load and faults: bounded waiters, a client that leaves,
Redis down, a job cancelled while the client waits. No GPU worker runs: jobs never finish
unless a test finishes them."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
import requests
from sqlalchemy import func, select, update
from werkzeug.serving import make_server

from app import create_app
from app.config import Settings
from app.db import Database
from app.jobs.service import DONE_CHANNEL
from app.migrate import upgrade
from app.models import Job, JobStatus
from tests.conftest import (
    API_TOKEN,
    FIXTURES,
    LiveApi,
    api_get,
    auth,
    free_port,
    make_settings,
    wait_for,
)
from tests.serving import Gunicorn, gunicorn_api

SPEECH = FIXTURES / "speech-short.wav"


def _jobs(db: Database) -> list[Job]:
    with db.session() as s:
        return list(s.execute(select(Job).order_by(Job.created_at)).scalars())


def _sync_request(url: str) -> bytes:
    """The raw bytes of a synchronous transcription request, to send on a socket we control."""
    prepared = requests.Request(
        "POST",
        f"{url}/v1/audio/transcriptions",
        headers=auth(),
        files={"file": ("speech.wav", SPEECH.read_bytes())},
        data={"model": "whisper-1"},
    ).prepare()
    host = url.removeprefix("http://")
    head = f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {host}\r\n"
    for name, value in prepared.headers.items():
        head += f"{name}: {value}\r\n"
    assert isinstance(prepared.body, bytes)
    return head.encode() + b"\r\n" + prepared.body


def _open_waiter(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(_sync_request(url))
    return sock


def _answered_within(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    try:
        return sock.recv(65536)
    except TimeoutError:
        return b""


@pytest.fixture()
def api(tmp_path: Path, redis_url: str, clean_redis: redis.Redis) -> Iterator[Gunicorn]:
    """One process, ONE general thread and two for synchronous waits: the tightest budget."""
    with gunicorn_api(
        tmp_path,
        redis_url,
        workers=1,
        threads=1,
        MURMUR_SYNC_MAX_WAITING="2",
        MURMUR_SYNC_TIMEOUT_SECONDS="60",
    ) as server:
        yield server


def test_waiters_leave_room_for_every_other_request(api: Gunicorn) -> None:
    db = Database(api.env["MURMUR_DATABASE_URL"])
    socks: list[socket.socket] = []
    try:
        socks = [_open_waiter(api.url) for _ in range(2)]
        wait_for(lambda: len(_jobs(db)) == 2, 20, "both synchronous jobs to be stored")
        job_id = _jobs(db)[0].id
        # The general thread still serves everything else, at once.
        assert requests.get(f"{api.url}/healthz", timeout=5).status_code == 200
        assert requests.get(f"{api.url}/v1/jobs/{job_id}", headers=auth(), timeout=5).ok
        assert requests.get(f"{api.url}/v1/jobs", headers=auth(), timeout=5).ok
        with SPEECH.open("rb") as fh:
            submitted = requests.post(
                f"{api.url}/v1/jobs", headers=auth(), files={"file": fh}, timeout=10
            )
        assert submitted.status_code == 202, submitted.text
        # A third synchronous request is refused before anything is stored.
        with SPEECH.open("rb") as fh:
            refused = requests.post(
                f"{api.url}/v1/audio/transcriptions",
                headers=auth(),
                files={"file": fh},
                data={"model": "whisper-1"},
                timeout=10,
            )
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "5"
        assert refused.json()["error"]["code"] == "sync_capacity_exhausted"
        assert len(_jobs(db)) == 3  # the two waiting, the asynchronous one
    finally:
        for sock in socks:
            sock.close()
        db.dispose()


def test_a_client_that_leaves_frees_its_slot(api: Gunicorn) -> None:
    db = Database(api.env["MURMUR_DATABASE_URL"])
    socks: list[socket.socket] = []
    try:
        socks = [_open_waiter(api.url) for _ in range(2)]
        wait_for(lambda: len(_jobs(db)) == 2, 20, "both synchronous jobs to be stored")
        full = _open_waiter(api.url)
        assert b" 503 " in _answered_within(full, 10).split(b"\r\n", 1)[0]
        full.close()
        socks.pop(0).close()  # the client gives up; its waiter must notice and stop

        def accepted() -> bool:
            sock = _open_waiter(api.url)
            if _answered_within(sock, 1.5):  # answered at once: still refused
                sock.close()
                return False
            socks.append(sock)  # it waits: it got the freed slot
            return True

        wait_for(accepted, 10, "a new synchronous request to get the freed slot", step=0.5)
        wait_for(lambda: len(_jobs(db)) == 3, 10, "the new request's job")
        # The abandoned job is kept (a retry with its Idempotency-Key would find it).
        assert _jobs(db)[0].status == JobStatus.QUEUED.value
    finally:
        for sock in socks:
            sock.close()
        db.dispose()


# --- Redis down: a private redis-server the test starts and stops -----------------------------


class PrivateRedis:
    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.dir = tmp_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_for(up, 10, "the private redis-server")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def served(tmp_path: Path, private_redis: PrivateRedis) -> Iterator[tuple[str, Settings, Database]]:
    """The API on real HTTP (in this process) with the private Redis as broker and pub/sub."""
    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    settings = make_settings(url, private_redis.url, tmp_path, MURMUR_SYNC_TIMEOUT_SECONDS="30")
    db = Database(url)
    port = free_port()
    server = make_server("127.0.0.1", port, create_app(settings, db=db), threaded=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{port}", settings, db
    finally:
        server.shutdown()
        db.dispose()


def _client(url: str) -> openai.OpenAI:
    # The official client with its default retries: any retry would show up as a second job.
    return openai.OpenAI(base_url=f"{url}/v1", api_key=API_TOKEN, timeout=60)


def test_redis_down_answers_503_with_the_kept_job_and_no_retry(
    served: tuple[str, Settings, Database], private_redis: PrivateRedis
) -> None:
    url, _, db = served
    private_redis.stop()
    with pytest.raises(openai.APIStatusError) as info, SPEECH.open("rb") as fh:
        _client(url).audio.transcriptions.create(model="whisper-1", file=fh)
    response = info.value.response
    assert response.status_code == 503
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert error["code"] == "broker_unavailable"
    assert response.headers["Location"] == f"/v1/jobs/{error['job_id']}"
    jobs = _jobs(db)
    assert [j.id for j in jobs] == [error["job_id"]]  # one job: the client did not retry
    # Kept with its audio, queued for the reconcile once the broker is back.
    assert jobs[0].status == JobStatus.QUEUED.value and jobs[0].audio_key is not None


def test_redis_lost_during_the_wait_still_answers_the_transcript(
    served: tuple[str, Settings, Database], private_redis: PrivateRedis
) -> None:
    url, _, db = served
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            with SPEECH.open("rb") as fh:
                answer["ok"] = _client(url).audio.transcriptions.create(model="whisper-1", file=fh)
        except Exception as exc:  # reported below
            answer["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    job_id = wait_for(lambda: [j.id for j in _jobs(db)], 20, "the job to be stored")[0]
    broker = redis.Redis.from_url(private_redis.url)
    channel = DONE_CHANNEL + job_id
    wait_for(lambda: broker.pubsub_numsub(channel)[0][1] == 1, 20, "the waiter to subscribe")
    private_redis.stop()
    transcript = {"text": "hello from the database", "language": "en", "segments": []}
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.SUCCEEDED.value, transcript=transcript)
        )
    thread.join(30)
    assert not thread.is_alive(), "the waiter did not notice the job ended"
    assert "error" not in answer, answer.get("error")
    assert answer["ok"].text == "hello from the database"
    with db.session() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1


def test_cancelled_while_waiting_is_409_with_job_id_and_no_retry(live_api: LiveApi) -> None:
    db = live_api.db
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            with SPEECH.open("rb") as fh:
                _client(live_api.url).audio.transcriptions.create(model="whisper-1", file=fh)
        except Exception as exc:
            answer["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    job_id = wait_for(lambda: [j.id for j in _jobs(db)], 20, "the job to be stored")[0]
    cancelled = requests.delete(f"{live_api.url}/v1/jobs/{job_id}", headers=auth(), timeout=10)
    assert cancelled.status_code == 200, cancelled.text
    thread.join(30)
    assert not thread.is_alive(), "the waiter did not notice the cancellation"
    error = answer["error"]
    assert isinstance(error, openai.ConflictError), error
    assert error.response.headers["x-should-retry"] == "false"
    body = error.response.json()["error"]
    assert body["code"] == "job_cancelled" and body["job_id"] == job_id
    assert [j.id for j in _jobs(db)] == [job_id]  # not retried
    assert api_get(live_api, f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


@pytest.mark.parametrize(
    ("error_code", "status"),
    [("audio_decode_failed", 400), ("audio_too_long", 400), ("too_many_attempts", 502)],
)
def test_a_failed_job_is_answered_by_whose_fault_it_was_with_its_id(
    served: tuple[str, Settings, Database],
    private_redis: PrivateRedis,
    error_code: str,
    status: int,
) -> None:
    url, _, db = served
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            with SPEECH.open("rb") as fh:
                _client(url).audio.transcriptions.create(model="whisper-1", file=fh)
        except Exception as exc:
            answer["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    job_id = wait_for(lambda: [j.id for j in _jobs(db)], 20, "the job to be stored")[0]
    broker = redis.Redis.from_url(private_redis.url)
    channel = DONE_CHANNEL + job_id
    wait_for(lambda: broker.pubsub_numsub(channel)[0][1] == 1, 20, "the waiter to subscribe")
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.FAILED.value, error_code=error_code, error_message="no")
        )
    broker.publish(channel, JobStatus.FAILED.value)
    thread.join(30)
    assert not thread.is_alive(), "the waiter did not notice the failure"
    error = answer["error"]
    assert isinstance(error, openai.APIStatusError), error
    assert error.response.status_code == status
    assert error.response.headers["x-should-retry"] == "false"
    body = error.response.json()["error"]
    assert body["code"] == error_code and body["job_id"] == job_id
    assert [j.id for j in _jobs(db)] == [job_id]  # not retried
