"""`murmur smoke` leaves nothing behind on the paths that end a run early (emulator, real SDK).

An interruption while a server is being created, a create that times out and completes late,
and a smoke worker that a concurrent reconcile gave a user's job.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.config import Profile
from app.fleet.smoke import SmokeInterrupted, SmokeRefused, render, run_smoke, worst_case_eur
from app.models import Job, JobStatus, Worker, WorkerState, new_id
from app.services import Services
from tests.fleet.conftest import L4, P100, MakeFleet
from tests.fleet.emulator import InstanceEmulator

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "welcome.wav"


def _smoke_services(make_fleet: MakeFleet, tmp_path: Path) -> Services:
    svc = make_fleet([L4]).svc
    settings = svc.settings.model_copy(update={"storage_path": str(tmp_path / "audio")})
    return dataclasses.replace(svc, settings=settings)


def _left(emulator: InstanceEmulator) -> list[str]:
    return [str(s.data["state"]) for s in emulator.servers.values()]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_ctrl_c_while_the_server_is_created_deletes_it(
    make_fleet: MakeFleet, emulator: InstanceEmulator, tmp_path: Path
) -> None:
    svc = _smoke_services(make_fleet, tmp_path)
    provider = svc.providers["scaleway"]
    real_create = provider.create

    def create(profile: Profile, worker_id: str, bind: Any) -> Any:
        real_create(profile, worker_id, bind)
        raise KeyboardInterrupt  # Ctrl-C as the create returns: smoke never saw the worker id

    provider.create = create  # type: ignore[method-assign]
    with pytest.raises(SmokeInterrupted) as caught:
        run_smoke(svc, [svc.settings.profiles[0]], SAMPLE, timeout=5, max_eur=100.0, poll=0.05)
    assert _left(emulator) == []
    (result,) = caught.value.results
    assert result.worker_id is not None and result.left == [], render([result])
    assert result.cost_eur == pytest.approx(0.75 / 60)  # L4 is billed per started minute
    with svc.db.reader() as s:
        row = s.get(Worker, result.worker_id)
        assert row is not None and row.state == WorkerState.DELETED.value


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_ctrl_c_inside_create_abandons_the_server(
    make_fleet: MakeFleet, emulator: InstanceEmulator
) -> None:
    svc = make_fleet([L4]).svc
    provider = svc.providers["scaleway"]

    def bind(instance_id: str, resources: Any) -> dict[str, str]:
        raise KeyboardInterrupt  # arrives between the server's creation and its power-on

    with pytest.raises(KeyboardInterrupt):
        provider.create(svc.settings.profiles[0], new_id("wrk"), bind)
    assert _left(emulator) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_create_that_times_out_and_completes_late_is_found_and_deleted(
    make_fleet: MakeFleet, emulator: InstanceEmulator, tmp_path: Path
) -> None:
    svc = _smoke_services(make_fleet, tmp_path)  # provider_timeout_seconds=2
    emulator.inject("create", "slow", delay=3.0, times=1)
    (result,) = run_smoke(
        svc, [svc.settings.profiles[0]], SAMPLE, timeout=5, max_eur=100.0, poll=0.05
    )
    report = render([result])
    time.sleep(2.0)  # by now the abandoned create has completed on the provider's side
    assert _left(emulator) == [], report  # smoke itself waited for it and deleted it
    assert not result.ok and result.left == [], report
    assert any("created after provisioning failed" in p for p in result.problems), report


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_smoke_worker_running_a_users_job_is_not_deleted(
    make_fleet: MakeFleet, emulator: InstanceEmulator, tmp_path: Path
) -> None:
    svc = _smoke_services(make_fleet, tmp_path)
    users_job = new_id("job")

    def echo(line: str) -> None:
        if not line.startswith("deleting"):
            return
        # A reconcile beside the smoke test dispatched a user's job to this profile, and the
        # smoke worker (ready by now) claimed it.
        with svc.db.session() as s:
            (worker,) = s.query(Worker).all()
            s.add(
                Job(
                    id=users_job,
                    owner="someone",
                    source="upload",
                    status=JobStatus.RUNNING.value,
                    profile=worker.profile,
                    worker_id=worker.id,
                    attempts=1,
                )
            )
            worker.state = WorkerState.READY.value
            worker.current_job_id = users_job

    (result,) = run_smoke(
        svc,
        [svc.settings.profiles[0]],
        SAMPLE,
        timeout=0.2,
        max_eur=100.0,
        teardown_timeout=1.0,
        poll=0.05,
        echo=echo,
    )
    report = render([result])
    assert any(f"runs job {users_job}" in p for p in result.problems), report
    assert _left(emulator) != [], report  # the fleet retires it once idle
    with svc.db.reader() as s:
        row = s.get(Worker, result.worker_id)
        assert row is not None and row.state == WorkerState.READY.value
        job = s.get(Job, users_job)
        assert job is not None and job.status == JobStatus.RUNNING.value


def test_the_euro_bound_counts_whole_billing_increments() -> None:
    p100, l4 = Profile.model_validate(P100), Profile.model_validate(L4)
    assert worst_case_eur([p100], 301) == pytest.approx(1.2426)  # RENDER-S: per started hour
    assert worst_case_eur([l4], 301) == pytest.approx(0.75 * 360 / 3600)  # L4: per minute
    assert worst_case_eur([p100, l4], 3601) == pytest.approx(2 * 1.2426 + 0.75 * 3660 / 3600)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_that_would_start_a_billed_hour_beyond_the_cap_is_refused(
    make_fleet: MakeFleet, emulator: InstanceEmulator, tmp_path: Path
) -> None:
    svc = _smoke_services(make_fleet, tmp_path)
    p100 = Profile.model_validate(P100)
    # 10 minutes cost 0.21 EUR by the second, but RENDER-S bills the whole started hour.
    with pytest.raises(SmokeRefused, match="1.24 EUR"):
        run_smoke(svc, [p100], SAMPLE, timeout=300, teardown_timeout=300, max_eur=0.5)
    assert _left(emulator) == []


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_smoke_worker_is_deleted_once_the_users_job_it_took_is_done(
    make_fleet: MakeFleet, emulator: InstanceEmulator, tmp_path: Path
) -> None:
    svc = _smoke_services(make_fleet, tmp_path)
    users_job = new_id("job")
    seen_at_finish: list[str] = []

    def finish_the_job() -> None:
        with svc.db.session() as s:
            (worker,) = s.query(Worker).all()
            seen_at_finish.append(worker.state)  # still working, not being deleted
            job = s.get(Job, users_job)
            assert job is not None
            job.status = JobStatus.SUCCEEDED.value
            worker.current_job_id = None

    def echo(line: str) -> None:
        if not line.startswith("deleting"):
            return
        with svc.db.session() as s:
            (worker,) = s.query(Worker).all()
            s.add(
                Job(
                    id=users_job,
                    owner="someone",
                    source="upload",
                    status=JobStatus.RUNNING.value,
                    profile=worker.profile,
                    worker_id=worker.id,
                    attempts=1,
                )
            )
            worker.state = WorkerState.READY.value
            worker.current_job_id = users_job
        threading.Timer(0.5, finish_the_job).start()

    (result,) = run_smoke(
        svc,
        [svc.settings.profiles[0]],
        SAMPLE,
        timeout=0.2,
        max_eur=100.0,
        teardown_timeout=20.0,
        poll=0.05,
        echo=echo,
    )
    report = render([result])
    assert seen_at_finish == [WorkerState.READY.value], report
    assert _left(emulator) == [] and result.left == [], report
    assert not any("worker kept" in p for p in result.problems), report
    with svc.db.reader() as s:
        row = s.get(Worker, result.worker_id)
        assert row is not None and row.state == WorkerState.DELETED.value
