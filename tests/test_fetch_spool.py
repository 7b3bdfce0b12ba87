"""A URL job's download survives an outage of the audio store (issue 32 §3): its fetch keeps
the file on the I/O host (app/jobs/fetch_spool.py) and its retries only try the store again.
Before, each retry downloaded the whole URL again (4 downloads in 150 s were seen).

The end-to-end test runs the API and a real I/O worker (Celery, threads) against moto's S3
server, whose bucket is dropped for the outage and made again for the recovery; the URL is on a
loopback server that counts its GETs. The others check the spool's bounds in-process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from app.jobs.fetch_spool import FOLDER, FetchSpool
from app.migrate import upgrade
from tests.conftest import FIXTURES, LiveApi, Proc, auth, wait_for
from tests.s3_server import S3Server

pytestmark = pytest.mark.serial

SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
# Failed uploads the test waits for before the bucket comes back: several retries.
OUTAGE_RETRIES = 3


class CountingServer:
    """Serves SPEECH at /speech.wav on loopback and counts the GETs."""

    def __init__(self) -> None:
        self.gets = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.gets += 1
                self.send_response(200)
                self.send_header("Content-Type", "audio/wav")
                self.send_header("Content-Length", str(len(SPEECH)))
                self.end_headers()
                self.wfile.write(SPEECH)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/speech.wav"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def counting() -> Iterator[CountingServer]:
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture()
def database_url(tmp_path: Path) -> str:
    """SQLite only: the store and the fetch, not the database, are under test here."""
    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    return url


@pytest.fixture()
def live_api_env(s3_env: dict[str, str]) -> dict[str, str]:
    return s3_env


def _job(live: LiveApi, job_id: str) -> dict[str, Any]:
    return dict(requests.get(f"{live.url}/v1/jobs/{job_id}", headers=auth(), timeout=10).json())


def test_a_store_outage_costs_one_download(
    live_api: LiveApi,
    io_worker: Proc,
    s3_server: S3Server,
    s3_env: dict[str, str],
    counting: CountingServer,
) -> None:
    bucket = s3_env["MURMUR_S3_BUCKET"]
    s3_server.drop_bucket(bucket)  # the store is away before the fetch starts
    answer = requests.post(
        f"{live_api.url}/v1/jobs", json={"url": counting.url}, headers=auth(), timeout=30
    )
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]

    wait_for(
        lambda: io_worker.output().count("upload failed") >= OUTAGE_RETRIES,
        120,
        f"{OUTAGE_RETRIES} failed uploads of the fetched audio",
    )
    assert _job(live_api, job_id)["status"] == "queued"
    assert counting.gets == 1, "the retries downloaded the URL again"
    spool = Path(live_api.settings.storage_path) / FOLDER
    assert [p.name.partition("~")[0] for p in spool.iterdir()] == [job_id]

    s3_server.make_bucket(bucket)  # the store is back
    stored = wait_for(
        lambda: _job(live_api, job_id)["duration_seconds"] is not None,
        120,
        "the audio to be stored",
    )
    assert stored
    job = _job(live_api, job_id)
    assert job["status"] == "queued" and job["error"] is None, job
    assert len(s3_server.keys(bucket)) == 1
    assert counting.gets == 1, (counting.gets, io_worker.output()[-3000:])
    assert list(spool.iterdir()) == []  # the kept copy goes once the store has the audio


def _staged(tmp_path: Path, size: int) -> Path:
    path = tmp_path / f"staged-{size}-{time.monotonic_ns()}"
    path.write_bytes(os.urandom(size))
    return path


def test_the_spool_keeps_no_more_than_its_bound(tmp_path: Path) -> None:
    spool = FetchSpool(tmp_path / FOLDER, max_bytes=1000)
    kept = spool.keep("job_a", _staged(tmp_path, 600), 1.5)
    assert kept is not None and (kept.size, kept.duration_seconds) == (600, 1.5)
    assert spool.find("job_a") == kept
    # No room for a second one: it stays where it was staged (the fetch stores it from there).
    second = _staged(tmp_path, 600)
    assert spool.keep("job_b", second, 2.0) is None
    assert second.exists() and spool.find("job_b") is None
    assert spool.used_bytes() == 600
    spool.discard("job_a")
    assert spool.find("job_a") is None and spool.used_bytes() == 0
    assert spool.keep("job_b", second, 2.0) is not None
    # A name that is not a job id is never a path.
    assert spool.keep("../job_c", _staged(tmp_path, 10), 1.0) is None
    assert spool.find("../job_b") is None


def test_old_entries_are_pruned(tmp_path: Path) -> None:
    spool = FetchSpool(tmp_path / FOLDER, max_bytes=10_000)
    old = spool.keep("job_old", _staged(tmp_path, 100), 1.0)
    new = spool.keep("job_new", _staged(tmp_path, 100), 1.0)
    assert old is not None and new is not None
    past = time.time() - 7200
    os.utime(old.path, (past, past))
    assert spool.prune(max_age_seconds=3600) == 1
    assert spool.find("job_old") is None and spool.find("job_new") == new
