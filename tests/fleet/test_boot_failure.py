"""A failed boot says so: the instance reports it, one report holds the profile (issue 22 §2).

The report is `POST .../boot-failure` with the instance credential (gpu_worker/protocol/boot.py);
the cloud-init report script sends it from the pull script and the unit's ExecStopPost.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from app.db import Database
from app.fleet import cloudinit
from app.fleet.planner import Death
from app.fleet.service import fleet_overview
from app.models import JobStatus, Worker, WorkerState
from gpu_worker.protocol import routes
from gpu_worker.protocol.boot import BootFailure
from tests.conftest import add_worker
from tests.fleet.conftest import L4, MakeFleet
from tests.fleet.test_fleet_faults import _metric
from tests.test_worker_endpoints import call


def test_a_booting_worker_reports_its_failed_boot(client: Any, db: Database) -> None:
    worker = add_worker(db)
    answer = call(
        client,
        worker,
        routes.BOOT_FAILURE,
        {"stage": "image_pull", "detail": "docker pull exited 1 token=abc123"},
    )
    assert answer.status_code == 200 and answer.get_json() == {"accepted": True}
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.state == WorkerState.FAILED.value
        assert Death.of(row.error) is Death.BOOT_FAILED
        assert row.error == "boot failed: image_pull (docker pull exited 1 token=<secret>)"
    # The unit reports every stop: a second report changes nothing.
    again = call(client, worker, routes.BOOT_FAILURE, {"stage": "container_exited"})
    assert again.status_code == 200 and again.get_json() == {"accepted": False}


def test_a_ready_worker_is_not_failed_by_a_boot_report(client: Any, db: Database) -> None:
    worker = add_worker(db, state=WorkerState.READY)
    answer = call(client, worker, routes.BOOT_FAILURE, {"stage": "container_exited"})
    assert answer.get_json() == {"accepted": False}
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.state == WorkerState.READY.value


def test_a_boot_report_needs_the_instance_credential_and_a_known_stage(
    client: Any, db: Database
) -> None:
    worker = add_worker(db)
    forged = client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{routes.BOOT_FAILURE}",
        json={"stage": "image_pull"},
        headers={"Authorization": "Bearer " + "0" * 64},
    )
    assert forged.status_code == 401 and forged.get_json()["error"]["code"]
    bad = call(client, worker, routes.BOOT_FAILURE, {"stage": "gremlins"})
    assert bad.status_code == 400 and bad.get_json()["error"]["code"] == "invalid_body"
    long = call(client, worker, routes.BOOT_FAILURE, {"stage": "image_pull", "detail": "x" * 301})
    assert long.status_code == 400
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None and row.state == WorkerState.BOOTING.value


def test_the_sender_redacts_and_bounds_the_detail() -> None:
    body = BootFailure.of("image_pull", "pull https://user:pw@registry/x failed " + "y" * 900)
    assert "pw@" not in body.detail and len(body.detail) == 300


def test_one_reported_boot_failure_holds_the_profile(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4], fleet={"boot_timeout_seconds": 900.0, "max_failed_boots": 3})
    fleet.add_jobs(2)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    booting = fleet.workers(WorkerState.BOOTING.value)
    assert len(booting) == 2
    # The first instance's image does not pull: its boot path says so, long before 900 s.
    from app.fleet import readiness

    failure = BootFailure.of("image_pull", "docker pull exited 1")
    assert readiness.report_boot_failure(fleet.db, booting[0].id, failure, fleet.clock())
    fleet.reconcile(advance=5)
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.retry_at is not None
    assert state.consecutive_failed_boots == 1
    assert "boot failed: image_pull" in (state.last_error or "")
    # Shown where a hold after failed boots is shown: /v1/fleet, and the alert's metric.
    view = fleet_overview(fleet.svc.settings, fleet.db, fleet.svc.redis, fleet.clock())
    (l4,) = view["profiles"]
    assert l4["retry_at"] is not None and "boot failed: image_pull" in l4["last_error"]
    held = {
        reason: _metric(fleet, "murmur_fleet_profile_held", profile="l4-par2", reason=reason)
        for reason in ("backoff", "error", "failed_boots")
    }
    assert held == {"backoff": 0, "error": 0, "failed_boots": 1}
    # Held: no replacement is booted for the reported worker; the jobs stay on the profile
    # (only a stock-out moves jobs to another one).
    fleet.reconcile(advance=5)
    live = fleet.workers(WorkerState.REQUESTED.value, WorkerState.CREATING.value)
    live += fleet.workers(WorkerState.BOOTING.value)
    assert [w.id for w in live] == [booting[1].id]
    assert {j.profile for j in fleet.jobs()} == {"l4-par2"}
    assert all(j.status != JobStatus.FAILED.value for j in fleet.jobs())


def test_the_report_script_posts_the_failure_with_the_credential(tmp_path: Path) -> None:
    env_file = tmp_path / "worker.env"
    env_file.write_text(
        "MURMUR_CONTROL_URL=https://murmur.example\nMURMUR_WORKER_ID=wrk_1\n"
        "MURMUR_INSTANCE_ID=inst-1\nMURMUR_WORKER_TOKEN=sekrit\n"
    )
    script = tmp_path / "report"
    script.write_text(cloudinit.report_script().replace(cloudinit.ENV_FILE, str(env_file)))
    script.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "curl-calls"
    # A curl that records its arguments and what it read on stdin (the header).
    (bin_dir / "curl").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {calls}\ncat >> {calls}\n')
    (bin_dir / "curl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(*args: str, **extra: str) -> str:
        calls.write_text("")
        subprocess.run([str(script), *args], check=True, env={**env, **extra}, timeout=30)
        return calls.read_text()

    sent = run("image_pull", 'docker pull exited 1"; rm -rf /')
    assert "https://murmur.example/internal/workers/wrk_1/inst-1/boot-failure" in sent
    assert "Authorization: Bearer sekrit" in sent
    assert "sekrit" not in sent.split("Authorization")[0]  # never on the command line
    assert '{"stage": "image_pull", "detail": "docker pull exited 1 rm -rf "}' in sent
    # From ExecStopPost: nothing after a clean stop; the worker's refusal (exit 3) by name.
    assert run("exited", SERVICE_RESULT="success") == ""
    refused = run("exited", SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="3")
    assert '"stage": "runtime_rejected"' in refused
    crashed = run("exited", SERVICE_RESULT="exit-code", EXIT_CODE="killed", EXIT_STATUS="9")
    assert '"stage": "container_exited"' in crashed


def test_an_instance_that_stops_before_ready_is_a_failed_boot(make_fleet: MakeFleet) -> None:
    """Issue 32 §2: a worker that exits at start, its report lost, must not loop.

    Before: `instance stopped`, uncounted, unheld, the job not charged; the fleet booted a
    replacement every round (66 in 300 s) and the jobs stayed queued with 0 attempts.
    """
    fleet = make_fleet(
        [L4], fleet={"boot_timeout_seconds": 900.0, "max_failed_boots": 3, "max_attempts": 1}
    )
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    (booting,) = fleet.workers(WorkerState.BOOTING.value)
    with fleet.db.session() as s:
        row = s.get(Worker, booting.id)
        assert row is not None and row.booted_at is not None  # the provider saw it running
    assert fleet.emulator is not None and booting.instance_id is not None
    fleet.emulator.set_state(booting.instance_id, "stopped")  # it exited before ready
    fleet.reconcile(advance=5)
    with fleet.db.session() as s:
        row = s.get(Worker, booting.id)
        assert row is not None and Death.of(row.error) is Death.BOOT_FAILED
        assert "stopped before it was ready" in (row.error or "")
    state = fleet.profile_state("l4-par2")
    assert state is not None and state.consecutive_failed_boots == 1
    assert state.retry_at is not None  # held with the back-off, as a reported failure is
    # Charged to the job: with max_attempts 1 it ends failed, saying why.
    (job,) = fleet.jobs()
    assert job.attempts == 1
    assert job.status == JobStatus.FAILED.value and job.error_code == "worker_boot_failed"
    # No replacement while held.
    fleet.reconcile(advance=5)
    live = fleet.workers(
        WorkerState.REQUESTED.value, WorkerState.CREATING.value, WorkerState.BOOTING.value
    )
    assert live == []
