"""`murmur smoke`: one worker per profile, one transcription each, then nothing left to pay for.

Bounded in euros (it refuses to start when every worker running for the whole time limit
would cost more than the cap) and in time (every wait has a deadline). Whatever ends the run
— success, an error, the deadline, Ctrl-C or SIGTERM — every worker it created is deleted
through the fleet's own teardown, the provider is read back to confirm nothing of it is left,
and its unfinished jobs are cancelled. Each worker's id is chosen before its provisioning
starts, so an interrupted or timed-out create is still found: the provider is swept by that
id's tag, for a while after a failed create (an abandoned request may still complete), and
whatever it lists is deleted and reported. Needs the API running (workers report ready and
fetch the audio through it); a running reconcile may run beside it, and may give a smoke
worker a user's job: that worker is then left to the fleet (retired when idle), never killed
mid-job, and the result says so.
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

from pydantic import ValidationError
from sqlalchemy import or_

from app.celery_config import make_celery
from app.config import Profile, Settings
from app.fleet import readiness
from app.fleet.apply import Outcome, apply_plan
from app.fleet.catalog import billed_seconds
from app.fleet.planner import Action, Delete, FleetPlan, FleetState, Provision
from app.fleet.providers.base import ProviderError
from app.fleet.rules import fleet_rules
from app.fleet.snapshot import Snapshot, as_utc
from app.jobs.dispatch import send_dispatched
from app.models import LIVE_WORKER_STATES, Job, JobStatus, Worker, WorkerState, new_id
from app.services import Services, build_services
from app.transitions import move_job, move_worker
from gpu_worker.protocol.failure import CANCELLED
from gpu_worker.protocol.readiness import ReadinessRuntime

log = logging.getLogger("murmur.fleet.smoke")

SMOKE_OWNER = "murmur-smoke"
# The lifecycle the smoke test reports, in order: (label, worker/job timestamp).
PHASES = ("created", "booted", "ready", "transcribed", "deleted")
_FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


class SmokeRefused(Exception):
    """The run would not fit its bounds; nothing was created."""


class SmokeInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the run; the clean-up ran, and `results` say what it left."""

    def __init__(self, results: list[SmokeResult]) -> None:
        super().__init__()
        self.results = results


@dataclass
class SmokeResult:
    """What happened to one profile's worker."""

    profile: Profile
    worker_id: str | None = None
    # The provider confirmed the create; until then a late server may still appear.
    provisioned: bool = False
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
    """Every worker running for `seconds`, billed in its server type's increments."""
    return sum(p.hourly_cost_eur * billed_seconds(p.server_type, seconds) for p in profiles) / 3600


def run_smoke(
    svc: Services,
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
    except KeyboardInterrupt:
        with _cleanup_shielded(echo):
            _finish(svc, results, time.monotonic() + teardown_timeout, poll, echo)
        raise SmokeInterrupted(results) from None
    except BaseException:
        with _cleanup_shielded(echo):
            _finish(svc, results, time.monotonic() + teardown_timeout, poll, echo)
        raise
    with _cleanup_shielded(echo):
        _finish(svc, results, time.monotonic() + teardown_timeout, poll, echo)
    return results


# -- steps ------------------------------------------------------------------------------------


def _apply(svc: Services, actions: tuple[Action, ...]) -> Outcome:
    now = svc.clock()
    # Provision and Delete need nothing from a snapshot (only an orphan's deletion would).
    empty = Snapshot(FleetState(now=now, rules=fleet_rules(svc.settings), profiles=()), {})
    plan = FleetPlan(now, actions, (), (), 0.0, 0.0, 0)
    return apply_plan(svc, empty, plan)


def _start(svc: Services, result: SmokeResult, audio: Path, echo: Callable[[str], None]) -> None:
    profile = result.profile
    echo(f"{profile.name}: provisioning one {profile.server_type} in {profile.zone}")
    # Known before anything exists: an interruption from here on still finds the worker.
    result.worker_id = new_id("wrk")
    outcome = _apply(svc, (Provision(profile.name, profile.hourly_cost_eur, result.worker_id),))
    if not outcome.provisioned:
        result.problems.append(
            "; ".join(outcome.errors) or f"out of stock ({', '.join(outcome.stocked_out)})"
        )
        return
    result.provisioned = True
    # Known before the row exists, so an interruption from here on still cancels it.
    result.job_id = new_id("job")
    _submit(svc, profile, audio, result.job_id)


def _submit(svc: Services, profile: Profile, audio: Path, job_id: str) -> None:
    """A job for exactly this profile: stored, then dispatched in one step (never `queued` with
    audio, so a reconcile running beside us cannot route it elsewhere)."""
    key = f"smoke-{uuid.uuid4().hex}"
    with audio.open("rb") as fh:
        svc.storage.copy_in(fh, key)
    now = svc.clock()
    with svc.db.session() as s:
        job = Job(
            id=job_id,
            owner=SMOKE_OWNER,
            source="upload",
            filename=audio.name,
            status=JobStatus.DISPATCHED.value,
            profile=profile.name,
            audio_key=key,
            size_bytes=svc.storage.size(key),
            created_at=now,
            dispatched_at=now,
        )
        s.add(job)
    if not send_dispatched(svc.db, svc.celery, job_id, profile.name):
        raise SmokeRefused(f"{profile.name}: the broker refused the job")


def _wait(svc: Services, results: list[SmokeResult], deadline: float, poll: float) -> None:
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
    svc: Services,
    results: list[SmokeResult],
    deadline: float,
    poll: float,
    echo: Callable[[str], None],
) -> None:
    for result in results:
        if result.job_id is not None and result.transcript is None:
            _cancel(svc, result.job_id)
    mine = {r.worker_id: r for r in results if r.worker_id is not None}
    if mine:
        echo(f"deleting {len(mine)} worker(s) and checking the provider")
    waiting = dict(mine)
    busy: dict[str, str] = {}  # worker -> the user's job a reconcile gave it
    while waiting:
        claimed = []
        for worker_id, result in list(waiting.items()):
            if _gone(svc, worker_id):
                waiting.pop(worker_id)
                continue
            other = _claim_teardown(svc, worker_id, result.job_id)
            if other is None:
                busy.pop(worker_id, None)
                claimed.append(worker_id)
            else:
                busy[worker_id] = other
        try:
            deleted = _apply(svc, tuple(Delete(w, "smoke") for w in claimed)).deleted
        except Exception:  # one bad round must not leave the rest: the loop retries
            log.exception("smoke: teardown round failed")
            deleted = []
        for worker_id in deleted:
            waiting.pop(worker_id, None)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    kept = {w for w in busy if w in waiting}  # the fleet's now: never swept from under a job
    _sweep(svc, [r for r in results if r.worker_id not in kept], deadline, poll)
    for result in results:
        if result.worker_id is not None:
            _read_back(svc, result)
            if result.worker_id in kept:
                result.problems.append(
                    f"worker kept: it runs job {busy[result.worker_id]} a reconcile gave it;"
                    " the fleet deletes it when idle"
                )
            elif result.worker_id in waiting:
                result.problems.append("teardown not confirmed within the time limit")


def _gone(svc: Services, worker_id: str) -> bool:
    with svc.db.reader() as s:
        row = s.get(Worker, worker_id)
        return row is None or row.deleted_at is not None


def _claim_teardown(svc: Services, worker_id: str, own_job: str | None) -> str | None:
    """Start deleting the worker unless it runs a job that is not the smoke's; that job's id.

    One compare-and-set: a worker in `deleting` claims nothing more, so no user's job can land
    on it between the check and the teardown."""
    with svc.db.session() as s:
        free = or_(Worker.current_job_id.is_(None), Worker.current_job_id == own_job)
        move_worker(
            s,
            worker_id,
            LIVE_WORKER_STATES,
            WorkerState.DELETING,
            free,
            delete_reason="smoke",
            delete_requested_at=svc.clock(),
        )
        row = s.get(Worker, worker_id)
        if row is not None and row.state in LIVE_WORKER_STATES:  # still live: it holds a job
            return row.current_job_id
    return None  # deleting now (or failed, or gone): the teardown goes on


def _sweep(svc: Services, results: list[SmokeResult], deadline: float, poll: float) -> None:
    """Delete whatever the provider lists under this run's worker tags and its rows do not
    account for: a create abandoned by a timeout or an interruption may still complete on the
    provider's side, so after one the sweep goes on for twice the provider timeout."""
    ours = [r for r in results if r.worker_id is not None]
    known: dict[str, str | None] = {}
    with svc.db.reader() as s:
        for r in ours:
            row = s.get(Worker, r.worker_id)
            known[str(r.worker_id)] = row.instance_id if row is not None else None
    settle = 0.0
    if any(not r.provisioned for r in ours):
        settle = time.monotonic() + 2 * svc.settings.fleet.provider_timeout_seconds
    while ours:
        found = False
        for result in ours:
            provider = svc.providers[result.profile.provider]
            try:
                listed = provider.list_by_tag(frozenset({result.profile.zone}))
            except ProviderError as exc:
                log.warning("smoke: cannot list %s: %s", result.profile.zone, exc.reason)
                found = True
                continue
            for instance in listed:
                if instance.worker_id != result.worker_id:
                    continue
                found = True
                note = f"deleted instance {instance.instance_id}, created after provisioning failed"
                late = instance.instance_id != known[str(result.worker_id)]
                if late and note not in result.problems:
                    result.problems.append(note)
                try:
                    provider.delete(instance.instance_id, instance.resources)
                except ProviderError as exc:
                    log.warning("smoke: deleting %s: %s", instance.instance_id, exc.reason)
        now = time.monotonic()
        if now >= deadline or (not found and now >= settle):
            break
        time.sleep(poll)


def _cancel(svc: Services, job_id: str) -> None:
    with svc.db.session() as s:
        move_job(
            s,
            job_id,
            [status for status in JobStatus if not status.finished],
            JobStatus.CANCELLED,
            finished_at=svc.clock(),
            error_code=CANCELLED,
            error_message="cancelled by murmur smoke",
        )


def _runtime_problems(profile: Profile, stored: dict[str, Any]) -> list[str]:
    """The stored runtime against the profile; a row that no longer parses says so."""
    try:
        runtime = ReadinessRuntime.model_validate(stored)
    except ValidationError as exc:
        return [f"the worker's stored runtime does not parse: {exc.errors()[0]['msg']}"]
    return readiness.runtime_mismatches(profile, runtime)


def _read_back(svc: Services, result: SmokeResult) -> None:
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
    end = as_utc(stamps["deleted"]) or svc.clock()
    if stamps["created"] is not None:  # no server, no bill
        # From the request (an upper bound: billing starts at power-on), in whole increments.
        seconds = max((end - start).total_seconds(), 1e-9)
        result.cost_eur = (
            profile.hourly_cost_eur * billed_seconds(profile.server_type, seconds) / 3600
        )
    if runtime is not None:
        result.problems += _runtime_problems(profile, runtime)
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


def process_services(settings: Settings) -> Services:
    """The services of a `murmur smoke` process: this config's database, broker and providers."""
    return build_services(settings, make_celery(settings), redis_timeout=10)
