"""A re-routed job leaves no message on its old queue (issue 11, finding 7), on real Redis.

The queue depth (LLEN transcribe.<profile>) drives scaling and the lost-message rule, so a
stale message must not outlive the re-route.
"""

from __future__ import annotations

import pytest
import redis

from app.celery_config import make_celery
from app.fleet.apply import apply_plan
from app.fleet.lease import LeaseLost
from app.fleet.planner import Requeue, plan_fleet
from app.fleet.snapshot import read_snapshot
from app.jobs.dispatch import withdraw_messages
from app.models import JobStatus, WorkerState
from gpu_worker.protocol.broker import TRANSCRIBE_TASK
from tests.conftest import REDIS_URL
from tests.fleet.conftest import L4, MakeFleet, fleet_settings


def _depth(client: redis.Redis, profile: str) -> int:
    return int(client.llen(f"transcribe.{profile}"))


def test_a_re_routed_job_has_one_message_in_all(make_fleet: MakeFleet) -> None:
    fleet = make_fleet([L4])
    assert fleet.emulator is not None
    client = fleet.svc.redis
    (job,) = fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    (w,) = fleet.workers(WorkerState.BOOTING.value)
    assert [j.status for j in fleet.jobs()] == [JobStatus.DISPATCHED.value]
    assert _depth(client, "l4-par2") == 1
    with fleet.emulator.lock:  # deleted in the console while it booted
        fleet.emulator._remove(fleet.emulator.servers[w.instance_id or ""])

    fleet.reconcile(advance=5)  # dead, its job taken back, a new worker requested
    assert [j.status for j in fleet.jobs()] == [JobStatus.QUEUED.value]
    assert _depth(client, "l4-par2") == 0
    fleet.reconcile(advance=5)  # dispatched to the new worker
    (j,) = fleet.jobs()
    assert j.id == job and j.status == JobStatus.DISPATCHED.value
    assert _depth(client, "l4-par2") == 1


def test_withdraw_removes_only_those_jobs_messages(clean_redis: redis.Redis) -> None:
    settings = fleet_settings("http://127.0.0.1:9", {}, [L4])
    assert settings.redis_url == REDIS_URL
    celery = make_celery(settings)
    try:
        for job_id in ("job_a", "job_b", "job_a", "job_c"):
            celery.send_task(TRANSCRIBE_TASK, args=[job_id], queue="transcribe.q", retry=False)
        celery.send_task("murmur.other", args=["job_b"], queue="transcribe.q", retry=False)
    finally:
        celery.close()
    clean_redis.rpush("transcribe.q", b"not json")

    assert withdraw_messages(clean_redis, "q", ["job_a", "job_b"]) == 3  # both copies of a
    left = clean_redis.lrange("transcribe.q", 0, -1)
    assert len(left) == 3  # job_c, the other task naming job_b, the unreadable one
    assert withdraw_messages(clean_redis, "q", []) == 0
    assert withdraw_messages(clean_redis, "missing", ["job_c"]) == 0


def test_withdraw_reads_a_bounded_tail(clean_redis: redis.Redis) -> None:
    settings = fleet_settings("http://127.0.0.1:9", {}, [L4])
    celery = make_celery(settings)
    try:
        celery.send_task(TRANSCRIBE_TASK, args=["job_old"], queue="transcribe.q", retry=False)
        for i in range(30):
            celery.send_task(TRANSCRIBE_TASK, args=[f"job_{i}"], queue="transcribe.q", retry=False)
        celery.send_task(TRANSCRIBE_TASK, args=["job_new"], queue="transcribe.q", retry=False)
    finally:
        celery.close()
    # The oldest messages sit at the consuming end: found within a short scan; the newest not.
    assert withdraw_messages(clean_redis, "q", ["job_old", "job_new"], scan_limit=10) == 1
    assert _depth(clean_redis, "q") == 31


def test_a_lease_lost_right_after_a_re_route_still_withdraws(make_fleet: MakeFleet) -> None:
    """The run stops at the first check after the re-route; the old message goes anyway."""
    fleet = make_fleet([L4])
    assert fleet.emulator is not None
    client = fleet.svc.redis
    fleet.add_jobs(1)
    fleet.reconcile()
    fleet.reconcile(advance=5)
    (w,) = fleet.workers(WorkerState.BOOTING.value)
    assert _depth(client, "l4-par2") == 1
    with fleet.emulator.lock:
        fleet.emulator._remove(fleet.emulator.servers[w.instance_id or ""])

    fleet.clock.advance(5)
    snapshot = read_snapshot(fleet.svc, fleet.clock(), fleet.clock())
    plan = plan_fleet(snapshot.state)
    requeue_at = next(i for i, a in enumerate(plan.actions) if isinstance(a, Requeue))
    assert requeue_at + 1 < len(plan.actions)  # another action follows it
    checks = 0

    def keep_lock() -> None:
        nonlocal checks
        checks += 1
        if checks > requeue_at + 1:  # the check before the action after the re-route
            raise LeaseLost("lost")

    with pytest.raises(LeaseLost):
        apply_plan(fleet.svc, snapshot, plan, keep_lock)
    assert [j.status for j in fleet.jobs()] == [JobStatus.QUEUED.value]
    assert _depth(client, "l4-par2") == 0
