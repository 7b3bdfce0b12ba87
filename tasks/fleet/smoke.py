"""`murmur smoke`: one worker per profile, one transcription each, then nothing left to pay for.

Bounded in euros (it refuses to start when every worker running for the whole time limit
would cost more than the cap) and in time (every wait has a deadline). Whatever ends the run
— success, an error, the deadline, Ctrl-C or SIGTERM — every worker it created is deleted
through the fleet's own teardown, the provider is read back to confirm nothing of it is left,
and its unfinished jobs are cancelled. Needs the API running (workers report ready and fetch
the audio through it); a running reconcile may run beside it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import update

from app.broker import redis_client
from app.config import Profile, Settings
from app.db import Database
from app.fleet import readiness
from app.fleet.planner import Action, Delete, FleetPlan, FleetState, Provision
from app.models import Job, JobStatus, Worker, WorkerState, new_id, utcnow
from app.storage import LocalAudioStore
from tasks.celery_app import make_celery
from tasks.dispatch import send_dispatched
from tasks.fleet.apply import Outcome, apply_plan
from tasks.fleet.services import FleetServices
from tasks.fleet.snapshot import Snapshot, as_utc
from tasks.providers import ProviderRegistry
from tasks.providers.base import ProviderError

log = logging.getLogger("murmur.fleet.smoke")

SMOKE_OWNER = "murmur-smoke"
# The lifecycle the smoke test reports, in order: (label, worker/job timestamp).
PHASES = ("created", "booted", "ready", "transcribed", "deleted")
_FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


class SmokeRefused(Exception):
    """The run would not fit its bounds; nothing was created."""


@dataclass
class SmokeResult:
    """What happened to one profile's worker."""

    profile: Profile
    worker_id: str | None = None
    job_id: str | None = None
    problems: list[str] = field(default_factory=list)
    transcript: str | None = None
    # Seconds from the request to each phase of PHASES (None: never reached).
    timings: dict[str, float | None] = field(default_factory=dict)
    cost_eur: float = 0.0
    # What the provider still lists of this worker after teardown (must be empty).
    left: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.left and self.transcript is not None


def worst_case_eur(profiles: list[Profile], seconds: float) -> float:
    return sum(p.hourly_cost_eur for p in profiles) * seconds / 3600


def run_smoke(
    svc: FleetServices,
    profiles: list[Profile],
    audio: Path,
    *,
    timeout: float,
    max_eur: float,
    teardown_timeout: float = 300.0,
    poll: float = 1.0,
    echo: Callable[[str], None] = print,
) -> list[SmokeResult]:
    """Provision, transcribe, tear down; one result per profile. Cleans up on every exit."""
    worst = worst_case_eur(profiles, timeout + teardown_timeout)
    if worst > max_eur:
        raise SmokeRefused(
            f"up to {worst:.2f} EUR ({len(profiles)} worker(s) for {timeout + teardown_timeout:g}"
            f" s) is more than --max-eur {max_eur:.2f}"
        )
    results = [SmokeResult(p) for p in profiles]
    try:
        for result in results:
            _start(svc, result, audio, echo)
        _wait(svc, results, time.monotonic() + timeout, poll)
    finally:
        with _cleanup_shielded(echo):
            _finish(svc, results, time.monotonic() + teardown_timeout, poll, echo)
    return results


# -- steps ------------------------------------------------------------------------------------


def _apply(svc: FleetServices, actions: tuple[Action, ...]) -> Outcome:
    now = svc.clock()
    # Provision and Delete need nothing from a snapshot (only an orphan's deletion would).
    empty = Snapshot(FleetState(now=now, rules=svc.rules(), profiles=()), {})
    plan = FleetPlan(now, actions, (), (), 0.0, 0.0, 0)
    return apply_plan(svc, empty, plan)


def _start(
    svc: FleetServices, result: SmokeResult, audio: Path, echo: Callable[[str], None]
) -> None:
    profile = result.profile
    echo(f"{profile.name}: provisioning one {profile.server_type} in {profile.zone}")
    outcome = _apply(svc, (Provision(profile.name, profile.hourly_cost_eur),))
    if not outcome.provisioned:
        result.problems.append(
            "; ".join(outcome.errors) or f"out of stock ({', '.join(outcome.stocked_out)})"
        )
        return
    result.worker_id = outcome.provisioned[0]
    # Known before the row exists, so an interruption from here on still cancels it.
    result.job_id = new_id("job")
    _submit(svc, profile, audio, result.job_id)


def _submit(svc: FleetServices, profile: Profile, audio: Path, job_id: str) -> None:
    """A job for exactly this profile: stored, then dispatched in one step (never `queued` with
    audio, so a reconcile running beside us cannot route it elsewhere)."""
    key = f"smoke-{uuid.uuid4().hex}"
    store = LocalAudioStore(svc.settings.storage_path)
    with audio.open("rb") as fh:
        store.copy_in(fh, key)
    now = utcnow()
    with svc.db.session() as s:
        job = Job(
            id=job_id,
            owner=SMOKE_OWNER,
            source="upload",
            filename=audio.name,
            status=JobStatus.DISPATCHED.value,
            profile=profile.name,
            audio_key=key,
            size_bytes=store.size(key),
            created_at=now,
            dispatched_at=now,
        )
        s.add(job)
    if not send_dispatched(svc.db, svc.celery, job_id, profile.name):
        raise SmokeRefused(f"{profile.name}: the broker refused the job")


def _wait(svc: FleetServices, results: list[SmokeResult], deadline: float, poll: float) -> None:
    pending = [r for r in results if r.job_id is not None and not r.problems]
    while pending and time.monotonic() < deadline:
        for result in list(pending):
            with svc.db.reader() as s:
                job = s.get(Job, result.job_id)
                worker = s.get(Worker, result.worker_id)
                status = job.status if job is not None else None
                text = ((job.transcript or {}).get("text") if job is not None else None) or ""
                worker_state = worker.state if worker is not None else None
                worker_error = worker.error if worker is not None else None
            if status == JobStatus.SUCCEEDED.value:
                result.transcript = str(text)
            elif status in _FINISHED:
                result.problems.append(f"job {status}")
            elif worker_state in (WorkerState.FAILED.value, WorkerState.DELETING.value):
                result.problems.append(f"worker {worker_state}: {worker_error or 'no reason'}")
            else:
                continue
            pending.remove(result)
        if pending:
            time.sleep(poll)
    for result in pending:
        result.problems.append("time limit reached before the transcript")


def _finish(
    svc: FleetServices,
    results: list[SmokeResult],
    deadline: float,
    poll: float,
    echo: Callable[[str], None],
) -> None:
    for result in results:
        if result.job_id is not None and result.transcript is None:
            _cancel(svc, result.job_id)
    waiting = {r.worker_id: r for r in results if r.worker_id is not None}
    if waiting:
        echo(f"deleting {len(waiting)} worker(s) and checking the provider")
    while waiting:
        try:
            deleted = _apply(svc, tuple(Delete(w, "smoke") for w in waiting)).deleted
        except Exception:  # one bad round must not leave the rest: the loop retries
            log.exception("smoke: teardown round failed")
            deleted = []
        for worker_id in deleted:
            waiting.pop(worker_id, None)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    for result in results:
        if result.worker_id is not None:
            _read_back(svc, result)
            if result.worker_id in waiting:
                result.problems.append("teardown not confirmed within the time limit")


def _cancel(svc: FleetServices, job_id: str) -> None:
    with svc.db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.not_in(_FINISHED))
            .values(
                status=JobStatus.CANCELLED.value,
                finished_at=utcnow(),
                error_code="cancelled",
                error_message="cancelled by murmur smoke",
            )
        )


def _read_back(svc: FleetServices, result: SmokeResult) -> None:
    """Timings, runtime check and cost from the rows; what the provider still has of it."""
    profile = result.profile
    with svc.db.reader() as s:
        worker = s.get(Worker, result.worker_id)
        job = s.get(Job, result.job_id) if result.job_id else None
        if worker is None:
            return
        runtime: dict[str, Any] | None = worker.runtime
        instance_id, resources = worker.instance_id, dict(worker.resources or {})
        start = as_utc(worker.requested_at)
        stamps: dict[str, datetime | None] = {
            "created": worker.created_at,
            "booted": worker.booted_at,
            "ready": worker.ready_at,
            "transcribed": job.finished_at if job is not None and result.transcript else None,
            "deleted": worker.deleted_at,
        }
    assert start is not None
    for name in PHASES:
        moment = as_utc(stamps[name])
        result.timings[name] = None if moment is None else (moment - start).total_seconds()
    end = as_utc(stamps["deleted"]) or utcnow()
    result.cost_eur = profile.hourly_cost_eur * max((end - start).total_seconds(), 0.0) / 3600
    if runtime is not None:
        result.problems += readiness.runtime_mismatches(profile, runtime)
    elif result.transcript is not None:
        result.problems.append("the worker never reported its runtime")
    provider = svc.providers[profile.provider]
    try:
        if instance_id is not None and provider.get(instance_id, resources) is not None:
            result.left.append(f"instance {instance_id}")
        for instance in provider.list_by_tag(frozenset({profile.zone})):
            if instance.worker_id == result.worker_id and instance.instance_id != instance_id:
                result.left.append(f"instance {instance.instance_id}")
    except ProviderError as exc:
        result.left.append(f"unconfirmed: {exc.reason}")


@contextmanager
def _cleanup_shielded(echo: Callable[[str], None]) -> Iterator[None]:
    """A Ctrl-C during cleanup is answered with a note, not obeyed: it would leave servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, frame: object) -> None:
        echo("cleaning up: deleting what the smoke test created (it stops by itself)")

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def render(results: list[SmokeResult]) -> str:
    lines = []
    for r in results:
        verdict = "ok" if r.ok else "FAILED"
        lines.append(f"{r.profile.name}: {verdict} (worker {r.worker_id or '-'})")
        steps = " -> ".join(
            f"{name} {'-' if r.timings.get(name) is None else format(r.timings[name], '.1f') + 's'}"
            for name in PHASES
        )
        lines.append(f"  requested -> {steps}")
        lines.append(f"  cost {r.cost_eur:.4f} EUR")
        if r.transcript is not None:
            lines.append(f"  transcript: {r.transcript.strip()[:120]}")
        lines += [f"  problem: {p}" for p in r.problems]
        lines += [f"  LEFT BEHIND: {item}" for item in r.left]
    return "\n".join(lines)


def process_services(settings: Settings) -> FleetServices:
    """The services of a `murmur smoke` process: this config's database, broker and providers."""
    return FleetServices(
        settings=settings,
        db=Database(settings.database_url),
        redis=redis_client(settings, socket_timeout=10, socket_connect_timeout=5),
        celery=make_celery(settings),
        providers=ProviderRegistry(settings),
    )
