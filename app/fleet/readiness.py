"""Readiness: compare the runtime a worker reports with its profile, then accept or reject it.

`report_ready` is the decision on one report. `read_runtime` and `runtime_mismatches` are
pure; `mark_ready` and `reject` only change the worker row inside the caller's session. A
runtime that does not parse is rejected like one that differs. A rejected worker is left
FAILED with the reasons in `error`; the next reconcile counts it as a failed boot of its
profile (app.fleet.planner.Death.RUNTIME_REJECTED), deletes its instance and records why.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, update

from app.config import Profile, Settings
from app.db import Database
from app.errors import Refused
from app.fleet.catalog import server_device
from app.fleet.planner import Death
from app.models import ProfileState, Worker, WorkerState
from app.transitions import move_worker
from gpu_worker.protocol.boot import MAX_BOOT_DETAIL, BootFailure
from gpu_worker.protocol.readiness import ReadinessRuntime
from gpu_worker.protocol.redaction import clean_log_line
from gpu_worker.protocol.runtime import capability_requirement, supported_compute_types

# The runtime fields that must equal the profile's (docs/worker-protocol.md, "Runtime").
COMPARED_FIELDS = ("model", "compute_type", "vad", "alignment_device", "batch_size")
_READYABLE = (WorkerState.REQUESTED.value, WorkerState.CREATING.value, WorkerState.BOOTING.value)


def read_runtime(reported: Mapping[str, Any]) -> ReadinessRuntime | list[str]:
    """The reported runtime through the protocol's model, or why it does not parse: one
    reason per field, naming the field and what was sent (a wrong type is a runtime this
    control plane cannot accept, answered as any other mismatch)."""
    try:
        return ReadinessRuntime.model_validate(dict(reported))
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "runtime"
            sent = repr(error.get("input"))
            sent = sent if len(sent) <= 60 else sent[:57] + "..."
            problems.append(f"{where}: worker sent {sent}: {error['msg']}")
        return problems


def runtime_mismatches(profile: Profile, runtime: ReadinessRuntime) -> list[str]:
    """Every way the reported runtime differs from what the profile requires (empty = ready).

    The body already parsed (gpu_worker/protocol/readiness.py), so every value has its type;
    a value this side does not know (a newer compute type) is simply not the profile's.
    """
    problems: list[str] = []
    for name in COMPARED_FIELDS:
        expected = getattr(profile, name)
        got = getattr(runtime, name)
        if got is None:
            problems.append(f"{name}: not reported (profile {profile.name} requires {expected!r})")
        elif got != expected:
            problems.append(
                f"{name}: worker runs {got!r}, profile {profile.name} requires {expected!r}"
            )
    if runtime.diarization != profile.diarization:
        # Routing sends diarize jobs by the profile's setting: the worker must have loaded
        # exactly those weights, and a worker that diarizes unasked would run unpinned work.
        problems.append(
            f"diarization: worker loaded {runtime.diarization or 'none'}, profile "
            f"{profile.name} requires {profile.diarization or 'none'}"
        )
    if runtime.profile is not None and runtime.profile != profile.name:
        problems.append(f"profile: worker runs {runtime.profile!r}, expected {profile.name!r}")

    expected_device = server_device(profile.server_type)
    device = runtime.device
    if device is not None and device != expected_device:
        problems.append(
            f"device: worker runs on {device!r}, profile {profile.name} runs on "
            f"{'a GPU (cuda)' if expected_device == 'cuda' else 'the CPU'}"
        )
    if expected_device == "cuda":
        capability = runtime.cuda_capability
        if capability is None:
            problems.append(
                f"cuda_capability: not reported; profile {profile.name} needs a GPU "
                f"that can run {profile.compute_type}"
            )
        elif profile.compute_type not in supported_compute_types(capability):
            need = capability_requirement(profile.compute_type) or "a newer GPU"
            problems.append(
                f"compute_type: {profile.compute_type} needs {need}; "
                f"the worker's GPU has {capability[0]}.{capability[1]}"
            )
    return problems


def mark_ready(session: Any, worker: Worker, runtime: ReadinessRuntime, now: datetime) -> None:
    """Accept the worker: READY, consuming its queue from now on, idle until its first claim.

    The row keeps the runtime as the worker sent it (`to_json()`: its fields, unknown ones too).

    Idempotent: a worker that repeats its report keeps its first `ready_at`. A worker that is
    already draining or being deleted is left alone.
    """
    worker.runtime = runtime.to_json()
    worker.last_seen_at = now
    if worker.state in _READYABLE:
        move_worker(session, worker.id, _READYABLE, WorkerState.READY, error=None)
    if worker.state != WorkerState.READY.value:
        return
    if worker.ready_at is None:
        worker.ready_at = now
        # Its profile boots: the count of failed boots in a row (app/fleet/apply.py) restarts.
        session.execute(
            update(ProfileState)
            .where(ProfileState.name == worker.profile, ProfileState.consecutive_failed_boots > 0)
            .values(consecutive_failed_boots=0)
        )
    # The provider may not have been polled since it came up; a worker that answers has booted.
    if worker.booted_at is None:
        worker.booted_at = now
    if worker.current_job_id is None and worker.idle_since is None:
        worker.idle_since = now
    session.add(worker)


def reject(session: Any, worker: Worker, problems: list[str], now: datetime) -> None:
    """Refuse the worker: FAILED with the reasons; the next reconcile deletes its instance.

    A worker already draining or being deleted stays so; its refusal is still the answer."""
    worker.last_seen_at = now
    move_worker(
        session,
        worker.id,
        (*_READYABLE, WorkerState.READY.value),
        WorkerState.FAILED,
        error=Death.RUNTIME_REJECTED.because("; ".join(problems)),
        delete_reason=Death.RUNTIME_REJECTED.value,
        delete_requested_at=func.coalesce(Worker.delete_requested_at, now),
    )


def report_boot_failure(db: Database, worker_id: str, failure: BootFailure, now: datetime) -> bool:
    """Take the instance's word that its worker cannot come up (gpu_worker/protocol/boot.py):
    FAILED with the stage and detail (redacted again), and the next reconcile counts it as a
    confirmed failed boot, which holds its profile at once (Death.BOOT_FAILED). True when acted
    on; a worker already ready, failed or retired is left alone (the unit reports every stop).
    """
    detail = clean_log_line(failure.detail)[:MAX_BOOT_DETAIL]
    said = f"{failure.stage}" + (f" ({detail})" if detail else "")
    with db.session() as s:
        return move_worker(
            s,
            worker_id,
            _READYABLE,
            WorkerState.FAILED,
            error=Death.BOOT_FAILED.because(said),
            delete_reason=Death.BOOT_FAILED.value,
            delete_requested_at=func.coalesce(Worker.delete_requested_at, now),
            last_seen_at=now,
        )


def report_ready(
    db: Database, settings: Settings, worker_id: str, reported: Mapping[str, Any], now: datetime
) -> None:
    """Take a worker's readiness report: READY when its runtime is its profile's, else FAILED
    with every difference and refused `runtime_mismatch` (the row is stored first)."""
    with db.session() as s:
        row = s.get(Worker, worker_id)
        assert row is not None  # the caller authenticated it
        try:
            profile = settings.profile(row.profile)
        except KeyError:
            # Nothing to compare with: the row is left to the reconcile (its profile is gone).
            raise Refused(
                "runtime_mismatch", "the worker's profile is no longer configured"
            ) from None
        runtime = read_runtime(reported)
        problems = runtime if isinstance(runtime, list) else runtime_mismatches(profile, runtime)
        if isinstance(runtime, list) or problems:
            reject(s, row, problems, now)
        else:
            mark_ready(s, row, runtime, now)
    if problems:
        raise Refused("runtime_mismatch", "; ".join(problems))
