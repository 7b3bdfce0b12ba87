"""Webhooks are delivered from the database's state: a broker that was down or lost its data
delays a webhook, never loses it; each attempt is sent once; a receiver that always fails ends
`failed` after the retry window (issue 10, finding 4)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from app import create_app
from app.celery_config import celery_config, make_celery
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.jobs import service, webhooks
from app.jobs.delivery import attempt_webhook, deliver_due
from app.jobs.io_slots import IoSlots, SlotsBusy
from app.models import Job, WorkerState, utcnow
from app.services import utc_clock
from tasks.celery_app import celery_app
from tasks.jobs import sweep_webhooks
from tests.conftest import (
    FIXTURES,
    SIGNING_KEY,
    LiveApi,
    add_worker,
    auth,
    start_process,
    wait_for,
)


class Receiver:
    """A webhook receiver on loopback: answers `statuses` in turn, then 204; records each POST."""

    def __init__(self, statuses: list[int] | None = None, always: int | None = None) -> None:
        self.statuses = list(statuses or [])
        self.always = always
        self.posts: list[bytes] = []
        self.delivered: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append(body)
                status = receiver.always or (receiver.statuses.pop(0) if receiver.statuses else 204)
                if status < 300:
                    receiver.delivered.append(body)
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def loopback_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"api": settings.api.model_copy(update={"allow_private_urls": True})}
    )


@pytest.fixture()
def slots(settings: Settings, clean_redis: redis.Redis) -> IoSlots:
    return IoSlots(clean_redis, settings.io)


def finished_job(db: Database, hook: str) -> str:
    """A job that ended (failed, here) with a webhook whose announce never happened."""
    job, _ = service.insert_job(
        db, service.JobRequest(owner="owner", source="upload", webhook_url=hook), now=utc_clock()
    )
    assert service.fail_job(
        db, job.id, "url_fetch_failed", "the URL answered HTTP 404", now=utc_clock()
    )
    return job.id


def row(db: Database, job_id: str) -> Job:
    with db.reader() as s:
        job = s.get(Job, job_id)
    assert job is not None
    return job


class Clock:
    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


def test_an_attempt_is_claimed_once_and_a_dead_deliverers_is_taken_over(db: Database) -> None:
    job_id = finished_job(db, "http://127.0.0.1:9/hook")
    now = utcnow()
    assert webhooks.due_webhooks(db, now, 10) == [job_id]
    assert webhooks.claim_attempt(db, job_id, now) == 1
    assert webhooks.claim_attempt(db, job_id, now) is None  # a second sweep, a redelivery
    assert webhooks.due_webhooks(db, now, 10) == []
    # The deliverer died mid-attempt: once its lease ends the attempt is made again...
    later = now + webhooks.LEASE + timedelta(seconds=1)
    assert webhooks.claim_attempt(db, job_id, later) == 2
    # ...and the first one, should it come back, cannot settle over the second.
    assert webhooks.settle_attempt(db, job_id, 1, True, later) is None
    settled = webhooks.settle_attempt(db, job_id, 2, True, later)
    assert settled == webhooks.Settled("delivered", None)
    assert webhooks.claim_attempt(db, job_id, later + timedelta(days=1)) is None


def test_a_receiver_that_always_fails_ends_failed(
    db: Database, loopback_settings: Settings, slots: IoSlots
) -> None:
    receiver = Receiver(always=500)
    try:
        job_id = finished_job(db, receiver.url)
        clock = Clock()
        for _ in range(webhooks.MAX_ATTEMPTS + 3):  # bounded: a few sweeps past the window
            deliver_due(loopback_settings, db, clock, slots)
            clock.now += timedelta(minutes=2)  # past any back-off
    finally:
        receiver.close()
    job = row(db, job_id)
    assert job.webhook_status == "failed"
    assert job.webhook_attempts == webhooks.MAX_ATTEMPTS
    assert len(receiver.posts) == webhooks.MAX_ATTEMPTS
    assert receiver.delivered == []


def test_a_failed_attempt_waits_for_its_back_off(
    db: Database, loopback_settings: Settings, slots: IoSlots
) -> None:
    receiver = Receiver(statuses=[503])
    try:
        job_id = finished_job(db, receiver.url)
        clock = Clock()
        assert deliver_due(loopback_settings, db, clock, slots) == 1
        assert row(db, job_id).webhook_status == "retrying"
        clock.now += webhooks.backoff(1) - timedelta(seconds=1)
        assert deliver_due(loopback_settings, db, clock, slots) == 0  # not yet
        clock.now += timedelta(seconds=1)
        assert deliver_due(loopback_settings, db, clock, slots) == 1
        clock.now += timedelta(minutes=5)
        assert deliver_due(loopback_settings, db, clock, slots) == 0  # delivered: never again
    finally:
        receiver.close()
    assert len(receiver.posts) == 2 and len(receiver.delivered) == 1
    assert row(db, job_id).webhook_status == "delivered"


def test_the_beat_runs_the_webhook_sweep(settings: Settings) -> None:
    schedule = celery_config(settings)["beat_schedule"]
    sweeps = [e for e in schedule.values() if e["task"] == "murmur.control.sweep_webhooks"]
    assert len(sweeps) == 1
    assert sweeps[0]["schedule"] <= settings.fleet.reconcile_interval_seconds
    assert sweeps[0]["options"]["queue"] == "io"  # beside fetches, never before the reconcile
    assert celery_app.tasks["murmur.control.sweep_webhooks"].name == sweep_webhooks.name


def _worker_call(app_client: Any, worker: Any, path: str, body: dict[str, Any]) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return app_client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    hook = Receiver(statuses=[503])  # the first attempt fails: its retry must survive Redis
    yield hook
    hook.close()


@pytest.mark.slow
def test_a_webhook_announced_while_the_broker_was_down_arrives_exactly_once(
    live_api: LiveApi, io_worker: Any, receiver: Receiver, tmp_path: Path
) -> None:
    worker = add_worker(live_api.db, state=WorkerState.READY)
    response = requests.post(
        f"{live_api.url}/v1/jobs",
        headers=auth(),
        files={"file": ("a.wav", (FIXTURES / "speech-short.wav").read_bytes())},
        data={"webhook_url": receiver.url},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    # The job finishes on an API process that cannot reach Redis: no announce, no task.
    dead = live_api.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    cut_off = create_app(dead, db=live_api.db, celery=make_celery(dead)).test_client()
    assert _worker_call(cut_off, worker, f"/jobs/{job_id}/claim", {}).status_code == 200
    result = {"transcript": {"text": "hello", "segments": []}, "processing_seconds": 1.0}
    stored = _worker_call(cut_off, worker, f"/jobs/{job_id}/result", result)
    assert stored.get_json() == {"stored": True}
    time.sleep(1.0)
    assert receiver.posts == []
    assert row(live_api.db, job_id).webhook_status == "pending"

    # The broker is back, and so is beat: its sweep finds the webhook in the database.
    broker = redis.Redis.from_url(live_api.settings.redis_url)
    beat = start_process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "beat",
            "--schedule",
            str(tmp_path / "beat-schedule"),
            "--loglevel",
            "INFO",
        ],
        live_api.env,
        tmp_path / "beat.log",
    )
    interval = live_api.settings.fleet.reconcile_interval_seconds
    try:
        wait_for(lambda: len(receiver.posts) == 1, 6 * interval, "the sweep's first attempt")
        wait_for(
            lambda: row(live_api.db, job_id).webhook_status == "retrying",
            10,
            "the failed attempt to be recorded",
        )
        broker.flushdb()  # Redis loses its data: anything queued for the retry is gone
        wait_for(lambda: receiver.delivered, 12 * interval, "the retry, from the sweep")
        time.sleep(3 * interval)  # later sweeps find nothing due
    finally:
        beat.stop()
    assert "murmur.control.sweep_webhooks" in beat.output()
    assert len(receiver.delivered) == 1
    assert len(receiver.posts) == 2
    job = row(live_api.db, job_id)
    assert job.webhook_status == "delivered"
    assert job.webhook_attempts == 2
    assert job_id.encode() in receiver.delivered[0]


def test_a_webhook_past_its_deadline_is_failed_not_left_to_the_sweep(
    db: Database, loopback_settings: Settings, slots: IoSlots, caplog: Any
) -> None:
    """Issue 32 §5: a webhook whose token's receivers hold every webhook slot waited, its task
    then logged "the sweep takes it over", and the sweep skipped it for as long as the slots
    stayed busy: it never ended. Past its delivery deadline it now ends `failed`, saying so."""
    receiver = Receiver()  # would accept it: nothing may be sent past the deadline
    try:
        job_id = finished_job(db, receiver.url)
        clock = Clock()
        with ExitStack() as held:
            for _ in range(loopback_settings.io.webhooks_per_token):  # every slot of the token
                held.enter_context(slots.held(slots.webhooks, "owner"))
            with pytest.raises(SlotsBusy):  # within the deadline: it waits, no attempt counted
                attempt_webhook(loopback_settings, db, job_id, clock, slots)
            assert deliver_due(loopback_settings, db, clock, slots) == 0
            assert row(db, job_id).webhook_status == "pending"
            clock.now += webhooks.DELIVERY_DEADLINE + timedelta(seconds=1)
            with caplog.at_level(logging.WARNING, logger="app.jobs.delivery"):
                settled = attempt_webhook(loopback_settings, db, job_id, clock, slots)
        assert settled == webhooks.Settled("failed", None)
        # Failed once: the sweep finds nothing due, even with the slots free again.
        assert deliver_due(loopback_settings, db, clock, slots) == 0
    finally:
        receiver.close()
    job = row(db, job_id)
    assert (job.webhook_status, job.webhook_attempts, job.webhook_next_at) == ("failed", 0, None)
    assert receiver.posts == []
    seconds = int(webhooks.DELIVERY_DEADLINE.total_seconds())
    assert [r.getMessage() for r in caplog.records] == [
        f"webhook for {job_id} gave up after 0 tries "
        f"(not delivered within {seconds} s of the job's end: its deadline)"
    ]


def test_the_sweep_fails_a_webhook_past_its_deadline_but_not_under_an_attempt(
    db: Database, loopback_settings: Settings, slots: IoSlots
) -> None:
    receiver = Receiver(statuses=[503, 503])
    try:
        job_id, sending = finished_job(db, receiver.url), finished_job(db, receiver.url)
        clock = Clock()
        assert deliver_due(loopback_settings, db, clock, slots) == 2  # one failed attempt each
        clock.now += webhooks.DELIVERY_DEADLINE
        # A deliverer holds the lease of an attempt of the second: it is not failed under it,
        # and the attempt's outcome is what is recorded.
        assert webhooks.claim_attempt(db, sending, clock.now) == 2
        assert not webhooks.expire(db, sending, clock.now)
        assert deliver_due(loopback_settings, db, clock, slots) == 1
        assert webhooks.settle_attempt(db, sending, 2, True, clock.now) is not None
    finally:
        receiver.close()
    job = row(db, job_id)
    assert (job.webhook_status, job.webhook_attempts) == ("failed", 1)
    assert row(db, sending).webhook_status == "delivered"
    assert len(receiver.posts) == 2
