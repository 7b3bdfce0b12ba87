"""Secret sweep: one full run on loopback, then no secret or transcript where it must not be.

The run: an upload and a URL job (served by a server this test starts on 127.0.0.1), both
with webhooks; a real control worker (URL fetch, webhooks); the fleet's reconcile starting a
real CPU worker through the `local` provider; usage reports, `/metrics` with the scrape token,
`/v1/fleet`, `/readyz`; refused requests and a job that fails.

Swept: every log line (Python logging of this process, where the API and the reconcile run;
the control worker's log; the GPU worker's log), `/metrics`, `/v1/fleet`, `/readyz`, every
error body, and the argv of every process involved. Searched for: the API tokens (and a
rejected one), the admin and scrape tokens, the signing key, the webhook secret, every
worker's instance credential, every signed audio URL's signature, every webhook signature,
and the transcript text (which belongs only in the job and transcript responses).

The in-process development server's own access log (logger `werkzeug`) is not swept: it logs
query strings, and it is where the audio URL signatures are read from. Production serves the
API with gunicorn, whose access log `murmur api` restricts to the path (app/cli.py).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from sqlalchemy import select

from app.celery_config import make_celery
from app.credentials import InstanceCredential
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.local import LocalProvider
from app.fleet.reconcile import reconcile
from app.models import Worker
from app.services import build_services, utc_clock
from tests.conftest import (
    ADMIN_TOKEN,
    API_TOKEN,
    FIXTURES,
    OTHER_TOKEN,
    SIGNING_KEY,
    WEBHOOK_SECRET,
    LiveApi,
    Proc,
    auth,
    wait_for,
)

pytestmark = pytest.mark.slow

SCRAPE_TOKEN = "sweep-scrape-token-" + "9" * 32
REJECTED_TOKEN = "sweep-rejected-token-" + "7" * 32
SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
FINISHED = ("succeeded", "failed", "cancelled")


@pytest.fixture()
def live_api_env() -> dict[str, str]:
    return {"MURMUR_OBSERVABILITY_ENABLED": "1", "MURMUR_SCRAPE_TOKEN": SCRAPE_TOKEN}


class _Loopback(BaseHTTPRequestHandler):
    """Serves the URL job's audio, a missing file, and records webhook deliveries."""

    hooks: list[tuple[dict[str, str], bytes]]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.startswith("/speech.wav"):
            self.send_response(200)
            self.send_header("Content-Type", "audio/wav")
            self.send_header("Content-Length", str(len(SPEECH)))
            self.end_headers()
            self.wfile.write(SPEECH)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.hooks.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:  # its stderr is no part of Murmur
        pass


@pytest.fixture()
def loopback() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    hooks: list[tuple[dict[str, str], bytes]] = []
    handler = type("Handler", (_Loopback,), {"hooks": hooks})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hooks
    finally:
        server.shutdown()
        server.server_close()


def _argv_of(pid: int) -> list[str]:
    """The command lines of a process and all its descendants (argv only, not environment)."""
    lines = []
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                lines.append(" ".join(proc.cmdline()))
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return lines


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_no_secret_or_transcript_outside_its_place(
    live_api: LiveApi,
    control_worker: Proc,
    io_worker: Proc,
    loopback: tuple[str, list[tuple[dict[str, str], bytes]]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    hook_url, hooks = loopback
    url = live_api.url
    settings = live_api.settings
    state_dir = tmp_path / "instances"
    svc = build_services(
        settings,
        make_celery(settings),
        db=live_api.db,
        providers=ProviderRegistry(
            settings, {"local": LocalProvider(settings, state_dir=state_dir, term_grace=10)}
        ),
        clock=utc_clock,
    )
    errors: dict[str, str] = {}

    def refused(name: str, response: requests.Response, status: int) -> None:
        assert response.status_code == status, (name, response.status_code, response.text)
        assert set(response.json()["error"]) >= {"code", "message"}, response.text
        errors[name] = response.text

    try:
        # -- submissions: good ones with webhooks, bad ones, and a job that will fail ------
        uploaded = requests.post(
            f"{url}/v1/jobs",
            headers=auth(),
            files={"file": ("speech.wav", SPEECH)},
            data={"webhook_url": f"{hook_url}/hook"},
            timeout=60,
        )
        assert uploaded.status_code == 202, uploaded.text
        by_url = requests.post(
            f"{url}/v1/jobs",
            headers=auth(),
            json={"url": f"{hook_url}/speech.wav", "webhook_url": f"{hook_url}/hook"},
            timeout=30,
        )
        assert by_url.status_code == 202, by_url.text
        failing = requests.post(
            f"{url}/v1/jobs", headers=auth(), json={"url": f"{hook_url}/missing.wav"}, timeout=30
        )
        assert failing.status_code == 202, failing.text
        good = [uploaded.json()["id"], by_url.json()["id"]]
        bad_id = failing.json()["id"]

        refused(
            "not audio",
            requests.post(
                f"{url}/v1/jobs",
                headers=auth(),
                files={"file": ("x.wav", b"not audio " * 50)},
                timeout=30,
            ),
            400,
        )
        refused(
            "rejected token",
            requests.get(f"{url}/v1/jobs", headers=auth(REJECTED_TOKEN), timeout=10),
            401,
        )
        refused(
            "bad json",
            requests.post(
                f"{url}/v1/jobs",
                headers={**auth(), "Content-Type": "application/json"},
                data=b"{nope",
                timeout=10,
            ),
            400,
        )
        refused(
            "private url field",
            requests.post(
                f"{url}/v1/jobs",
                headers=auth(),
                json={"url": "ftp://127.0.0.1/x.wav", "prompt": "hello"},
                timeout=10,
            ),
            400,
        )
        refused(
            "unknown job", requests.get(f"{url}/v1/jobs/job_nope", headers=auth(), timeout=10), 404
        )
        refused(
            "other owner",
            requests.get(f"{url}/v1/jobs/{good[0]}", headers=auth(OTHER_TOKEN), timeout=10),
            404,
        )

        # -- the fleet runs them: reconcile starts a local worker, it transcribes ----------
        def all_finished() -> bool:
            reconcile(svc)
            statuses = [
                requests.get(f"{url}/v1/jobs/{j}", headers=auth(), timeout=10).json()["status"]
                for j in [*good, bad_id]
            ]
            return all(s in FINISHED for s in statuses)

        wait_for(all_finished, 300, "the jobs to finish", step=1.0)
        for job_id in good:
            job = requests.get(f"{url}/v1/jobs/{job_id}", headers=auth(), timeout=10).json()
            assert job["status"] == "succeeded", job
        failed = requests.get(f"{url}/v1/jobs/{bad_id}", headers=auth(), timeout=10).json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "url_fetch_failed"

        texts: list[str] = []
        for job_id in good:
            transcript = requests.get(
                f"{url}/v1/jobs/{job_id}/transcript", headers=auth(), timeout=10
            ).json()
            texts.append(transcript["text"].strip())
            texts += [seg["text"].strip() for seg in transcript.get("segments", [])]
        texts = [t for t in texts if len(t) >= 12]
        assert texts, "the transcription produced no text to look for"

        refused(
            "transcript of a failed job",
            requests.get(f"{url}/v1/jobs/{bad_id}/transcript", headers=auth(), timeout=10),
            409,
        )
        refused(
            "cancel a finished job",
            requests.delete(f"{url}/v1/jobs/{good[0]}", headers=auth(), timeout=10),
            409,
        )
        refused(
            "metrics with an API token",
            requests.get(f"{url}/metrics", headers=auth(), timeout=10),
            401,
        )
        refused(
            "fleet with an API token",
            requests.get(f"{url}/v1/fleet", headers=auth(), timeout=10),
            401,
        )

        # -- what operators read -----------------------------------------------------------
        wait_for(lambda: len(hooks) >= 2, 60, "both webhooks to be delivered", step=0.2)
        metrics = requests.get(f"{url}/metrics", headers=auth(SCRAPE_TOKEN), timeout=10)
        assert metrics.status_code == 200 and "murmur_" in metrics.text
        fleet = requests.get(f"{url}/v1/fleet", headers=auth(ADMIN_TOKEN), timeout=10)
        assert fleet.status_code == 200 and fleet.json()["workers"], fleet.text
        readyz = requests.get(f"{url}/readyz", timeout=10)
        assert readyz.status_code == 200

        # -- collect before teardown (deleting a local instance removes its log) ------------
        records = list(state_dir.glob("local-*.json"))
        assert records, "the reconcile started no local worker"
        worker_pids = [int(json.loads(p.read_text())["pid"]) for p in records]
        argv = _argv_of(control_worker.popen.pid) + _argv_of(io_worker.popen.pid)
        for pid in worker_pids:
            argv += _argv_of(pid)
        argv += _argv_of(psutil.Process().pid)
        assert any("gpu_worker" in line for line in argv), argv
        sinks: dict[str, str] = {
            "control worker log": control_worker.output(),
            "I/O worker log": io_worker.output(),
            "/metrics": metrics.text,
            "/v1/fleet": fleet.text,
            "/readyz": readyz.text,
            "argv": "\n".join(argv),
        }
        for path in state_dir.glob("local-*.log"):
            sinks[f"GPU worker log {path.name}"] = path.read_text(errors="replace")
        assert any("transcrib" in v.lower() for k, v in sinks.items() if "GPU" in k)
        for name, body in errors.items():
            sinks[f"error body: {name}"] = body
        ours, dev_server = [], []
        for record in caplog.records:
            line = record.getMessage() + (f"\n{record.exc_text}" if record.exc_text else "")
            (dev_server if record.name == "werkzeug" else ours).append(line)
        sinks["API and reconcile logs (this process)"] = "\n".join(ours)

        # -- the secrets as they were in this run -----------------------------------------
        with live_api.db.session() as s:
            workers = list(s.scalars(select(Worker)))
        signatures = set(re.findall(r"sig=([0-9a-f]{64})", "\n".join(dev_server)))
        assert signatures, "no signed audio URL was used: the sweep would prove nothing"
        hook_macs = {
            m for headers, _ in hooks for m in re.findall(r"v1=([0-9a-f]{64})", str(headers))
        }
        assert hook_macs
        secrets = {
            "API token": API_TOKEN,
            "second API token": OTHER_TOKEN,
            "rejected token": REJECTED_TOKEN,
            "admin token": ADMIN_TOKEN,
            "scrape token": SCRAPE_TOKEN,
            "signing key": SIGNING_KEY,
            "webhook secret": WEBHOOK_SECRET,
        }
        for worker in workers:
            credential = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "")
            secrets[f"credential of {worker.id}"] = credential.token
        for i, sig in enumerate(sorted(signatures)):
            secrets[f"audio URL signature {i}"] = sig
        for i, mac in enumerate(sorted(hook_macs)):
            secrets[f"webhook signature {i}"] = mac
        for i, text in enumerate(texts):
            secrets[f"transcript text {i}"] = text

        leaks = [
            f"{secret} in {sink}"
            for sink, content in sinks.items()
            for secret, value in secrets.items()
            if value in content
        ]
        assert not leaks, leaks
    finally:
        provider = LocalProvider(settings, state_dir=state_dir, term_grace=1)
        for instance in provider.list_by_tag(frozenset()):
            provider.delete(instance.instance_id, instance.resources)
