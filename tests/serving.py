"""The API under the production gunicorn command line (app/server.py), on a free loopback port."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from app.config import load_settings
from app.migrate import upgrade
from app.server import gunicorn_args
from tests.conftest import (
    ADMIN_TOKEN,
    API_TOKEN,
    OTHER_TOKEN,
    SIGNING_KEY,
    WEBHOOK_SECRET,
    Proc,
    free_port,
    start_process,
    wait_for,
)


@dataclass
class Gunicorn:
    url: str
    env: dict[str, str]
    proc: Proc


@contextmanager
def gunicorn_api(
    tmp_path: Path, redis_url: str, *, workers: int = 1, threads: int = 2, **extra: str
) -> Iterator[Gunicorn]:
    """Run `murmur api`'s gunicorn command with a fresh SQLite database; stop it on exit."""
    port = free_port()
    database_url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(database_url)
    env = {
        **os.environ,
        "MURMUR_DATABASE_URL": database_url,
        "MURMUR_REDIS_URL": redis_url,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MURMUR_ADMIN_TOKEN": ADMIN_TOKEN,
        "MURMUR_HOST": "127.0.0.1",
        "MURMUR_PORT": str(port),
        **extra,
    }
    args = gunicorn_args(load_settings(env=env), workers=workers, threads=threads)
    proc = start_process([sys.executable, "-m", "gunicorn", *args], env, tmp_path / "api.log")
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{proc.output()}")
        try:
            return requests.get(f"{url}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(up, 30, "gunicorn to answer /healthz", step=0.2)
        yield Gunicorn(url, env, proc)
    finally:
        proc.stop()


@contextmanager
def serving_audio(data: bytes, name: str = "talk.wav") -> Iterator[str]:
    """A loopback server answering every GET with `data` as audio/wav: a URL job's source
    (the job's settings must allow private URLs). Yields the URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "audio/wav")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{name}"
    finally:
        server.shutdown()
        server.server_close()
