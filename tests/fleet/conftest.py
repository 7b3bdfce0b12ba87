"""Fixtures for fleet tests: real Redis (db 14), SQLite and PostgreSQL, the Scaleway emulator.

`make_fleet` builds a Services wired to all of them with a fake clock, plus helpers that
play the workers' part in the database (report ready, claim, finish), so reconcile can be
driven step by step without real transcription.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from app.celery_config import make_celery
from app.config import Profile, Settings
from app.db import Database
from app.fleet import readiness
from app.fleet.catalog import SERVER_TYPES
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.base import Provider
from app.fleet.providers.scaleway import ScalewayProvider
from app.fleet.reconcile import ReconcileReport, reconcile
from app.models import Job, JobStatus, ProfileState, Worker, WorkerState
from app.services import Services, build_services
from gpu_worker.protocol.readiness import ReadinessRuntime
from tests.conftest import REDIS_URL, FakeClock
from tests.fleet.emulator import InstanceEmulator

SECRET_KEY = str(uuid.uuid4())
ACCESS_KEY = "SCWXXXXXXXXXXXXXXXXX"
PROJECT_ID = str(uuid.uuid4())
SIGNING_KEY = "fleet-test-signing-key-" + "s" * 32
WORKER_IMAGE = "rg.fr-par.scw.cloud/murmur/worker@sha256:" + "0123456789abcdef" * 4

L4 = {
    "name": "l4-par2",
    "provider": "scaleway",
    "zone": "fr-par-2",
    "server_type": "L4-1-24G",
    "image": "murmur-worker-gpu",
    "worker_image": WORKER_IMAGE,
    "security_group": "workers-par2",
    "model": "tiny.en",
    "compute_type": "float16",
    "vad": "pyannote",
    "alignment_device": "cuda",
    "batch_size": 16,
    "max_workers": 3,
    "hourly_cost_eur": 0.75,
}
P100 = {
    "name": "p100-par1",
    "provider": "scaleway",
    "zone": "fr-par-1",
    "server_type": "RENDER-S",
    "image": "murmur-worker-gpu",
    "worker_image": WORKER_IMAGE,
    "security_group": "workers-par1",
    "model": "tiny.en",
    "compute_type": "float32",
    "vad": "silero",
    "alignment_device": "cpu",
    "batch_size": 8,
    "max_workers": 2,
    "hourly_cost_eur": 1.2426,
}


@pytest.fixture()
def emulator() -> Iterator[InstanceEmulator]:
    emu = InstanceEmulator(secret_key=SECRET_KEY, project_id=PROJECT_ID)
    emu.start()
    yield emu
    emu.stop()


def foreign_server(emulator: InstanceEmulator, zone: str, tags: list[str]) -> str:
    """A running server in our project that the fleet did not make, created with the real SDK
    (someone else's, or one carrying only some of the fleet's tags); its id."""
    from scaleway import Client
    from scaleway.instance.v1 import ServerAction
    from scaleway.instance.v1.custom_api import InstanceUtilsV1API

    api = InstanceUtilsV1API(
        Client(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            api_url=emulator.url,
            default_project_id=PROJECT_ID,
        )
    )
    server = api.create_server(
        zone=zone, commercial_type="L4-1-24G", image="ubuntu", tags=tags, protected=False
    ).server
    api.server_action(server_id=server.id, action=ServerAction.POWERON, zone=zone)
    return server.id


# Servers the fleet must never touch: no tags, the fleet tag without a worker id, a worker id
# without the fleet tag, tags that only start like the fleet's.
FOREIGN_TAGS = [
    [],
    ["murmur"],
    ["murmur", "murmur-worker="],
    ["murmur-worker=wrk_theirs", "murmur-profile=l4-par2"],
    ["murmur-old", "murmur-worker=wrk_old"],
]


def fleet_settings(
    emulator_url: str,
    groups: dict[str, dict[str, str]],
    profiles: list[dict[str, Any]],
    *,
    budget: float = 10.0,
    fleet: dict[str, Any] | None = None,
    observability: dict[str, Any] | None = None,
) -> Settings:
    return Settings.model_validate(
        {
            "redis_url": REDIS_URL,
            "profiles": profiles,
            "security_groups": groups,
            "budget": {"max_hourly_eur": budget},
            "fleet": {
                "provider_timeout_seconds": 2.0,
                "reconcile_interval_seconds": 5.0,
                "idle_timeout_seconds": 60.0,
                "boot_timeout_seconds": 900.0,
                "backoff_seconds": 60.0,
                "backoff_max_seconds": 900.0,
                **(fleet or {}),
            },
            "observability": observability or {},
            "scaleway": {"api_url": emulator_url, "project_id": PROJECT_ID},
            "scaleway_access_key": ACCESS_KEY,
            "scaleway_secret_key": SECRET_KEY,
            "signing_key": SIGNING_KEY,
        }
    )


def runtime_for(profile: Profile, /, **override: Any) -> dict[str, Any]:
    """The runtime a correct worker of this profile reports."""
    stype = SERVER_TYPES[profile.server_type]
    runtime: dict[str, Any] = {
        "profile": profile.name,
        "model": profile.model,
        "device": "cuda" if stype.gpu else "cpu",
        "compute_type": profile.compute_type,
        "vad": profile.vad,
        "alignment_device": profile.alignment_device,
        "batch_size": profile.batch_size,
        "gpu_name": stype.gpu,
        "cuda_capability": list(stype.cuda_capability) if stype.cuda_capability else None,
        "versions": {"faster_whisper": "1.2.1"},
    }
    runtime.update(override)
    return runtime


@dataclass
class Fleet:
    svc: Services
    clock: FakeClock
    emulator: InstanceEmulator | None
    reports: list[ReconcileReport] = field(default_factory=list)

    @property
    def db(self) -> Database:
        return self.svc.db

    def reconcile(self, advance: float = 0.0) -> ReconcileReport:
        self.clock.advance(advance)
        report = reconcile(self.svc)
        self.reports.append(report)
        return report

    def add_jobs(self, n: int) -> list[str]:
        ids = []
        with self.db.session() as s:
            for i in range(n):
                job = Job(
                    owner="test",
                    source="upload",
                    audio_key="x",
                    status=JobStatus.QUEUED.value,
                    created_at=self.clock() + timedelta(microseconds=i),
                )
                s.add(job)
                s.flush()
                ids.append(job.id)
        return ids

    def workers(self, *states: str) -> list[Worker]:
        with self.db.session() as s:
            q = select(Worker).order_by(Worker.requested_at, Worker.id)
            if states:
                q = q.where(Worker.state.in_(states))
            return list(s.scalars(q))

    def jobs(self, *states: str) -> list[Job]:
        with self.db.session() as s:
            q = select(Job).order_by(Job.created_at)
            if states:
                q = q.where(Job.status.in_(states))
            return list(s.scalars(q))

    def profile_state(self, name: str) -> ProfileState | None:
        with self.db.session() as s:
            return s.get(ProfileState, name)

    def report_ready(self, worker_id: str, **override: Any) -> list[str]:
        """Play the worker's readiness call through app.fleet.readiness, as the endpoint does."""
        with self.db.session() as s:
            row = s.get(Worker, worker_id)
            assert row is not None
            profile = self.svc.settings.profile(row.profile)
            runtime = ReadinessRuntime.model_validate(runtime_for(profile, **override))
            problems = readiness.runtime_mismatches(profile, runtime)
            if problems:
                readiness.reject(s, row, problems, self.clock())
            else:
                readiness.mark_ready(s, row, runtime, self.clock())
        return problems

    def ready_all(self) -> int:
        starting = self.workers(WorkerState.CREATING.value, WorkerState.BOOTING.value)
        for w in starting:
            assert not self.report_ready(w.id)
        return len(starting)

    def claim_all(self) -> int:
        """Each ready idle worker claims one job dispatched to its profile."""
        claimed = 0
        with self.db.session() as s:
            idle = list(
                s.scalars(
                    select(Worker).where(
                        Worker.state == WorkerState.READY.value, Worker.current_job_id.is_(None)
                    )
                )
            )
            for w in idle:
                job = s.scalars(
                    select(Job)
                    .where(Job.status == JobStatus.DISPATCHED.value, Job.profile == w.profile)
                    .order_by(Job.created_at)
                    .limit(1)
                ).first()
                if job is None:
                    continue
                job.status = JobStatus.RUNNING.value
                job.worker_id = w.id
                job.started_at = self.clock()
                w.current_job_id = job.id
                w.idle_since = None
                w.last_seen_at = self.clock()
                w.first_job_at = w.first_job_at or self.clock()
                claimed += 1
        return claimed

    def finish_all(self) -> int:
        """Every running job succeeds; its worker becomes idle."""
        finished = 0
        with self.db.session() as s:
            for job in s.scalars(select(Job).where(Job.status == JobStatus.RUNNING.value)):
                job.status = JobStatus.SUCCEEDED.value
                job.finished_at = self.clock()
                worker = s.get(Worker, job.worker_id) if job.worker_id else None
                if worker is not None and worker.current_job_id == job.id:
                    worker.current_job_id = None
                    worker.idle_since = self.clock()
                    worker.jobs_done += 1
                    worker.last_seen_at = self.clock()
                finished += 1
        return finished


MakeFleet = Callable[..., Fleet]


@pytest.fixture()
def make_fleet(
    db: Database, clean_redis: redis.Redis, emulator: InstanceEmulator, tmp_path: Path
) -> Iterator[MakeFleet]:
    celeries: list[Any] = []

    def make(
        profiles: list[dict[str, Any]] | None = None,
        *,
        providers: dict[str, Provider] | None = None,
        **settings_kw: Any,
    ) -> Fleet:
        groups = {
            "workers-par2": {
                "id": emulator.add_security_group("fr-par-2", "murmur"),
                "zone": "fr-par-2",
            },
            "workers-par1": {
                "id": emulator.add_security_group("fr-par-1", "murmur"),
                "zone": "fr-par-1",
            },
        }
        settings = fleet_settings(
            emulator.url, groups, profiles or [L4, P100], **settings_kw
        ).model_copy(update={"storage_path": str(tmp_path / "audio")})
        celery = make_celery(settings)
        celeries.append(celery)
        overrides: dict[str, Provider] = {
            "scaleway": ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0)
        }
        overrides.update(providers or {})
        clock = FakeClock()
        svc = build_services(
            settings,
            celery,
            db=db,
            providers=ProviderRegistry(settings, overrides),
            clock=clock,
        )
        return Fleet(svc, clock, emulator)

    yield make
    for celery in celeries:
        celery.close()
