"""Outbound HTTP has a deadline on the whole exchange and reads only what it needs.

Issue 10 review M3 and M4: a URL input dripping bytes under the read timeout held a control
worker past its 300 s deadline (the deadline was checked between 256 KiB chunks), and a
webhook receiver's answer was read whole, unbounded and untimed. Every server here is started
by the test on 127.0.0.1 and stops sending by itself within DRIP_LIMIT_SECONDS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.db import Database
from app.jobs import service
from app.migrate import upgrade
from app.models import Job
from app.services import utc_clock
from tests.conftest import API_TOKEN, OTHER_TOKEN, REDIS_URL, SIGNING_KEY, make_settings

# A drip sends one byte this often: well under the 30 s / 10 s read timeouts, so only a
# deadline on the whole exchange ends it.
DRIP_EVERY = 0.25
# The servers stop by themselves after this long, so an unfixed client ends the test too.
DRIP_LIMIT_SECONDS = 12.0
DEADLINE = 2.0
# The deadline, plus the watchdog's repeat and the time to settle the job.
WITHIN = DEADLINE + 3.0


class Server:
    """A loopback HTTP server that misbehaves in `mode`; counts what it managed to send."""

    def __init__(self, mode: str) -> None:
        self.sent = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _drip(self, data: bytes) -> None:
                stop = time.monotonic() + DRIP_LIMIT_SECONDS
                for byte in data:
                    if time.monotonic() > stop:
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    server.sent += 1
                    time.sleep(DRIP_EVERY)

            def _answer(self) -> None:
                try:
                    if mode == "drip_head":
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        self._drip(b"X-Slow: " + b"s" * 1000 + b"\r\n\r\n")
                    elif mode == "drip_sized_body":
                        self.send_response(200)
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self._drip(b"R" * 1000)
                    elif mode == "drip_unsized_body":  # ends with the connection: looks complete
                        self.wfile.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                        self._drip(b"R" * 1000)
                        self.close_connection = True
                    elif mode == "endless_body":
                        self.send_response(200)
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        chunk = b"x" * (1 << 20)
                        stop = time.monotonic() + DRIP_LIMIT_SECONDS
                        for _ in range(256):  # 256 MiB at most
                            if time.monotonic() > stop:
                                break
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            server.sent += len(chunk)
                        self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass  # the client went away: what the tests want

            def do_GET(self) -> None:  # noqa: N802
                self._answer()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self._answer()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/a"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url)
    return url


@pytest.fixture()
def control_env(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The control worker's environment, with loopback URLs allowed."""
    from tasks import context

    config = tmp_path / "murmur.toml"
    config.write_text("[api]\nallow_private_urls = true\n")
    env = {
        "MURMUR_CONFIG": str(config),
        "MURMUR_DATABASE_URL": sqlite_url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": "w" * 32,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    context.reset()
    yield env
    context.reset()


@pytest.mark.parametrize("mode", ["drip_head", "drip_sized_body", "drip_unsized_body"])
def test_a_dripping_url_fails_its_job_at_the_deadline(
    mode: str, control_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.jobs.fetch
    from tasks.jobs import fetch_audio

    monkeypatch.setattr(app.jobs.fetch, "FETCH_DEADLINE_SECONDS", DEADLINE)
    server = Server(mode)
    db = Database(control_env["MURMUR_DATABASE_URL"])
    try:
        job, _ = service.insert_job(
            db,
            service.JobRequest(owner="owner", source="url", source_url=server.url),
            now=utc_clock(),
        )
        started = time.monotonic()
        fetch_audio.run(job.id)
        took = time.monotonic() - started
        with db.reader() as s:
            row = s.get(Job, job.id)
            assert row is not None
            status, code, message = row.status, row.error_code, row.error_message
    finally:
        db.dispose()
        server.close()
    assert took < WITHIN, f"{mode}: the fetch took {took:.1f} s"
    # Cut short, not taken for a (non-audio) file that merely ended.
    assert (status, code) == ("failed", "url_fetch_failed"), (mode, code, message)
    assert message == f"the URL did not deliver within {DEADLINE} s"
    staged = tmp_path / "audio"
    assert not staged.exists() or not any(p.is_file() for p in staged.rglob("*"))


def _webhook_attempt(env: dict[str, str], tmp_path: Path, url: str) -> tuple[bool, str, float]:
    from app.jobs.delivery import _send_webhook

    settings = make_settings(
        env["MURMUR_DATABASE_URL"],
        REDIS_URL,
        tmp_path,
        MURMUR_CONFIG=env["MURMUR_CONFIG"],
        MURMUR_WEBHOOK_SECRET=env["MURMUR_WEBHOOK_SECRET"],
    )
    db = Database(settings.database_url)
    try:
        job, _ = service.insert_job(
            db,
            service.JobRequest(owner="owner", source="upload", webhook_url=url),
            now=utc_clock(),
        )
        started = time.monotonic()
        ok, why = _send_webhook(settings, service.get_job(db, job.id), int(time.time()))
        return ok, why, time.monotonic() - started
    finally:
        db.dispose()


def test_a_webhook_receivers_endless_answer_is_not_read(
    control_env: dict[str, str], tmp_path: Path
) -> None:
    server = Server("endless_body")
    try:
        ok, why, took = _webhook_attempt(control_env, tmp_path, server.url)
        time.sleep(0.5)  # let the server notice the closed connection
    finally:
        server.close()
    assert (ok, why) == (True, "HTTP 200")
    # Only what fits in the sockets' buffers left the server: the body was not read.
    assert server.sent < 64 << 20, f"the receiver sent {server.sent >> 20} MiB"
    assert took < WITHIN


def test_a_webhook_receiver_trickling_its_answer_is_cut_at_the_deadline(
    control_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.jobs.delivery

    monkeypatch.setattr(app.jobs.delivery, "WEBHOOK_DEADLINE_SECONDS", DEADLINE)
    server = Server("drip_head")
    try:
        ok, why, took = _webhook_attempt(control_env, tmp_path, server.url)
    finally:
        server.close()
    assert (ok, why) == (False, "deadline")
    assert took < WITHIN, f"the attempt took {took:.1f} s"
