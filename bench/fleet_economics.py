"""What the fleet pays for a scripted day of demand: GPU-seconds, euros above a floor, leaks.

The real reconcile (planner, apply, the `scaleway` provider and its SDK) runs against
tests/fleet/emulator.py on 127.0.0.1, a real Redis and a SQLite file, on a simulated clock
(`svc.clock`) stepped one reconcile interval at a time, and skipped ahead only while nothing
is live (no job unfinished, no worker row undeleted), when a reconcile has nothing to do.

Workers are simulated, at the rows the real ones change: readiness through
`app.fleet.readiness.mark_ready` (what `POST …/ready` calls); a claim pops the job's message
from `transcribe.<profile>` (as the Celery consumer does) and makes the row updates of
`app.jobs.service.claim_job`; a finish makes those of `store_result`; heartbeats set
`last_seen_at`. The simulation writes those columns itself, with the simulated clock, in one
pass over the workers per step (the same choice as tests/fleet/conftest.py's helpers).
A worker is ready `BOOT_SECONDS` after it was requested and transcribes at `SPEED` times
real time; a profile with a broken image never becomes ready: its instance reports the
failed pull (`readiness.report_boot_failure`, what `POST …/boot-failure` calls) PULL_FAILS_AFTER
seconds after the request.

Paid time is what Scaleway bills: from the server's creation to its confirmed deletion. It is
split into busy (a job running), booting (creation → ready) and idle (ready, no job); booting
of a worker that never ran a job is "for nothing". The floor is a fleet with perfect
foresight: each transcribed job processed on the cheapest profile feasible (enabled, in stock,
its image working) when it was submitted, paying processing time only — no boot, no idle.
Excess = paid − floor. The day runs twice: as is, and by an "informed" fleet whose profiles
are disabled exactly while infeasible (stock-out, broken image), the price of finding out
being the difference. Leaks are read back at the end of each: servers, IPs and volumes from
the emulator, and the Redis ACL users of the run's workers.

After each reconcile the bench also records what kept each profile from one more worker (at
max_workers, out of stock, held, disabled, at the budget, or nothing); a transcribed job that
started later than fleet.target_wait_seconds after its submission while some profile had room
is a policy miss, printed as LATE WITH ROOM.

A job of at least 1.5 × `jobs.part_seconds` (the shipped default, 300 s, unless
`--part-seconds`; 0: none) is cut into parts as the API cuts an upload (app/jobs/cuts.py;
simulated audio has no pauses, so the cuts fall on the nominal boundaries), its parts are sent
and scaled for by the real dispatch and planner, and each part is claimed and finished by a
simulated worker at the rows `app.jobs.parts` changes (its span plus the overlap at the
profile's speed); the job succeeds when its last part does. The last episode, one 2-hour file
on an idle fleet, is also run alone with parts (the day's, else 300 s) and without, for the
ratio of its latencies.

Bounded: at most MAX_ROUNDS reconciles per run and MAX_WALL_SECONDS of wall time in all;
exits non-zero if a day did not finish, anything leaked or a job was late with room.
Run: .venv/bin/python bench/fleet_economics.py [--smoke] [--set NAME=VALUE]...
(MURMUR_BENCH_REDIS_URL, default redis://127.0.0.1:6379/13: a database it empties).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import redis  # noqa: E402
from sqlalchemy import select  # noqa: E402

from app.celery_config import make_celery  # noqa: E402
from app.config import JobsSettings  # noqa: E402
from app.db import Base, Database  # noqa: E402
from app.fleet import readiness  # noqa: E402
from app.fleet.broker_users import USER_PREFIX  # noqa: E402
from app.fleet.providers import ProviderRegistry  # noqa: E402
from app.fleet.providers.scaleway import ScalewayProvider  # noqa: E402
from app.fleet.reconcile import reconcile  # noqa: E402
from app.fleet.snapshot import as_utc  # noqa: E402
from app.jobs import parts  # noqa: E402
from app.jobs.cuts import FRAME_SECONDS, OVERLAP_SECONDS, Loudness, plan_spans  # noqa: E402
from app.jobs.dispatch import _job_of  # noqa: E402
from app.jobs.service import cancel_job  # noqa: E402
from app.models import (  # noqa: E402
    LIVE_WORKER_STATES,
    Job,
    JobPart,
    JobStatus,
    PartStatus,
    ProfileState,
    Worker,
    WorkerState,
    new_id,
)
from app.services import build_services  # noqa: E402
from gpu_worker.protocol.boot import BootFailure  # noqa: E402
from gpu_worker.protocol.broker import queue_name  # noqa: E402
from gpu_worker.protocol.readiness import ReadinessRuntime  # noqa: E402
from tests.conftest import FakeClock  # noqa: E402
from tests.fleet.conftest import (  # noqa: E402
    L4,
    P100,
    PROJECT_ID,
    SECRET_KEY,
    fleet_settings,
    runtime_for,
)
from tests.fleet.emulator import Fault, InstanceEmulator  # noqa: E402

REDIS_URL = os.environ.get("MURMUR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
DAY = datetime(2026, 3, 2, 8, 0, tzinfo=FakeClock().now.tzinfo)
END = DAY + timedelta(hours=12)
INTERVAL = 5.0  # fleet.reconcile_interval_seconds
MAX_ROUNDS = 12_000
MAX_WALL_SECONDS = 300.0
HEARTBEAT_SECONDS = 30.0

# Assumed per profile: request → ready, and audio seconds transcribed per second of GPU.
BOOT_SECONDS = {"l4-par2": 120.0, "p100-par1": 150.0}
SPEED = {"l4-par2": 30.0, "p100-par1": 15.0}
# A broken image: its pull fails this long after the request, and the boot path reports it.
PULL_FAILS_AFTER = 60.0
PRICE = {"l4-par2": float(L4["hourly_cost_eur"]), "p100-par1": float(P100["hourly_cost_eur"])}
ORDER = ("l4-par2", "p100-par1")
# Episodes of the day (minutes after 08:00), for the per-episode table: a worker belongs to
# the episode in which it was requested.
EPISODES = (
    ("09:00 burst of 30", 0, 150),
    ("10:30 L4 stock-out, clears 11:00", 150, 300),
    ("13:00 10 jobs, 6 cancelled", 300, 420),
    ("15:00 broken L4 image, fixed 17:00", 420, 545),
    ("17:10 trickle, 1 job / 10 min", 545, 685),
    ("19:30 one 2-hour file, idle fleet", 685, 24 * 60),
)
LONG_FILE_SECONDS = 7200.0
LONG_FILE_MINUTE = 690.0
# Parts for the long file run alone when the day runs without (the value docs/fleet.md
# recommends where long recordings dominate).
LONG_FILE_PARTS = 300.0
# `--smoke` runs the long-file episode on a 30-minute file: the same path (parts on several
# workers, then whole) in a fraction of the wall time, so a loaded machine still finishes it.
SMOKE_LONG_FILE_SECONDS = 1800.0


@dataclass
class Day:
    """The script: what happens at each simulated moment, and what was feasible when."""

    events: list[tuple[datetime, str, Any]] = field(default_factory=list)
    # Windows [start, end) in which a profile could not have served (stock-out, broken image).
    unavailable: list[tuple[str, datetime, datetime]] = field(default_factory=list)
    # A job this long or longer is the day's long file (its latency is reported apart).
    long_file_seconds: float = LONG_FILE_SECONDS

    def at(self, minutes: float, kind: str, arg: Any = None) -> None:
        self.events.append((DAY + timedelta(minutes=minutes), kind, arg))

    def feasible(self, profile: str, when: datetime) -> bool:
        return not any(p == profile and a <= when < b for p, a, b in self.unavailable)


def script(rng: random.Random) -> Day:
    day = Day()

    def burst(minute: float, n: int, lo: float = 60, hi: float = 1800) -> None:
        for i in range(n):
            day.at(minute + i * 0.02, "submit", rng.uniform(lo, hi))

    burst(60, 30)  # 09:00 the morning backlog
    day.at(150, "stockout", "L4-1-24G")  # 10:30 L4 sold out ...
    burst(155, 12)
    day.at(180, "restock", "L4-1-24G")  # ... 11:00 back in stock
    day.unavailable.append(("l4-par2", DAY + timedelta(minutes=150), DAY + timedelta(minutes=180)))
    burst(185, 12)  # 11:05: should go to the L4 again
    burst(300, 10)  # 13:00 ten jobs, six cancelled a minute later (some workers still booting)
    day.at(301, "cancel", 6)
    day.at(420, "break", "l4-par2")  # 15:00 a bad worker image rolled out on the L4 profile
    burst(425, 4)
    day.at(540, "fix", "l4-par2")  # 17:00 fixed
    day.unavailable.append(("l4-par2", DAY + timedelta(minutes=420), DAY + timedelta(minutes=540)))
    for k in range(12):  # 17:10–19:00 a trickle, one job every 10 minutes
        day.at(550 + 10 * k, "submit", rng.uniform(30, 600))
    day.at(LONG_FILE_MINUTE, "submit", LONG_FILE_SECONDS)  # 19:30 a 2-hour recording
    day.events.sort(key=lambda e: e[0])
    return day


def long_file_script(seconds: float = LONG_FILE_SECONDS) -> Day:
    """The last episode alone: one 2-hour file on an idle fleet, after a 10-minute job whose
    run taught the fleet its boot time and speed (the day has taught it by 19:30)."""
    day = Day(long_file_seconds=seconds)
    day.at(1, "submit", 600.0)
    day.at(30, "submit", seconds)
    return day


def smoke_script(rng: random.Random) -> Day:
    """`--smoke`: a tiny day on the same path (boots, claims, a cancel, a stock-out, teardown)."""
    day = Day()
    for i in range(3):
        day.at(1 + i * 0.02, "submit", rng.uniform(60, 300))
    day.at(1.5, "cancel", 1)
    day.at(10, "stockout", "L4-1-24G")
    day.at(10.1, "submit", rng.uniform(60, 300))
    day.at(12, "restock", "L4-1-24G")
    day.unavailable.append(("l4-par2", DAY + timedelta(minutes=10), DAY + timedelta(minutes=12)))
    day.events.sort(key=lambda e: e[0])
    return day


# `--set name=value`: a fleet setting other than the shipped default, to see what it buys.
FLEET_OVERRIDES: dict[str, float] = {}

PROFILE_OF_TYPE = {"L4-1-24G": "l4-par2", "RENDER-S": "p100-par1"}


class Simulation:
    """One run of the day. `informed`: the counterfactual fleet that knows what is feasible
    (a profile is disabled exactly while it is out of stock or its image is broken)."""

    def __init__(
        self,
        tmp: Path,
        emulator: InstanceEmulator,
        *,
        informed: bool = False,
        part_seconds: float | None = None,
    ) -> None:
        self.informed = informed
        self.emulator = emulator
        groups = {
            "workers-par2": {
                "id": emulator.add_security_group("fr-par-2", "m"),
                "zone": "fr-par-2",
            },
            "workers-par1": {
                "id": emulator.add_security_group("fr-par-1", "m"),
                "zone": "fr-par-1",
            },
        }
        settings = fleet_settings(
            emulator.url,
            groups,
            [L4, P100],
            fleet={
                "reconcile_interval_seconds": INTERVAL,
                # The shipped defaults, stated so the figures say what they were measured with.
                "idle_timeout_seconds": 60.0,
                "boot_timeout_seconds": 900.0,
                "backoff_seconds": 60.0,
                "backoff_max_seconds": 900.0,
                "max_failed_boots": 3,
                "max_attempts": 3,
                "target_wait_seconds": 300.0,
                "boot_estimate_margin": 1.5,
                "boot_estimate_floor_seconds": 60.0,
                "idle_floor_seconds": 10.0,
                **FLEET_OVERRIDES,
            },
        ).model_copy(update={"redis_url": REDIS_URL})
        if part_seconds is not None:
            settings = settings.model_copy(update={"jobs": JobsSettings(part_seconds=part_seconds)})
        self.part_seconds = settings.jobs.part_seconds
        self.db = Database(f"sqlite:///{tmp}/economics.db")
        Base.metadata.create_all(self.db.engine)
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.redis.flushdb()
        self.clock = FakeClock(DAY)
        self.celery = make_celery(settings)
        self.svc = build_services(
            settings.model_copy(update={"storage_path": f"{tmp}/audio"}),
            self.celery,
            db=self.db,
            providers=ProviderRegistry(
                settings,
                {"scaleway": ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0)},
            ),
            clock=self.clock,
        )
        self.broken: set[str] = set()
        self.stockouts: dict[str, Fault] = {}
        self.audio: dict[str, float] = {}  # job id -> audio seconds
        self.submitted_at: dict[str, datetime] = {}
        # When a worker stopped a job it did not finish: the step at which it learnt of it.
        self.stopped_at: dict[tuple[str, str], datetime] = {}
        self.rounds = 0
        self.peak: dict[str, int] = {}
        self.accounts: dict[str, float] = {}
        self.left: dict[str, int] = {}
        # After each reconcile: what kept each profile from taking one more worker (None: it
        # had room), to judge the waits past fleet.target_wait_seconds.
        self.bounds: list[tuple[datetime, dict[str, str | None]]] = []
        self.late: list[LateJob] = []

    # -- the script's events ----------------------------------------------------------------

    def submit(self, audio_seconds: float) -> None:
        now = self.clock()
        # Cut as the API cuts an upload; simulated audio has no pauses (a flat level).
        flat = Loudness(FRAME_SECONDS, np.zeros(math.ceil(audio_seconds / FRAME_SECONDS)))
        spans = plan_spans(audio_seconds, flat, self.part_seconds)
        with self.db.session() as s:
            job = Job(
                id=new_id("job"),
                owner="bench",
                source="upload",
                audio_key="x",
                status=JobStatus.QUEUED.value,
                duration_seconds=audio_seconds,
                created_at=now,
            )
            s.add(job)
            if len(spans) > 1:
                s.add_all(parts.new_parts(job.id, spans, JobStatus.QUEUED, now, diarize=False))
            s.flush()
            self.audio[job.id] = audio_seconds
            self.submitted_at[job.id] = now

    def event(self, kind: str, arg: Any) -> None:
        if kind == "submit":
            self.submit(float(arg))
        elif kind == "cancel":
            with self.db.reader() as s:
                newest = list(
                    s.scalars(select(Job.id).order_by(Job.created_at.desc()).limit(int(arg)))
                )
            for job_id in newest:
                cancel_job(self.db, job_id, "bench", now=self.clock())
        elif self.informed:
            name = PROFILE_OF_TYPE.get(arg, arg)
            self.enable(name, kind in ("restock", "fix"))
        elif kind == "stockout":
            self.stockouts[arg] = self.emulator.inject(
                "create", "out_of_stock", commercial_type=arg
            )
        elif kind == "restock":
            with self.emulator.lock:
                self.emulator.faults.remove(self.stockouts.pop(arg))
        elif kind == "break":
            self.broken.add(arg)
        elif kind == "fix":
            self.broken.discard(arg)

    def enable(self, name: str, enabled: bool) -> None:
        settings = self.svc.settings
        profiles = [
            p.model_copy(update={"enabled": enabled}) if p.name == name else p
            for p in settings.profiles
        ]
        self.svc.settings = settings.model_copy(update={"profiles": profiles})

    # -- the simulated workers --------------------------------------------------------------

    def workers_step(self) -> None:
        now = self.clock()
        failed: list[str] = []
        with self.db.session() as s:
            live = list(
                s.scalars(
                    select(Worker).where(
                        Worker.state.in_(
                            [
                                WorkerState.CREATING.value,
                                WorkerState.BOOTING.value,
                                WorkerState.READY.value,
                            ]
                        )
                    )
                )
            )
            for w in live:
                requested = as_utc(w.requested_at)
                assert requested is not None
                if w.state != WorkerState.READY.value:
                    booted = now - requested >= timedelta(seconds=BOOT_SECONDS[w.profile])
                    pulled = now - requested >= timedelta(seconds=PULL_FAILS_AFTER)
                    if w.instance_id and booted and w.profile not in self.broken:
                        profile = self.svc.settings.profile(w.profile)
                        runtime = ReadinessRuntime.model_validate(runtime_for(profile))
                        readiness.mark_ready(s, w, runtime, now)
                        w.last_seen_at = now
                    elif w.instance_id and pulled and w.profile in self.broken:
                        failed.append(w.id)
                    continue
                last = as_utc(w.last_seen_at)
                if last is None or (now - last).total_seconds() >= HEARTBEAT_SECONDS:
                    w.last_seen_at = now
                if w.current_job_id is not None:
                    self._work(s, w, now)
                if w.current_job_id is None:
                    self._claim(s, w, now)
        for worker_id in failed:  # the instance's boot path reports it (POST …/boot-failure)
            failure = BootFailure.of("image_pull", "docker pull exited 1")
            readiness.report_boot_failure(self.db, worker_id, failure, now)

    def _work(self, s: Any, w: Worker, now: datetime) -> None:
        if parts.is_part(str(w.current_job_id)):
            self._work_part(s, w, now)
            return
        job = s.get(Job, w.current_job_id)
        if job is None or job.status != JobStatus.RUNNING.value or job.worker_id != w.id:
            # Cancelled (or taken back): the real worker learns it and stops.
            self.stopped_at[(str(w.current_job_id), w.id)] = now
            w.current_job_id, w.idle_since = None, now
            return
        started = as_utc(job.started_at)
        assert started is not None
        needed = self.audio[job.id] / SPEED[w.profile]
        if (now - started).total_seconds() >= needed:
            done = started + timedelta(seconds=needed)
            job.status, job.finished_at, job.processing_seconds = (
                JobStatus.SUCCEEDED.value,
                done,
                needed,
            )
            w.current_job_id, w.idle_since, w.jobs_done = None, done, (w.jobs_done or 0) + 1
            w.last_seen_at = now

    def _work_part(self, s: Any, w: Worker, now: datetime) -> None:
        """A part runs its span plus the overlap at the profile's speed; the last one done
        succeeds the job (the rows `app.jobs.parts.store_result` and `finish` change)."""
        part = s.get(JobPart, w.current_job_id)
        job = s.get(Job, part.job_id) if part is not None else None
        active = (JobStatus.DISPATCHED.value, JobStatus.RUNNING.value)
        if (
            part is None
            or job is None
            or job.status not in active
            or part.status != PartStatus.RUNNING.value
            or part.worker_id != w.id
        ):
            self.stopped_at[(str(w.current_job_id), w.id)] = now
            w.current_job_id, w.idle_since = None, now
            return
        started = as_utc(part.started_at)
        assert started is not None
        last = part.end_seconds >= (job.duration_seconds or 0.0)
        heard = part.end_seconds - part.start_seconds + (0.0 if last else OVERLAP_SECONDS)
        needed = heard / SPEED[w.profile]
        if (now - started).total_seconds() < needed:
            return
        done = started + timedelta(seconds=needed)
        part.status, part.finished_at, part.processing_seconds = (
            PartStatus.SUCCEEDED.value,
            done,
            needed,
        )
        w.current_job_id, w.idle_since, w.jobs_done = None, done, (w.jobs_done or 0) + 1
        w.last_seen_at = now
        siblings = list(s.scalars(select(JobPart).where(JobPart.job_id == job.id)))
        if all(p.status == PartStatus.SUCCEEDED.value for p in siblings):
            job.status, job.finished_at = JobStatus.SUCCEEDED.value, done
            job.processing_seconds = sum(p.processing_seconds or 0.0 for p in siblings)
        # A part's worker takes its next message the moment it is done, as the real consumer
        # does, not at the next simulated step: a step per part would add up to an interval
        # to each of a long file's parts. (A whole job's next claim waits for the step, as
        # before.)
        self._claim(s, w, now, at=done)
        if w.current_job_id is not None and parts.is_part(str(w.current_job_id)):
            self._work_part(s, w, now)

    def _claim_part(self, s: Any, w: Worker, part_id: str, now: datetime) -> bool:
        """Claim a part (the rows `app.jobs.parts.claim` changes), at `now`."""
        part = s.get(JobPart, part_id)
        job = s.get(Job, part.job_id) if part is not None else None
        active = (JobStatus.DISPATCHED.value, JobStatus.RUNNING.value)
        if part is None or job is None or job.status not in active or job.profile != w.profile:
            return False
        if part.status != PartStatus.DISPATCHED.value:
            return False
        part.status, part.worker_id, part.started_at = PartStatus.RUNNING.value, w.id, now
        part.attempts = (part.attempts or 0) + 1
        if job.status == JobStatus.DISPATCHED.value:
            job.status, job.started_at = JobStatus.RUNNING.value, now
        w.current_job_id, w.idle_since, w.last_seen_at = part.id, None, now
        w.first_job_at = w.first_job_at or now
        return True

    def _claim(self, s: Any, w: Worker, now: datetime, at: datetime | None = None) -> None:
        """Pop one message from the profile's queue (kombu's consuming end) and claim its job
        (at `at`: the moment the worker became free, when that was inside this step)."""
        now = at or now
        for _ in range(50):  # stale messages of re-routed or cancelled jobs are skipped
            raw = self.redis.rpop(queue_name(w.profile))
            if raw is None:
                return
            job_id = _job_of(raw if isinstance(raw, bytes) else str(raw).encode())
            if job_id is not None and parts.is_part(job_id):
                if self._claim_part(s, w, job_id, now):
                    return
                continue
            job = s.get(Job, job_id) if job_id else None
            if job is None or job.status != JobStatus.DISPATCHED.value or job.profile != w.profile:
                continue
            job.status, job.worker_id, job.started_at = JobStatus.RUNNING.value, w.id, now
            job.attempts = (job.attempts or 0) + 1
            w.current_job_id, w.idle_since, w.last_seen_at = job.id, None, now
            w.first_job_at = w.first_job_at or now
            return

    # -- the day ----------------------------------------------------------------------------

    def busy(self) -> bool:
        with self.db.reader() as s:
            unfinished = s.scalars(
                select(Job.id).where(Job.status.not_in(["succeeded", "failed", "cancelled"]))
            ).first()
            # A create refused with nothing created ends FAILED with no instance: not live.
            undeleted = s.scalars(
                select(Worker.id).where(
                    Worker.state != WorkerState.DELETED.value,
                    (Worker.state != WorkerState.FAILED.value) | Worker.instance_id.is_not(None),
                )
            ).first()
        return unfinished is not None or undeleted is not None

    def run(self, day: Day, wall_deadline: float) -> bool:
        events = list(day.events)
        while self.rounds < MAX_ROUNDS and time.monotonic() < wall_deadline:
            now = self.clock()
            while events and events[0][0] <= now:
                _, kind, arg = events.pop(0)
                self.event(kind, arg)
            self.workers_step()
            reconcile(self.svc)
            self.bounds.append((now, self.bound()))
            self.rounds += 1
            for key, value in self.leaks().items():  # so that "0 left" is not vacuous
                self.peak[key] = max(self.peak.get(key, 0), value)
            if not self.busy():
                if not events:
                    return True
                if events[0][0] > now + timedelta(seconds=INTERVAL):
                    self.clock.now = events[0][0]  # nothing is live: skip to the next event
                    continue
            self.clock.advance(INTERVAL)
        return False

    def bound(self) -> dict[str, str | None]:
        """Per profile, the bound it was at after this round's reconcile, or None (room)."""
        now = self.clock()
        settings = self.svc.settings
        with self.db.reader() as s:
            states = {p.name: p for p in s.scalars(select(ProfileState))}
            live = list(s.scalars(select(Worker).where(Worker.state.in_(LIVE_WORKER_STATES))))
        hourly = sum(w.hourly_cost_eur or 0.0 for w in live)
        out: dict[str, str | None] = {}
        for p in settings.profiles:
            st = states.get(p.name)
            if not p.enabled:
                out[p.name] = "disabled"
            elif st is not None and (as_utc(st.backoff_until) or now) > now:
                out[p.name] = "out of stock"
            elif st is not None and (as_utc(st.retry_at) or now) > now:
                out[p.name] = "held"
            elif sum(w.profile == p.name for w in live) >= p.max_workers:
                out[p.name] = "at max_workers"
            elif hourly + float(p.hourly_cost_eur) > settings.budget.max_hourly_eur:
                out[p.name] = "at the budget"
            else:
                out[p.name] = None
        return out

    # -- the accounts -----------------------------------------------------------------------

    def leaks(self) -> dict[str, int]:
        """What is still billed at the emulator, and the broker users of this run's workers."""
        with self.db.reader() as s:
            ours = {USER_PREFIX + w for w in s.scalars(select(Worker.id))}
        users = {u.decode() if isinstance(u, bytes) else str(u) for u in self.redis.acl_users()}
        return {**self.emulator.inventory(), "broker_users": len(users & ours)}


def seconds(a: datetime | None, b: datetime | None) -> float:
    a, b = as_utc(a), as_utc(b)
    return max((b - a).total_seconds(), 0.0) if a is not None and b is not None else 0.0


def accounts(sim: Simulation, day: Day) -> dict[str, float]:
    with sim.db.reader() as s:
        workers = list(s.scalars(select(Worker)))
        jobs = list(s.scalars(select(Job)))
        part_rows = list(s.scalars(select(JobPart)))
    profile_of = {w.id: w.profile for w in workers}
    out = dict.fromkeys(
        ["paid_s", "busy_s", "boot_s", "boot_nothing_s", "idle_s", "paid_eur", "idle_boot_eur"]
        + ["idle_eur", "boot_nothing_eur", "boot_eur", "busy_done_eur", "busy_lost_eur"],
        0.0,
    )
    busy_by_worker: dict[str, float] = {}
    for p in part_rows:
        if p.worker_id and p.started_at is not None:
            done = p.status == PartStatus.SUCCEEDED.value
            end = p.finished_at if done else sim.stopped_at.get((p.id, p.worker_id))
            busy = seconds(p.started_at, end)
            busy_by_worker[p.worker_id] = busy_by_worker.get(p.worker_id, 0.0) + busy
            eur = busy * PRICE[profile_of[p.worker_id]] / 3600
            out["busy_done_eur" if done else "busy_lost_eur"] += eur
    for j in jobs:
        if j.worker_id and j.started_at is not None:
            done = j.status == JobStatus.SUCCEEDED.value
            end = j.finished_at if done else sim.stopped_at.get((j.id, j.worker_id))
            busy = seconds(j.started_at, end)
            busy_by_worker[j.worker_id] = busy_by_worker.get(j.worker_id, 0.0) + busy
            eur = busy * PRICE[profile_of[j.worker_id]] / 3600
            out["busy_done_eur" if done else "busy_lost_eur"] += eur
    for name, _, _ in EPISODES:
        out[f"{name}|paid_eur"] = out[f"{name}|waste_s"] = out[f"{name}|paid_s"] = 0.0
    for w in workers:
        if w.created_at is None:
            continue  # never created at the provider: never billed
        minute = seconds(DAY, w.requested_at) / 60
        episode = next(n for n, a, b in EPISODES if a <= minute < b)
        paid = seconds(w.created_at, w.deleted_at)
        busy = min(busy_by_worker.get(w.id, 0.0), paid)
        boot = min(seconds(w.created_at, w.ready_at or w.deleted_at), paid - busy)
        idle = max(paid - busy - boot, 0.0)
        nothing = boot if w.first_job_at is None else 0.0
        rate = PRICE[w.profile] / 3600
        out["paid_s"] += paid
        out["busy_s"] += busy
        out["boot_s"] += boot - nothing
        out["boot_nothing_s"] += nothing
        out["idle_s"] += idle
        out["paid_eur"] += paid * rate
        out["idle_boot_eur"] += (idle + nothing) * rate
        out["idle_eur"] += idle * rate
        out["boot_nothing_eur"] += nothing * rate
        out["boot_eur"] += (boot - nothing) * rate
        out[f"{episode}|paid_eur"] += paid * rate
        out[f"{episode}|paid_s"] += paid
        out[f"{episode}|waste_s"] += idle + nothing
    done = [j for j in jobs if j.status == JobStatus.SUCCEEDED.value]
    # Wait: submit → the start of the run that finished it; latency: submit → done.
    waits = {j.id: seconds(sim.submitted_at[j.id], j.started_at) for j in done}
    latencies = {j.id: seconds(sim.submitted_at[j.id], j.finished_at) for j in done}
    out["waits"] = list(waits.values())  # type: ignore[assignment]
    long_files = [latencies[j.id] for j in done if sim.audio[j.id] >= day.long_file_seconds]
    out["long_file_latency_s"] = max(long_files, default=0.0)
    out["latencies"] = list(latencies.values())  # type: ignore[assignment]
    for name, a, b in EPISODES:
        mine = [j.id for j in done if a <= seconds(DAY, sim.submitted_at[j.id]) / 60 < b]
        out[f"{name}|waits"] = [waits[i] for i in mine]  # type: ignore[assignment]
        out[f"{name}|latencies"] = [latencies[i] for i in mine]  # type: ignore[assignment]
        out[f"{name}|audio_s"] = sum(sim.audio[i] for i in mine)
    floor = 0.0
    for j in done:
        cheapest = min(
            (p for p in ORDER if day.feasible(p, sim.submitted_at[j.id])), key=lambda p: PRICE[p]
        )
        floor += sim.audio[j.id] / SPEED[cheapest] * PRICE[cheapest] / 3600
    out["audio_s"] = sum(sim.audio[j.id] for j in done)
    out["floor_eur"] = floor
    out["jobs"] = len(jobs)
    out["succeeded"] = len(done)
    out["cancelled"] = sum(j.status == JobStatus.CANCELLED.value for j in jobs)
    out["failed"] = sum(j.status == JobStatus.FAILED.value for j in jobs)
    out["workers"] = sum(w.created_at is not None for w in workers)
    for name in ORDER:
        out[f"workers_{name}"] = sum(
            w.created_at is not None and w.profile == name for w in workers
        )
    return out


@dataclass
class LateJob:
    """A transcribed job that started later than fleet.target_wait_seconds after submission."""

    episode: str
    wait: float
    bounds: dict[str, set[str]]  # per profile, the bounds it was at while the job was late
    room: datetime | None  # the first moment a profile had room meanwhile, or None


def late_jobs(sim: Simulation) -> list[LateJob]:
    """Each job that waited past the target, and whether every profile was then bound: at
    max_workers, out of stock, held, disabled (the informed fleet) or at the budget, at every
    reconcile from its target to its start. The issue's rule: never late but for a bound."""
    target = timedelta(seconds=sim.svc.settings.fleet.target_wait_seconds)
    with sim.db.reader() as s:
        done = list(s.scalars(select(Job).where(Job.status == JobStatus.SUCCEEDED.value)))
    out = []
    for j in done:
        late_from, started = sim.submitted_at[j.id] + target, as_utc(j.started_at)
        if started is None or started <= late_from:
            continue
        minute = seconds(DAY, sim.submitted_at[j.id]) / 60
        late = LateJob(next(n for n, a, b in EPISODES if a <= minute < b), 0.0, {}, None)
        late.wait = seconds(sim.submitted_at[j.id], started)
        for when, bounds in sim.bounds:
            if not late_from <= when < started:
                continue
            for name, why in bounds.items():
                late.bounds.setdefault(name, set()).add(why or "room")
            if late.room is None and any(why is None for why in bounds.values()):
                late.room = when
        out.append(late)
    return out


def percentile(values: Any, q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; 0 for none."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def pair(values: Any) -> str:
    return f"{percentile(values, 50):.0f}/{percentile(values, 95):.0f}"


def per_audio_hour(eur: float, audio_s: float) -> float:
    return eur / (audio_s / 3600) if audio_s else 0.0


def simulate(
    day: Day, *, informed: bool, wall_deadline: float, part_seconds: float | None = None
) -> tuple[Simulation, bool]:
    emulator = InstanceEmulator(secret_key=SECRET_KEY, project_id=PROJECT_ID)
    emulator.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            sim = Simulation(Path(tmp), emulator, informed=informed, part_seconds=part_seconds)
            finished = sim.run(day, wall_deadline)
            sim.accounts = accounts(sim, day)
            sim.late = late_jobs(sim)
            sim.left = sim.leaks()
            sim.celery.close()
            sim.redis.flushdb()
            sim.db.dispose()
    finally:
        emulator.stop()
    return sim, finished


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny day (4 jobs, 20 simulated minutes)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a fleet setting for both runs, e.g. idle_floor_seconds=60 (repeatable)",
    )
    parser.add_argument(
        "--part-seconds",
        type=float,
        default=None,
        help="jobs.part_seconds for both runs (default: the shipped default; 0: no parts)",
    )
    args = parser.parse_args(argv)
    for item in args.set:
        name, _, value = item.partition("=")
        FLEET_OVERRIDES[name] = float(value)
    # The fleet logs every decision (failed boots at ERROR); the table is the output here.
    logging.disable(logging.ERROR)
    wall = time.monotonic()
    day = smoke_script(random.Random(11)) if args.smoke else script(random.Random(11))
    limit = 90.0 if args.smoke else MAX_WALL_SECONDS  # tests/test_benches.py allows 240 s
    long_day = long_file_script(SMOKE_LONG_FILE_SECONDS if args.smoke else LONG_FILE_SECONDS)
    cut = args.part_seconds
    sim, finished = simulate(day, informed=False, wall_deadline=wall + limit, part_seconds=cut)
    informed, finished_b = simulate(
        day, informed=True, wall_deadline=wall + limit, part_seconds=cut
    )
    # The last episode alone, with parts (the day's setting, else LONG_FILE_PARTS) and
    # without: what cutting buys a long file.
    alone, finished_c = simulate(
        long_day,
        informed=False,
        wall_deadline=wall + 2 * limit,
        part_seconds=cut or sim.part_seconds or LONG_FILE_PARTS,
    )
    whole, finished_d = simulate(
        long_day, informed=False, wall_deadline=wall + 2 * limit, part_seconds=0.0
    )
    finished = finished and finished_b and finished_c and finished_d
    a, b = sim.accounts, informed.accounts
    elapsed = time.monotonic() - wall
    print(
        f"fleet economics: a scripted 12 h day, twice ({sim.rounds} + {informed.rounds} "
        f"reconciles every {INTERVAL:g} simulated s), {elapsed:.0f} s wall"
    )
    for label, x in (("this fleet", a), ("informed", b)):
        print(
            f"{label}: jobs {x['jobs']:.0f}: {x['succeeded']:.0f} succeeded, "
            f"{x['cancelled']:.0f} cancelled, {x['failed']:.0f} failed; workers created "
            f"{x['workers']:.0f} (" + ", ".join(f"{p} {x['workers_' + p]:.0f}" for p in ORDER) + ")"
        )

    def per_audio(x: dict[str, float]) -> float:
        return x["paid_s"] / x["audio_s"] if x["audio_s"] else 0.0

    rows = [
        ("audio transcribed", "audio_s", "s"),
        ("GPU time paid", "paid_s", "s"),
        ("  busy (a job running)", "busy_s", "s"),
        ("  booting, then worked", "boot_s", "s"),
        ("  booting for nothing", "boot_nothing_s", "s"),
        ("  idle (ready, no job)", "idle_s", "s"),
        ("GPU-s paid per audio-s", per_audio, "ratio"),
        ("GPU-s idle or booting for nothing", lambda x: x["idle_s"] + x["boot_nothing_s"], "s"),
        ("euros paid", "paid_eur", "EUR"),
        ("floor (cheapest feasible, busy only)", "floor_eur", "EUR"),
        ("euros above the floor", lambda x: x["paid_eur"] - x["floor_eur"], "EUR"),
        ("  idle", "idle_eur", "EUR"),
        ("  booting for nothing", "boot_nothing_eur", "EUR"),
        ("  booting, then worked", "boot_eur", "EUR"),
        ("  work on jobs not transcribed", "busy_lost_eur", "EUR"),
        (
            "  costlier profile than the floor's",
            lambda x: x["busy_done_eur"] - x["floor_eur"],
            "EUR",
        ),
    ]
    print(f"{'':<40} {'this fleet':>12} {'informed':>12}")
    for name, key, unit in rows:
        va, vb = (key(x) if callable(key) else x[key] for x in (a, b))
        print(f"{name:<40} {va:>12.3f} {vb:>12.3f} {unit}")
    print(
        f"euros above the informed fleet: {a['paid_eur'] - b['paid_eur']:.3f} EUR "
        f"(paid {a['paid_eur']:.3f} / {b['paid_eur']:.3f})"
    )
    print()
    print(
        f"{'by episode (workers requested in it)':<40} {'GPU-s paid':>12}"
        f" {'idle/nothing':>12} {'EUR':>8} {'informed':>8} {'EUR/audio-h':>11}"
        f" {'wait p50/p95 s':>15} {'latency p50/p95 s':>18} {'informed wait p95':>18}"
    )
    for name, _, _ in EPISODES:
        print(
            f"{name:<40} {a[name + '|paid_s']:>12.0f} {a[name + '|waste_s']:>12.0f}"
            f" {a[name + '|paid_eur']:>8.3f} {b[name + '|paid_eur']:>8.3f}"
            f" {per_audio_hour(a[name + '|paid_eur'], a[name + '|audio_s']):>11.3f}"
            f" {pair(a[name + '|waits']):>15} {pair(a[name + '|latencies']):>18}"
            f" {percentile(b[name + '|waits'], 95):>18.0f}"
        )
    for label, x in (("this fleet", a), ("informed", b)):
        print(
            f"{label}: wait p50/p95 {pair(x['waits'])} s (max {max(x['waits'], default=0):.0f}),"
            f" latency p50/p95 {pair(x['latencies'])} s,"
            f" {per_audio_hour(x['paid_eur'], x['audio_s']):.3f} EUR per audio-hour"
        )
    for label, run in (("this fleet", sim), ("informed", informed)):
        print(
            f"{label}: most at once "
            + ", ".join(f"{k} {v}" for k, v in run.peak.items())
            + "; left at the end "
            + ", ".join(f"{k} {v}" for k, v in run.left.items())
        )
    target = sim.svc.settings.fleet.target_wait_seconds
    unbound = 0
    for label, run in (("this fleet", sim), ("informed", informed)):
        late = run.late
        missed = [j for j in late if j.room is not None]
        unbound += len(missed) if run is sim else 0
        seen = sorted({f"{p} {why}" for j in late for p, ws in j.bounds.items() for why in ws})
        print(
            f"{label}: {len(late)} job(s) waited past the {target:g} s target"
            + (
                f" (longest {max(j.wait for j in late):.0f} s, in "
                + ", ".join(sorted({j.episode for j in late}))
                + f"); meanwhile: {'; '.join(seen)}"
                if late
                else ""
            )
        )
        for j in missed:
            print(
                f"  LATE WITH ROOM: {j.episode}, waited {j.wait:.0f} s; a profile had room at"
                f" {j.room:%H:%M:%S}"
            )
    print(f"target: target_wait_s={target:g} late_jobs={len(sim.late)} late_with_room={unbound}")
    in_parts, in_one = alone.accounts, whole.accounts
    ratio = (
        in_parts["long_file_latency_s"] / in_one["long_file_latency_s"]
        if in_one["long_file_latency_s"]
        else 0.0
    )
    print(
        f"one {long_day.long_file_seconds / 3600:g}-hour file on an idle fleet, alone: latency "
        f"{in_parts['long_file_latency_s']:.0f} s in parts of {alone.part_seconds:g} s on "
        f"{in_parts['workers']:.0f} worker(s), {in_one['long_file_latency_s']:.0f} s whole on "
        f"{in_one['workers']:.0f} (ratio {ratio:.2f}); GPU-s paid {in_parts['paid_s']:.0f} "
        f"against {in_one['paid_s']:.0f}"
    )
    ok = finished and not any(sim.left.values()) and not any(informed.left.values())
    ok = ok and not any(alone.left.values()) and not any(whole.left.values())
    ok = ok and unbound == 0
    print(
        f"economics: paid_eur={a['paid_eur']:.3f} informed_eur={b['paid_eur']:.3f}"
        f" floor_eur={a['floor_eur']:.3f} gpu_s_per_audio_s={per_audio(a):.3f}"
        f" eur_per_audio_hour={per_audio_hour(a['paid_eur'], a['audio_s']):.3f}"
        f" p95_wait_s={percentile(a['waits'], 95):.0f}"
        f" informed_p95_wait_s={percentile(b['waits'], 95):.0f}"
        f" p95_latency_s={percentile(a['latencies'], 95):.0f}"
        f" long_file_latency_s={a['long_file_latency_s']:.0f}"
        f" long_file_alone_ratio={ratio:.2f}"
        f" part_seconds={sim.part_seconds:g}"
        f" leaked={sum(sim.left.values()) + sum(informed.left.values())}"
    )
    if not finished:
        print(f"DID NOT FINISH within {MAX_ROUNDS} reconciles / {limit:g} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
