"""The embedded default end to end: reconcile starts a real worker process, it transcribes, it goes.

Real API over HTTP, real Redis, the real `python -m gpu_worker run` started by the `local`
provider, readiness through the API into app.fleet.readiness, teardown by SIGTERM.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest
import requests
from sqlalchemy import select

from app.celery_config import make_celery
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.local import LocalProvider
from app.fleet.reconcile import reconcile
from app.models import Worker, WorkerState
from app.services import build_services, utc_clock
from tests.conftest import FIXTURES, LiveApi, api_get, auth, wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_reconcile_runs_a_local_worker_from_start_to_teardown(
    live_api: LiveApi, tmp_path: Path
) -> None:
    settings = live_api.settings
    state_dir = tmp_path / "instances"
    offset = timedelta()

    def clock() -> datetime:
        return utc_clock() + offset

    svc = build_services(
        settings,
        make_celery(settings),
        db=live_api.db,
        providers=ProviderRegistry(
            settings, {"local": LocalProvider(settings, state_dir=state_dir, term_grace=10)}
        ),
        clock=clock,
    )
    with (FIXTURES / "speech-short.wav").open("rb") as fh:
        created = requests.post(
            f"{live_api.url}/v1/jobs", headers=auth(), files={"file": ("a.wav", fh)}, timeout=60
        )
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]

    def finished() -> str | None:
        reconcile(svc)
        status = str(api_get(live_api, f"/v1/jobs/{job_id}").json()["status"])
        return status if status in ("succeeded", "failed", "cancelled") else None

    try:
        assert wait_for(finished, 240, "the job to finish", step=0.5) == "succeeded"
        text = api_get(live_api, f"/v1/jobs/{job_id}/transcript", params={"format": "txt"}).text
        assert text.strip()
        (record,) = [json.loads(p.read_text()) for p in state_dir.glob("local-*.json")]
        pid = int(record["pid"])

        with live_api.db.session() as s:
            (worker,) = s.scalars(select(Worker)).all()
            assert worker.state == WorkerState.READY.value
            assert worker.runtime is not None and worker.runtime["compute_type"] == "int8"
            assert worker.first_job_at is not None and worker.idle_since is not None

        offset = timedelta(seconds=settings.fleet.idle_timeout_seconds + 1)

        def deleted() -> bool:
            reconcile(svc)
            with live_api.db.session() as s:
                return s.scalars(select(Worker)).one().state == WorkerState.DELETED.value

        wait_for(deleted, 60, "the idle worker to be deleted", step=0.5)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert list(state_dir.glob("local-*.json")) == []
    finally:
        provider = LocalProvider(settings, state_dir=state_dir, term_grace=1)
        for instance in provider.list_by_tag(frozenset()):
            provider.delete(instance.instance_id, instance.resources)
