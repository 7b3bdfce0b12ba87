"""Fixtures for observability tests: an API with reporting on, worker credentials, report bodies."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from app import create_app
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.models import Worker, WorkerState
from tests.conftest import REDIS_URL, SIGNING_KEY, add_worker, make_settings

SCRAPE_TOKEN = "test-scrape-token-" + "f" * 32
INTERVAL = 30.0

PROFILES_TOML = """
[budget]
max_hourly_eur = 5.0

[observability]
enabled = true
report_interval_seconds = {interval}

[[profiles]]
name = "local-cpu"
provider = "local"
zone = "local"
server_type = "local-cpu"

[[profiles]]
name = "gpu-l4"
provider = "scaleway"
zone = "fr-par-2"
server_type = "L4-1-24G"
image = "murmur-worker-image"
security_group = "sg-par2"
compute_type = "float16"
hourly_cost_eur = 0.75
max_workers = 2
"""


def observability_settings(
    database_url: str, tmp_path: Path, *, interval: float = INTERVAL, **env: str
) -> Settings:
    config = tmp_path / "murmur.toml"
    config.write_text(PROFILES_TOML.format(interval=interval))
    values = {"MURMUR_CONFIG": str(config), "MURMUR_SCRAPE_TOKEN": SCRAPE_TOKEN, **env}
    return make_settings(database_url, REDIS_URL, tmp_path, **values)


def build_app(settings: Settings, db: Database) -> Flask:
    app = create_app(settings, db=db)
    assert "observability" in app.blueprints, "the factory mounts the observability blueprint"
    return app


@dataclass
class ObsEnv:
    settings: Settings
    db: Database
    redis: redis.Redis
    app: Flask
    tmp_path: Path

    @property
    def client(self) -> Any:
        return self.app.test_client()

    def with_settings(self, **env: str) -> ObsEnv:
        settings = observability_settings(self.settings.database_url, self.tmp_path, **env)
        return ObsEnv(settings, self.db, self.redis, build_app(settings, self.db), self.tmp_path)

    def with_interval(self, interval: float) -> ObsEnv:
        settings = observability_settings(
            self.settings.database_url, self.tmp_path, interval=interval
        )
        return ObsEnv(settings, self.db, self.redis, build_app(settings, self.db), self.tmp_path)


@pytest.fixture()
def obs(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Iterator[ObsEnv]:
    settings = observability_settings(database_url, tmp_path)
    db = Database(settings.database_url)
    try:
        yield ObsEnv(settings, db, clean_redis, build_app(settings, db), tmp_path)
    finally:
        db.dispose()


def credential(worker: Worker) -> str:
    return InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token


def worker_headers(worker: Worker) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential(worker)}"}


def report_url(worker: Worker) -> str:
    return f"/internal/workers/{worker.id}/{worker.instance_id}/report"


def scrape_headers(token: str = SCRAPE_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def live_worker(
    db: Database, profile: str = "local-cpu", state: WorkerState = WorkerState.READY
) -> Worker:
    return add_worker(db, profile, state=state)


def reading(value: float | None, reason: str | None = None) -> dict[str, Any]:
    return {"value": value, "reason": reason}


GPU_DEVICE = {
    "index": 0,
    "utilization_ratio": reading(0.42),
    "memory_used_bytes": reading(6.0e9),
    "memory_total_bytes": reading(24.0e9),
    "temperature_celsius": reading(61.0),
    "power_watts": reading(72.5),
}


def make_report(sequence: int = 1, *, started: float = 1_764_000_000.25, **over: Any) -> Any:
    """A valid report body; keyword arguments replace top-level fields."""
    body: dict[str, Any] = {
        "version": 1,
        "process_started_at": started,
        "sequence": sequence,
        "state": "ready",
        "uptime_seconds": 12.5,
        "model_load_seconds": 1.75,
        "transcriptions": {"succeeded": 3, "failed": 1},
        "processing_seconds": 8.5,
        "audio_seconds": 95.25,
        "host": {
            "cpu_utilization_ratio": reading(0.25),
            "memory_used_bytes": reading(2.0e9),
            "memory_total_bytes": reading(8.0e9),
        },
        "gpu": {"devices": [copy.deepcopy(GPU_DEVICE)], "reason": None},
        "log": [],
    }
    body.update(over)
    return body


def post_report(client: Any, worker: Worker, body: Any, **kw: Any) -> Any:
    headers = kw.pop("headers", worker_headers(worker))
    return client.post(report_url(worker), json=body, headers=headers, **kw)
