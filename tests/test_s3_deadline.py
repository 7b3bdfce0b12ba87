"""An S3 store that hangs answers within one deadline, and its health is a cached probe
(issue 32 §3). The "bucket" is a loopback listener that accepts connections and never
answers: what a frozen S3 endpoint looks like to a client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config import load_settings
from app.errors import Refused
from app.storage import S3AudioStore, open_store

pytestmark = pytest.mark.serial

DEADLINE = 2.0


class Frozen:
    """Accepts every connection, reads nothing, answers nothing."""

    def __init__(self) -> None:
        self.accepted = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._held: list[socket.socket] = []
        self._closing = threading.Event()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self._held.append(conn)

    def close(self) -> None:
        self._closing.set()
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.fixture()
def frozen() -> Iterator[Frozen]:
    peer = Frozen()
    yield peer
    peer.close()


def _store(tmp_path: Path, url: str) -> S3AudioStore:
    settings = load_settings(
        env={
            "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
            "MURMUR_STORAGE_BACKEND": "s3",
            "MURMUR_S3_BUCKET": "murmur-audio",
            "MURMUR_S3_ENDPOINT_URL": url,
            "MURMUR_S3_ACCESS_KEY_ID": "test-access",
            "MURMUR_S3_SECRET_ACCESS_KEY": "test-secret-value",
        }
    )
    settings = settings.model_copy(
        update={"storage": settings.storage.model_copy(update={"timeout_seconds": DEADLINE})}
    )
    store = open_store(settings)
    assert isinstance(store, S3AudioStore)
    return store


def test_an_upload_to_a_frozen_bucket_is_refused_within_one_deadline(
    tmp_path: Path, frozen: Frozen
) -> None:
    store = _store(tmp_path, frozen.url)
    staged = store.staging_path()
    staged.write_bytes(b"RIFF" + b"\0" * 1000)
    began = time.monotonic()
    with pytest.raises(Refused) as refused:
        store.commit(staged, "a.audio")
    took = time.monotonic() - began
    assert refused.value.code == "storage_unavailable"
    # One deadline (plus scheduling), not 3 attempts x the timeout (6 s and more before).
    assert took < DEADLINE * 2, took
    # The cleanup that follows a failed upload does not wait a second deadline.
    began = time.monotonic()
    with pytest.raises(Refused):
        store.delete("a.audio")
    assert time.monotonic() - began < DEADLINE, "the cleanup waited on the hung bucket again"


def test_the_bucket_s_health_is_a_cached_probe(tmp_path: Path, frozen: Frozen) -> None:
    store = _store(tmp_path, frozen.url)
    problem = store.health()
    assert problem is not None and "no answer" in problem
    seen = frozen.accepted
    assert seen >= 1
    for _ in range(20):  # /readyz polled hard: the cached answer, no new request
        assert store.health() == problem
    assert frozen.accepted == seen
