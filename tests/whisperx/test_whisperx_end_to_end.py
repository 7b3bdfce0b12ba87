"""A job on a WhisperX profile end to end: API -> reconcile -> local provider -> real worker.

The same path as tests/fleet/test_local_end_to_end.py, on a CPU profile whose pyannote VAD
selects the WhisperX backend: the worker process loads whisperx, torch and pyannote for real,
reports its runtime at readiness, and the transcripts of both speech fixtures come back
through the API within the WER bound.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import jiwer
import pytest
import redis
import requests
from sqlalchemy import select
from werkzeug.serving import make_server

from app import create_app
from app.celery_config import make_celery
from app.db import Database
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.local import LocalProvider
from app.fleet.reconcile import reconcile
from app.models import Worker
from app.services import build_services, utc_clock
from tests.conftest import (
    API_TOKEN,
    FIXTURES,
    OTHER_TOKEN,
    REDIS_URL,
    SIGNING_KEY,
    WEBHOOK_SECRET,
    LiveApi,
    api_get,
    auth,
    free_port,
    make_settings,
    wait_for,
)

pytestmark = pytest.mark.slow

# tiny.en int8, pyannote VAD, batch 8 through this path, measured: 0.176 on speech-short and
# 0.070 on speech-90s (sequential faster-whisper: 0.118 and 0.062).
MAX_WER = {"speech-short": 0.25, "speech-90s": 0.15}

PROFILE = """
[[profiles]]
name = "local-whisperx"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "tiny.en"
compute_type = "int8"
vad = "pyannote"
alignment_device = "none"
batch_size = 8
max_workers = 1
hourly_cost_eur = 0.0
"""


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture()
def whisperx_api(clean_redis: redis.Redis, tmp_path: Path) -> Iterator[LiveApi]:
    """The API over real HTTP on loopback, configured with one WhisperX CPU profile."""
    config = tmp_path / "murmur.toml"
    config.write_text(PROFILE)
    database_url = f"sqlite:///{tmp_path}/murmur.db"
    from app.migrate import upgrade

    upgrade(database_url)
    port = free_port()
    env = {
        "MURMUR_PORT": str(port),
        "MURMUR_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "MURMUR_CONFIG": str(config),
    }
    settings = make_settings(database_url, REDIS_URL, tmp_path, **env)
    database = Database(settings.database_url)
    server = make_server("127.0.0.1", port, create_app(settings, db=database), threaded=True)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    process_env = {
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": WEBHOOK_SECRET,
        **env,
    }
    try:
        yield LiveApi(f"http://127.0.0.1:{port}", settings, database, process_env)
    finally:
        server.shutdown()
        database.dispose()


def test_jobs_on_a_whisperx_profile_come_back_within_the_wer_bound(
    whisperx_api: LiveApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = whisperx_api.settings
    state_dir = tmp_path / "instances"
    monkeypatch.setenv("MURMUR_CPU_THREADS", "2")  # inherited by the local worker process
    provider = LocalProvider(settings, state_dir=state_dir, term_grace=10)
    svc = build_services(
        settings,
        make_celery(settings),
        db=whisperx_api.db,
        providers=ProviderRegistry(settings, {"local": provider}),
        clock=utc_clock,
    )
    jobs = {}
    for fixture in MAX_WER:
        with (FIXTURES / f"{fixture}.wav").open("rb") as fh:
            created = requests.post(
                f"{whisperx_api.url}/v1/jobs",
                headers=auth(),
                files={"file": (f"{fixture}.wav", fh)},
                timeout=60,
            )
        assert created.status_code == 202, created.text
        jobs[fixture] = created.json()["id"]

    def finished() -> bool:
        reconcile(svc)
        states = [
            api_get(whisperx_api, f"/v1/jobs/{job_id}").json()["status"] for job_id in jobs.values()
        ]
        assert "failed" not in states and "cancelled" not in states, states
        return all(state == "succeeded" for state in states)

    try:
        wait_for(finished, 480, "both jobs to finish", step=1.0)
        for fixture, job_id in jobs.items():
            text = api_get(
                whisperx_api, f"/v1/jobs/{job_id}/transcript", params={"format": "txt"}
            ).text
            reference = (FIXTURES / f"{fixture}.txt").read_text()
            wer = jiwer.wer(_words(reference), _words(text))
            print(f"{fixture}: WER {wer:.3f}")
            assert wer <= MAX_WER[fixture], text
        with whisperx_api.db.session() as s:
            (worker,) = s.scalars(select(Worker)).all()
            assert worker.profile == "local-whisperx"
            runtime = worker.runtime or {}
            assert (runtime["vad"], runtime["batch_size"]) == ("pyannote", 8)
            assert runtime["versions"]["whisperx"] == "3.8.6"
    finally:
        for instance in provider.list_by_tag(frozenset()):
            provider.delete(instance.instance_id, instance.resources)
