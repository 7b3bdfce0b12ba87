"""Shared fixtures for the worker's tests: paths, a CPU environment, WER, a fake control plane."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jiwer
import pytest

import gpu_worker  # noqa: F401  (pins HF_HUB_OFFLINE before faster-whisper is imported)
from gpu_worker.manifest import load_manifest, verify_asset

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"

# A complete, valid environment for the local CPU profile, identity included.
CPU_ENV = {
    "MURMUR_MODEL": "tiny.en",
    "MURMUR_DEVICE": "cpu",
    "MURMUR_COMPUTE_TYPE": "int8",
    "MURMUR_VAD": "silero",
    "MURMUR_ALIGNMENT_DEVICE": "none",
    "MURMUR_BATCH_SIZE": "1",
    "MURMUR_CPU_THREADS": "2",
    "MURMUR_PROFILE": "local-cpu",
    "MURMUR_WORKER_ID": "wrk_test1",
    "MURMUR_INSTANCE_ID": "local-0001",
    "MURMUR_WORKER_TOKEN": "ab" * 32,
    "MURMUR_CONTROL_URL": "http://127.0.0.1:8000",
    "MURMUR_BROKER_URL": "redis://:brokerpass@127.0.0.1:6379/0",
}


@pytest.fixture
def cpu_env() -> dict[str, str]:
    return dict(CPU_ENV)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_en_dir() -> Path:
    return verify_asset(load_manifest().asset("tiny.en")).root


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="session")
def word_error_rate() -> Callable[[str, str], float]:
    """WER after lower-casing and dropping punctuation."""

    def score(reference: str, hypothesis: str) -> float:
        return float(jiwer.wer(_words(reference), _words(hypothesis)))

    return score


class FakeControlPlane:
    """The worker endpoints of docs/worker-protocol.md, in memory, over real HTTP.

    A job can be claimed once (409 after); a result is stored once (`stored: false` after).
    Every request is recorded with its headers so tests can check what the worker sent.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.jobs: dict[str, dict[str, Any]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, dict[str, Any]] = {}
        self.ready_bodies: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []  # usage reports, in arrival order
        self.heartbeats = 0
        self.ready_status = 200
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.scripted: dict[str, list[int]] = {}  # path suffix -> statuses to answer first
        self.claimed = threading.Event()
        self.url = ""
        self._server: ThreadingHTTPServer | None = None

    def add_job(self, job_id: str, audio: bytes, **fields: Any) -> None:
        self.jobs[job_id] = {"audio": audio, "state": "queued", **fields}

    def start(self) -> None:
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                plane._record(self)
                path, _, query = self.path.partition("?")
                job_id = path.rsplit("/", 1)[-1]
                job = plane.jobs.get(job_id)
                if not path.startswith("/audio/") or job is None or "sig=" not in query:
                    self._send(404, {"error": {"code": "not_found", "message": "no audio"}})
                    return
                audio = job["audio"]
                self.send_response(200)
                if not job.get("chunked"):
                    self.send_header("Content-Length", str(len(audio)))
                self.end_headers()
                self.wfile.write(audio)

            def do_POST(self) -> None:
                plane._record(self)
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer = plane._answer(self.path, self.headers, body)
                self._send(status, answer)

            def _send(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _record(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests.append((handler.command, handler.path, dict(handler.headers.items())))

    def _answer(self, path: str, headers: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        for suffix, statuses in self.scripted.items():
            if path.endswith(suffix) and statuses:
                status = statuses.pop(0)
                return status, {"error": {"code": f"scripted_{status}", "message": "scripted"}}
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"error": {"code": "unauthorized", "message": "bad credential"}}
        parts = path.strip("/").split("/")  # internal/workers/W/I/...
        if parts[4:] == ["ready"]:
            self.ready_bodies.append(body)
            if self.ready_status == 409:
                return 409, {"error": {"code": "runtime_mismatch", "message": "compute_type"}}
            return 200, {"accepted": True}
        if parts[4:] == ["report"]:
            self.reports.append(body)
            return 200, {"accepted": True}
        if parts[4:] == ["heartbeat"]:
            self.heartbeats += 1
            return 200, {"ok": True}
        job_id, action = parts[5], parts[6]
        job = self.jobs.get(job_id)
        if job is None:
            return 404, {"error": {"code": "not_found", "message": "no such job"}}
        if action == "claim":
            if job["state"] != "queued":
                return 409, {"error": {"code": "job_not_claimable", "message": job["state"]}}
            job["state"] = "running"
            self.claimed.set()
            hidden = ("audio", "state", "chunked", "cancelled")
            fields = {k: v for k, v in job.items() if k not in hidden}
            return 200, {
                "job": {
                    "id": job_id,
                    "audio_url": f"{self.url}/audio/{job_id}?expires=9999999999&sig=s3cr3tsig",
                    **fields,
                }
            }
        if action == "result":
            if job_id in self.results:
                return 200, {"stored": False}
            self.results[job_id] = body
            job["state"] = "succeeded"
            return 200, {"stored": True}
        if action == "status":
            return 200, {"held": job["state"] == "running" and not job.get("cancelled")}
        if action == "failure":
            stored = job_id not in self.failures
            self.failures.setdefault(job_id, body)
            job["state"] = "failed"
            return 200, {"stored": stored}
        return 404, {"error": {"code": "not_found", "message": path}}


@pytest.fixture
def control_plane() -> Iterator[FakeControlPlane]:
    plane = FakeControlPlane(CPU_ENV["MURMUR_WORKER_TOKEN"])
    plane.start()
    yield plane
    plane.stop()
