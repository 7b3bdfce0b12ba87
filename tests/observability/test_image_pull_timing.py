"""The image pull a worker's unit measured, from its readiness report to /metrics and diagnostics.

The worker reports `image_pull_seconds` in its runtime (gpu_worker/service.py); the control plane
keeps the runtime and exports the value as the lifecycle histogram
`murmur_worker_image_pull_seconds` per profile, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.models import Worker, WorkerState
from tests.conftest import ADMIN_TOKEN, add_worker
from tests.observability.conftest import ObsEnv, scrape_headers, worker_headers

RUNTIME = {
    "profile": "local-cpu",
    "model": "tiny.en",
    "device": "cpu",
    "compute_type": "int8",
    "vad": "silero",
    "alignment_device": "none",
    "batch_size": 1,
    "gpu_name": None,
    "cuda_capability": None,
    "versions": {"faster_whisper": "1.2.1"},
    "model_load_seconds": 0.5,
}


def _ready(obs: ObsEnv, **extra: Any) -> Worker:
    worker = add_worker(obs.db, "local-cpu", state=WorkerState.BOOTING)
    response = obs.client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}/ready",
        json={"runtime": {**RUNTIME, **extra}},
        headers=worker_headers(worker),
    )
    assert response.status_code in (200, 204), response.get_data(as_text=True)
    return worker


def _samples(obs: ObsEnv, name: str) -> dict[tuple[str, float | None], float]:
    """(suffix, bucket bound) -> value of the local-cpu series of one histogram."""
    response = obs.client.get("/metrics", headers=scrape_headers())
    assert response.status_code == 200
    return {
        (s.name.removeprefix(name), float(s.labels["le"]) if "le" in s.labels else None): s.value
        for family in text_string_to_metric_families(response.get_data(as_text=True))
        for s in family.samples
        if s.name.startswith(name) and s.labels.get("profile") == "local-cpu"
    }


def test_the_reported_pull_time_is_a_lifecycle_histogram(obs: ObsEnv) -> None:
    pulled = _ready(obs, image_pull_seconds=42.5)
    _ready(obs)  # started without a pull (the local provider): not a measurement
    found = _samples(obs, "murmur_worker_image_pull_seconds")
    assert found[("_count", None)] == 1
    assert found[("_sum", None)] == 42.5
    assert found[("_bucket", 30.0)] == 0
    assert found[("_bucket", 60.0)] == 1

    response = obs.client.get(
        f"/v1/workers/{pulled.id}/diagnostics",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert response.status_code == 200
    assert response.get_json()["lifecycle"]["phases"]["image_pull_seconds"] == 42.5
