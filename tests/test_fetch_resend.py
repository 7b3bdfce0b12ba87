"""A URL job whose fetch message was lost is fetched all the same (app/jobs/fetch.py).

The message can be lost with Redis (a Sentinel failover, a broker restart without
persistence); the job row is the record, so the sweep finds the job and sends its fetch again,
once per window, never for a job whose fetch is still running. Two fetches of one job store
its audio once and never fail a job the other already stored. Runs on SQLite and PostgreSQL
with a real Redis broker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from sqlalchemy import update

from app.celery_config import FETCH_AUDIO, IO_QUEUE, SWEEP_FETCHES, celery_config, make_celery
from app.config import Settings
from app.db import Database
from app.jobs import fetch, service
from app.models import Job, JobStatus, utcnow
from app.services import Services, build_services


@pytest.fixture()
def svc(settings: Settings, db: Database, clean_redis: redis.Redis) -> Iterator[Services]:
    services = build_services(settings, make_celery(settings), db=db)
    yield services
    services.celery.close()


def url_job(db: Database, minutes_ago: float, **values: object) -> str:
    """A URL job as submission leaves it (queued, no audio), submitted `minutes_ago`."""
    job_id = f"job_{uuid.uuid4().hex}"
    with db.session() as s:
        s.add(
            Job(
                id=job_id,
                status=JobStatus.QUEUED.value,
                owner="owner",
                source="url",
                source_url="http://127.0.0.1:9/talk.wav",
                created_at=utcnow() - timedelta(minutes=minutes_ago),
            )
        )
    if values:
        with db.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(**values))
    return job_id


def fetches_sent(r: redis.Redis) -> list[str]:
    """The job ids of the fetch messages on the I/O queue (kombu's Redis list)."""
    ids = []
    for raw in r.lrange(IO_QUEUE, 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == FETCH_AUDIO.name:
            ids.append(message["headers"]["argsrepr"].strip("()[],' "))
    return ids


def test_a_lost_fetch_is_sent_again_once_per_window(svc: Services, db: Database) -> None:
    stranded = url_job(db, minutes_ago=30)
    url_job(db, minutes_ago=1)  # its first fetch may still be on the queue: left alone
    url_job(db, minutes_ago=30, audio_key="k.audio")  # fetched already
    url_job(db, minutes_ago=30, status=JobStatus.CANCELLED.value)

    assert fetch.resend_stranded(svc) == 1
    assert fetches_sent(svc.redis) == [stranded]
    # The next sweeps, before the window ends, send nothing more.
    assert fetch.resend_stranded(svc) == 0
    assert fetches_sent(svc.redis) == [stranded]


def test_a_fetch_still_running_is_not_sent_again(svc: Services, db: Database) -> None:
    running = url_job(db, minutes_ago=30)
    svc.redis.set(fetch.ALIVE_KEY + running, 1, ex=60)  # what a fetch in progress leaves
    assert fetch.resend_stranded(svc) == 0
    assert fetches_sent(svc.redis) == []


def test_a_second_fetch_never_fails_a_job_the_first_stored(db: Database) -> None:
    job_id = url_job(db, minutes_ago=30, audio_key="k.audio", status=JobStatus.DISPATCHED.value)
    assert not service.fail_fetch(db, job_id, "url_fetch_failed", "gone", now=utcnow())
    assert service.get_job(db, job_id).status == JobStatus.DISPATCHED.value
    waiting = url_job(db, minutes_ago=2)
    assert service.fail_fetch(db, waiting, "url_fetch_failed", "gone", now=utcnow())
    assert service.get_job(db, waiting).status == JobStatus.FAILED.value


def test_beat_runs_the_fetch_sweep_on_the_io_queue(settings: Settings) -> None:
    entries = celery_config(settings)["beat_schedule"].values()
    (entry,) = [e for e in entries if e["task"] == SWEEP_FETCHES.name]
    assert entry["options"]["queue"] == IO_QUEUE  # never on the reconcile's queue
