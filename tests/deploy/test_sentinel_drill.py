"""Sentinel failover drill: Murmur scaled past one host, and the Redis primary lost mid-stream.

One primary, one replica and three Sentinels (tests/deploy/redis_ha.py); two API processes
(the production gunicorn command) and two control workers (prefork, as in compose) sharing
one PostgreSQL database and the Sentinels; one beat; the GPU worker the local provider starts
on the local-cpu profile. A client submits a steady stream of jobs to both APIs; the primary
is killed with SIGKILL; Sentinel promotes the replica. Every job must end `succeeded`, its
result accepted exactly once, and the drill prints how long submissions failed or waited
(docs/reliability.md, "Sentinel failover drill", records the figures).

The GPU worker logs in with its own broker user (`fleet.worker_broker_users`, as cloud
workers do). ACL users are not replicated: the promoted replica has none until a reconcile
re-creates them (app/fleet/broker_users.py), so the jobs after the failover run only
because it did; the drill also checks that every live worker's user is on the new primary.

The control workers and beat run under a restart-on-exit loop, as compose's
`restart: unless-stopped` runs them; the drill reports every restart it had to make.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests
from sqlalchemy import select

from app.config import load_settings
from app.db import Database
from app.fleet import broker_users
from app.models import LIVE_WORKER_STATES, Job, Worker
from app.server import gunicorn_args
from tests.conftest import (
    ADMIN_TOKEN,
    API_TOKEN,
    FIXTURES,
    SIGNING_KEY,
    WEBHOOK_SECRET,
    Proc,
    auth,
    free_port,
    start_process,
    wait_for,
)
from tests.deploy.redis_ha import RedisHA, needs_redis_server, redis_ha, sentinel_env

pytestmark = [pytest.mark.slow, needs_redis_server]

SPEECH = FIXTURES / "speech-short.wav"
# Bounds: submissions stop after this many seconds or jobs, whichever comes first.
SUBMIT_SECONDS = 24.0
MAX_JOBS = 30
SUBMIT_EVERY = 1.0
KILL_AFTER = 8.0
RETRY_GIVE_UP = 40.0
FINISH_WITHIN = 420.0
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Supervised:
    """A process restarted when it exits, like a compose service with a restart policy."""

    name: str
    args: list[str]
    env: dict[str, str]
    directory: Path
    proc: Proc | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        log = self.directory / f"{self.name}.{self.starts}.log"
        self.proc = start_process(self.args, self.env, log)

    def check(self) -> None:
        assert self.proc is not None
        code = self.proc.popen.poll()
        if code is not None and self.starts < 5:
            self.exits.append(code)
            self.start()

    def output(self) -> str:
        return "".join(
            (self.directory / f"{self.name}.{n}.log").read_text(errors="replace")
            for n in range(1, self.starts + 1)
        )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(30)


@dataclass
class Submission:
    api: str
    started: float
    finished: float = 0.0
    job_id: str | None = None
    failures: list[str] = field(default_factory=list)
    first_failure: float | None = None


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tasks", *args]


def _submit(url: str, sub: Submission, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        try:
            with SPEECH.open("rb") as fh:
                answer = requests.post(
                    f"{url}/v1/jobs", headers=auth(), files={"file": fh}, timeout=30
                )
            body = answer.json()
            if answer.status_code == 202:
                sub.job_id = str(body["id"])
            elif isinstance(body.get("error"), dict) and body["error"].get("job_id"):
                sub.job_id = str(body["error"]["job_id"])  # kept: the API will dispatch it
            if sub.job_id is not None:
                sub.finished = time.monotonic()
                if answer.status_code != 202:
                    sub.failures.append(f"{answer.status_code} kept")
                return
            sub.failures.append(f"{answer.status_code} {body.get('error', {}).get('code')}")
        except (requests.RequestException, ValueError) as exc:
            sub.failures.append(type(exc).__name__)
        if sub.first_failure is None:
            sub.first_failure = time.monotonic()
        time.sleep(0.25)
    sub.finished = time.monotonic()


def _result_posts(log: str) -> Counter[str]:
    """Accepted result callbacks per job, from gunicorn's access log."""
    pattern = re.compile(
        r'"POST /internal/workers/[^/]+/[^/]+/jobs/([^/]+)/result HTTP/[\d.]+" 200'
    )
    return Counter(pattern.findall(log))


@pytest.fixture()
def ha(tmp_path: Path) -> Iterator[RedisHA]:
    with redis_ha(tmp_path / "redis") as running:
        yield running


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_every_job_succeeds_once_through_a_primary_failover(
    ha: RedisHA, database_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "murmur.toml"
    config.write_text(
        "[fleet]\nreconcile_interval_seconds = 1.0\nidle_timeout_seconds = 600.0\n"
        "worker_broker_users = true\n"
    )
    ports = [free_port(), free_port()]
    base_env = {
        **os.environ,
        "MURMUR_CONFIG": str(config),
        "MURMUR_DATABASE_URL": database_url,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_LOCAL_STATE_DIR": str(tmp_path / "instances"),
        "MURMUR_API_TOKEN": API_TOKEN,
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MURMUR_ADMIN_TOKEN": ADMIN_TOKEN,
        # Workers call back to the first API host; clients use both.
        "MURMUR_PUBLIC_URL": f"http://127.0.0.1:{ports[0]}",
        **sentinel_env(ha),
    }
    apis: list[Proc] = []
    supervised: list[Supervised] = []
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    db = Database(database_url)
    try:
        for n, port in enumerate(ports):
            env = {**base_env, "MURMUR_HOST": "127.0.0.1", "MURMUR_PORT": str(port)}
            args = gunicorn_args(load_settings(env=env), workers=1, threads=4)
            apis.append(
                start_process(
                    [sys.executable, "-m", "gunicorn", *args], env, tmp_path / f"api{n}.log"
                )
            )
        for n in (1, 2):
            args = _celery("worker", "-Q", "control", "--concurrency", "2", "-n", f"control{n}@%h")
            supervised.append(Supervised(f"control{n}", [*args, "-l", "INFO"], base_env, tmp_path))
        beat_args = _celery("beat", "--schedule", str(tmp_path / "beat-schedule"), "-l", "INFO")
        supervised.append(Supervised("beat", beat_args, base_env, tmp_path))
        for proc in supervised:
            proc.start()

        def apis_ready() -> bool:
            for api in apis:
                assert api.popen.poll() is None, api.output()
            try:
                return all(requests.get(f"{u}/readyz", timeout=2).ok for u in urls)
            except requests.RequestException:
                return False

        wait_for(apis_ready, 60, "both API hosts to be ready", step=0.3)
        for proc in supervised[:2]:
            wait_for(lambda p=proc: "ready." in p.output(), 90, f"{proc.name} to start", step=0.3)

        stop = threading.Event()

        def supervise() -> None:
            while not stop.is_set():
                for proc in supervised:
                    proc.check()
                stop.wait(0.5)

        watcher = threading.Thread(target=supervise, daemon=True)
        watcher.start()

        # A steady stream to both hosts; the primary dies a few seconds in.
        subs: list[Submission] = []
        threads: list[threading.Thread] = []
        began = time.monotonic()
        killed_at: float | None = None
        promoted_at: float | None = None
        while time.monotonic() - began < SUBMIT_SECONDS and len(subs) < MAX_JOBS:
            if killed_at is None and time.monotonic() - began >= KILL_AFTER:
                old = ha.primary_port()
                ha.kill("primary")
                killed_at = time.monotonic()
            if killed_at is not None and promoted_at is None:
                now_primary = ha.primary_port()
                if now_primary not in (None, ha.ports["primary"]):
                    promoted_at = time.monotonic()
            sub = Submission(urls[len(subs) % 2], time.monotonic())
            thread = threading.Thread(
                target=_submit, args=(sub.api, sub, sub.started + RETRY_GIVE_UP), daemon=True
            )
            thread.start()
            subs.append(sub)
            threads.append(thread)
            time.sleep(SUBMIT_EVERY)
        for thread in threads:
            thread.join(RETRY_GIVE_UP + 35)
        assert killed_at is not None and old == ha.ports["primary"]
        if promoted_at is None:
            wait_for(
                lambda: ha.primary_port() not in (None, ha.ports["primary"]), 60, "the failover"
            )
            promoted_at = time.monotonic()

        lost = [s for s in subs if s.job_id is None]
        assert not lost, [(s.api, s.failures) for s in lost]
        ids = {s.job_id for s in subs}

        def all_finished() -> bool:
            with db.session() as s:
                statuses = s.execute(select(Job.status)).scalars().all()
            return len(statuses) >= len(ids) and all(st in TERMINAL for st in statuses)

        wait_for(all_finished, FINISH_WITHIN, "every job to finish", step=1.0)
        stop.set()
        watcher.join(5)
        with db.session() as s:
            jobs = {j.id: (j.status, j.attempts) for j in s.execute(select(Job)).scalars()}

        results = _result_posts("".join(api.output() for api in apis))
        failed = [s for s in subs if s.failures]
        waits = sorted(s.finished - s.started for s in subs)
        report = {
            "jobs": len(jobs),
            "submissions_with_failures": len(failed),
            "failed_attempts": sum(len(s.failures) for s in subs),
            "failure_kinds": dict(Counter(f for s in subs for f in s.failures)),
            "longest_failing_window_s": round(
                max(
                    (s.finished - s.first_failure for s in failed if s.first_failure),
                    default=0.0,
                ),
                2,
            ),
            "longest_submission_s": round(waits[-1], 2),
            "median_submission_s": round(waits[len(waits) // 2], 2),
            "promotion_seen_after_kill_s": round(promoted_at - killed_at, 2),
            "attempts": dict(Counter(a for _, a in jobs.values())),
            "restarts": {p.name: p.exits for p in supervised if p.exits},
            "unrecoverable_errors": {
                p.name: p.output().count("Unrecoverable error") for p in supervised
            },
        }
        print(f"\nSentinel failover drill: {report}")

        _assert_worker_users_on(ha, db, "".join(p.output() for p in supervised[:2]))
        assert set(jobs) == ids  # a retried submission never stored a second job
        assert {status for status, _ in jobs.values()} == {"succeeded"}, jobs
        assert all(results[job_id] == 1 for job_id in ids), results
    finally:
        for proc in supervised:
            proc.stop()
        for api in apis:
            api.stop()
        _delete_local_workers(base_env)
        db.dispose()


def _assert_worker_users_on(ha: RedisHA, db: Database, control_logs: str) -> None:
    """Every live worker has its user on the promoted primary, re-created by a reconcile."""
    port = ha.primary_port()
    assert port is not None and port != ha.ports["primary"]
    with db.session() as s:
        live = list(
            s.scalars(
                select(Worker.id).where(
                    Worker.deleted_at.is_(None), Worker.state.in_(LIVE_WORKER_STATES)
                )
            )
        )
    assert live
    primary = redis.Redis(port=port, socket_timeout=5)
    try:
        users = {u.decode() if isinstance(u, bytes) else str(u) for u in primary.acl_users()}  # type: ignore[union-attr]
    finally:
        primary.close()
    assert {broker_users.user_name(w, 0) for w in live} <= users, (live, users)
    assert "broker user (the broker had lost it" in control_logs


def _delete_local_workers(env: dict[str, str]) -> None:
    from app.fleet.providers.local import LocalProvider

    settings = load_settings(env=env)
    provider = LocalProvider(settings, state_dir=env["MURMUR_LOCAL_STATE_DIR"], term_grace=5)
    for instance in provider.list_by_tag(frozenset()):
        provider.delete(instance.instance_id, instance.resources)
