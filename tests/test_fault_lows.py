"""The lows of issue 32 §6 and the worker-text paths of §4, each through the real endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from app.credentials import InstanceCredential
from app.db import Database
from app.models import Worker, WorkerState
from gpu_worker.protocol import routes
from tests.conftest import add_worker
from tests.test_api_input import error_of, job_count, upload
from tests.test_worker_endpoints import SIGNING_KEY


@pytest.mark.parametrize("language", ["\u212aa", "\u212aA", "\u0130t", "e\u0274"])
def test_a_language_code_is_ascii_only(client: Any, db: Database, language: str) -> None:
    # U+212A KELVIN SIGN lower-cases to "k": "\u212aa" was accepted as Georgian ("ka").
    error_of(upload(client, language=language), 400, "invalid_language")
    assert job_count(db) == 0


def _raw(client: Any, worker: Worker, path: str, raw: bytes) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        data=raw,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_worker_body_with_a_key_twice_is_refused(client: Any, db: Database) -> None:
    worker = add_worker(db)
    raw = b'{"stage": "image_pull", "detail": "a", "stage": "container_exited"}'
    answer = _raw(client, worker, routes.BOOT_FAILURE, raw)
    assert answer.status_code == 400
    assert answer.get_json()["error"]["code"] == "duplicate_field"
    assert answer.get_json()["error"]["message"].endswith(": stage")
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.state == WorkerState.BOOTING.value
    # Nested too, as the public API refuses it.
    nested = b'{"runtime": {"device": "cpu", "device": "cuda"}}'
    answer = _raw(client, worker, routes.READY, nested)
    assert answer.get_json()["error"]["code"] == "duplicate_field"


def test_planted_secrets_in_a_boot_report_are_redacted(client: Any, db: Database) -> None:
    """The red team's five secrets, via a boot-failure report, reached `workers.error`."""
    worker = add_worker(db)
    detail = (
        'MURMUR_API_TOKEN=t0ken1 AWS_SECRET_ACCESS_KEY=s3cr3t2 DB_PASSWORD=pw3 "password": "pw4" '
        "HF_TOKEN=hf_5\u202e"
    )
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    answer = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{routes.BOOT_FAILURE}",
        json={"stage": "image_pull", "detail": detail},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.error is not None
        for secret in ("t0ken1", "s3cr3t2", "pw3", "pw4", "hf_5", "\u202e"):
            assert secret not in row.error
