"""A full disk and an unreachable database are answers, never 500s or hangs (issue 21 §3).

- The audio store's filesystem full (a real 1 MiB tmpfs): `507 insufficient_storage` with
  `Retry-After`, no file left behind, no job row; `/readyz` says the store is below its floor.
- SQLite's own disk full: the same 507, and the upload's audio is removed.
- PostgreSQL behind a TCP proxy this test runs on loopback: refusing connections, then
  accepting them and never answering (black-holed). Every request — a listing, an upload, a
  worker's claim, `/readyz` — answers `503 database_unavailable` with `Retry-After` within
  the configured timeouts, and all works again once the database is back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app import create_app
from app.db import Database
from app.models import Job, WorkerState
from app.services import database_timeouts
from app.storage import free_bytes
from tests.conftest import REDIS_URL, add_worker, auth, make_settings
from tests.test_api_input import SPEECH, error_of, upload
from tests.test_worker_endpoints import call


def _wav(size: int) -> bytes:
    """A WAV file of `size` bytes: big enough to fill the store, read before any probe."""
    return SPEECH[:44] + bytes(size - 44)


@pytest.fixture()
def mount_tmpfs(tmp_path: Path) -> Iterator[Any]:
    """Mounts a real filesystem of a given size (tmpfs) in the test's directory; each is
    unmounted afterwards."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    try:
        yield mount
    finally:
        for point in mounted:
            subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture()
def small_fs(mount_tmpfs: Any) -> Path:
    """A real 1 MiB filesystem."""
    return Path(mount_tmpfs("small", "1m"))


def _fill(directory: Path) -> Path:
    """Write a file in `directory` until its filesystem has no room left; the file."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _job_count(db: Database) -> int:
    with db.reader() as s:
        return int(s.execute(select(func.count()).select_from(Job)).scalar_one())


def test_a_full_audio_store_is_507_with_nothing_left_behind(
    database_url: str, clean_redis: Any, small_fs: Path, tmp_path: Path
) -> None:
    settings = make_settings(
        database_url, REDIS_URL, tmp_path, MURMUR_STORAGE_PATH=str(small_fs / "audio")
    )
    db = Database(settings.database_url)
    try:
        client = create_app(settings, db=db).test_client()
        response = upload(client, _wav(2 * 1024 * 1024))
        error_of(response, 507, "insufficient_storage")
        assert response.headers["Retry-After"].isdigit()
        assert _files(small_fs) == [], "a partial upload was left in the store"
        assert _job_count(db) == 0
        # The store itself still works: an upload that fits is accepted.
        assert upload(client).status_code == 202
        assert _job_count(db) == 1
    finally:
        db.dispose()


def test_readyz_reports_a_store_below_its_free_space_floor(
    database_url: str, clean_redis: Any, small_fs: Path, tmp_path: Path
) -> None:
    store = small_fs / "audio"
    floor = 512 * 1024
    settings = make_settings(
        database_url,
        REDIS_URL,
        tmp_path,
        MURMUR_STORAGE_PATH=str(store),
        MURMUR_STORAGE_MIN_FREE_BYTES=str(floor),
    )
    db = Database(settings.database_url)
    try:
        client = create_app(settings, db=db).test_client()
        assert client.get("/readyz").get_json()["checks"]["storage"] == "ok"
        ballast = store / "ballast"
        ballast.write_bytes(bytes(free_bytes(store) - floor // 2))
        response = client.get("/readyz")
        assert response.status_code == 503
        storage = response.get_json()["checks"]["storage"]
        assert storage.startswith("failed:") and "below the floor" in storage
        ballast.unlink()
        assert client.get("/readyz").get_json()["checks"]["storage"] == "ok"
    finally:
        db.dispose()


def test_a_full_sqlite_disk_is_507_and_the_upload_is_removed(
    clean_redis: Any, mount_tmpfs: Any, tmp_path: Path
) -> None:
    from app.migrate import upgrade

    small_fs = mount_tmpfs("small", "8m")
    path = small_fs / "murmur.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    # Empty the write-ahead log, so the next write must grow it; this connection keeps the
    # shared-memory file in place for the app's connections.
    keeper = sqlite3.connect(path)
    keeper.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    audio = tmp_path / "audio"
    settings = make_settings(url, REDIS_URL, tmp_path, MURMUR_STORAGE_PATH=str(audio))
    db = Database(settings.database_url)
    try:
        client = create_app(settings, db=db).test_client()
        filler = _fill(small_fs)
        response = upload(client)
        error_of(response, 507, "insufficient_storage")
        assert response.headers["Retry-After"].isdigit()
        assert _files(audio) == [], "the audio of a job never stored was kept"
        filler.unlink()
        assert _job_count(db) == 0
        assert upload(client).status_code == 202
        assert _job_count(db) == 1
    finally:
        db.dispose()
        keeper.close()


class TcpProxy:
    """A loopback TCP proxy in front of a server, which can refuse or black-hole it.

    `forward`: pass bytes both ways. `refuse`: stop listening (connections are refused) and
    cut the open ones. `black_hole`: accept connections and never answer, and stop answering
    on the open ones too (the kernel still acknowledges every byte)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = "forward"
        self.port = 0
        self._listener: socket.socket | None = None
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listen()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refusing
            with self._lock:
                self._held.append(client)
            if self.mode == "black_hole":
                continue  # held open, never read, never answered
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._held.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == "black_hole":
                    time.sleep(0.05)  # stop answering: the bytes go nowhere
                if self.mode != "forward":
                    break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _cut(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for s in held:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def set(self, mode: str) -> None:
        if mode == "refuse":
            self.mode = mode
            assert self._listener is not None
            self._listener.close()
            self._listener = None
            self._cut()
        elif mode == "forward":
            self.mode = mode
            self._cut()
            if self._listener is None:
                self._listen()
        else:
            self.mode = mode
            if self._listener is None:
                self._listen()

    def close(self) -> None:
        self.mode = "closed"
        if self._listener is not None:
            self._listener.close()
        self._cut()


def _timed(request: Any, bound: float) -> tuple[Any, float]:
    """Run `request` on a thread; its answer and how long it took, failing past `bound`."""
    box: dict[str, Any] = {}

    def run() -> None:
        box["answer"] = request()

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"no answer within {bound} s: the request hangs"
    return box["answer"], time.monotonic() - started


def test_postgresql_refused_or_black_holed_is_503_within_the_timeouts(
    postgres_database: Any, clean_redis: Any, tmp_path: Path
) -> None:
    direct = postgres_database.emptied()
    host_port = direct.split("@", 1)[1].split("/", 1)[0]
    host, _, port = host_port.rpartition(":")
    proxy = TcpProxy(host, int(port))
    url = direct.replace(host_port, f"127.0.0.1:{proxy.port}")
    settings = make_settings(
        url,
        REDIS_URL,
        tmp_path,
        MURMUR_DATABASE_CONNECT_TIMEOUT_SECONDS="2",
        MURMUR_DATABASE_STATEMENT_TIMEOUT_SECONDS="1",
    )
    # connect (2 s) + one answer (statement 1 s + 1 s) + a reconnect (2 s), with room for a
    # loaded machine: past this a request hangs.
    bound = 30.0
    db = Database(settings.database_url, database_timeouts(settings))
    audio = tmp_path / "audio"
    try:
        client = create_app(settings, db=db).test_client()
        worker = add_worker(db, state=WorkerState.READY)
        job_id = upload(client).get_json()["id"]
        assert client.get("/v1/jobs", headers=auth()).status_code == 200
        stored = _files(audio)

        for mode in ("refuse", "black_hole"):
            proxy.set(mode)
            for what, request in (
                ("listing", lambda: client.get("/v1/jobs", headers=auth())),
                ("poll", lambda: client.get(f"/v1/jobs/{job_id}", headers=auth())),
                ("upload", lambda: upload(client)),
                ("claim", lambda: call(client, worker, f"/jobs/{job_id}/claim")),
            ):
                response, _ = _timed(request, bound)
                error_of(response, 503, "database_unavailable")
                assert response.headers["Retry-After"].isdigit(), (mode, what)
                assert "postgres" not in response.get_data(as_text=True).lower()
            ready, _ = _timed(lambda: client.get("/readyz"), bound)
            assert ready.status_code == 503
            assert ready.get_json()["checks"]["database"].startswith("failed")
            assert _files(audio) == stored, f"{mode}: a refused upload left its audio"

        proxy.set("forward")
        assert client.get("/v1/jobs", headers=auth()).status_code == 200
        assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
        assert _job_count(db) == 1
    finally:
        proxy.close()
        db.dispose()


def test_a_sqlite_write_lock_held_past_the_busy_timeout_is_503(
    clean_redis: Any, tmp_path: Path
) -> None:
    from app.migrate import upgrade

    path = tmp_path / "murmur.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    settings = make_settings(url, REDIS_URL, tmp_path, MURMUR_DATABASE_BUSY_TIMEOUT_SECONDS="0.5")
    db = Database(settings.database_url, database_timeouts(settings))
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        client = create_app(settings, db=db).test_client()
        holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        response, _ = _timed(lambda: upload(client), 30.0)
        error_of(response, 503, "database_unavailable")
        assert response.headers["Retry-After"].isdigit()
        assert _files(tmp_path / "audio") == []
        holder.execute("ROLLBACK")
        assert upload(client).status_code == 202
    finally:
        holder.close()
        db.dispose()


def test_storage_full_is_refused_only_for_a_full_disk(tmp_path: Path) -> None:
    from app.storage import StorageFull, full_is_refused

    with pytest.raises(StorageFull), full_is_refused():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with pytest.raises(PermissionError), full_is_refused():
        raise PermissionError(errno.EACCES, "denied")
    assert StorageFull().status == 507
