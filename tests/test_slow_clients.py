"""Slow clients and slow probes cannot take every API thread (review 10 H1).

The socket cases run the production gunicorn command (app/server.py) on loopback with two
threads in all, so a handful of connections would hold every thread without the read
deadline. Every wait here is bounded.
"""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.errors import RETRY_AFTER
from app.jobs import slow_work
from tests.conftest import API_TOKEN, FIXTURES, auth
from tests.serving import Gunicorn, gunicorn_api

# A head is closed app.server.HEAD_SECONDS (10 s) after its first byte; a margin on top for a
# busy machine. Without the deadline nothing answers at all, so this never decides a pass.
ANSWER_WITHIN = 25.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Gunicorn]:
    with gunicorn_api(
        tmp_path_factory.mktemp("slow"), redis_url, threads=1, MURMUR_SYNC_MAX_WAITING="1"
    ) as api:
        yield api


def _connect(server: Gunicorn) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=ANSWER_WITHIN)


def _answer(sock: socket.socket) -> tuple[bytes, Any]:
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, json.loads(body)


def _hold(server: Gunicorn, first_bytes: bytes, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = _connect(server)
        sock.sendall(first_bytes)
        socks.append(sock)
    return socks


def test_partial_request_heads_are_closed_408_and_healthz_answers(server: Gunicorn) -> None:
    socks = _hold(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", 4)  # twice the threads
    try:
        response = requests.get(f"{server.url}/healthz", timeout=ANSWER_WITHIN)
        assert response.status_code == 200
        head, body = _answer(socks[0])
        assert head.startswith(b"HTTP/1.1 408 "), head
        assert b"application/json" in head
        assert body["error"]["code"] == "request_timeout"
    finally:
        for sock in socks:
            sock.close()


def test_a_body_that_stops_arriving_is_408_and_healthz_answers(server: Gunicorn) -> None:
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {API_TOKEN}\r\n"
        "Content-Type: multipart/form-data; boundary=zz\r\nContent-Length: 100000\r\n\r\n--zz\r\n"
    ).encode()
    socks = _hold(server, head, 4)
    try:
        response = requests.get(f"{server.url}/healthz", timeout=ANSWER_WITHIN)
        assert response.status_code == 200
        answer_head, body = _answer(socks[0])
        assert answer_head.startswith(b"HTTP/1.1 408 "), answer_head
        assert body["error"]["code"] == "request_timeout"
    finally:
        for sock in socks:
            sock.close()


def test_kept_alive_connections_still_serve_several_requests(server: Gunicorn) -> None:
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_an_upload_finding_every_probe_slot_taken_is_503_and_leaves_nothing(
    client: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(slow_work, "WAIT_SECONDS", 0.2)  # the wait is not what is tested
    held = 0
    for _ in range(slow_work.SLOTS):
        assert slow_work._slots.acquire(timeout=1)
        held += 1
    try:
        response = client.post(
            "/v1/jobs",
            headers=auth(),
            data={"file": (io.BytesIO((FIXTURES / "speech-short.wav").read_bytes()), "a.wav")},
            content_type="multipart/form-data",
        )
    finally:
        for _ in range(held):
            slow_work._slots.release()
    assert response.status_code == 503, response.data
    assert response.get_json()["error"]["code"] == "server_busy"
    assert response.headers["Retry-After"] == str(RETRY_AFTER["server_busy"])
    storage = Path(client.application.extensions["murmur"].settings.storage_path)
    left = [p for p in storage.rglob("*") if p.is_file()] if storage.exists() else []
    assert left == []


def test_a_url_job_finding_every_slot_taken_is_503(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slow_work, "WAIT_SECONDS", 0.2)  # the wait is not what is tested
    held = 0
    for _ in range(slow_work.SLOTS):
        assert slow_work._slots.acquire(timeout=1)
        held += 1
    try:
        response = client.post("/v1/jobs", headers=auth(), json={"url": "http://127.0.0.1:9/a.wav"})
    finally:
        for _ in range(held):
            slow_work._slots.release()
    assert response.status_code == 503, response.data
    assert response.get_json()["error"]["code"] == "server_busy"
    assert response.headers["Retry-After"] == str(RETRY_AFTER["server_busy"])
