"""Readiness: the runtime a worker reports against its profile, and what accept/reject record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.config import LOCAL_CPU_PROFILE, Profile
from app.db import Database
from app.fleet import readiness
from app.fleet.smoke import _runtime_problems
from app.models import Worker, WorkerState
from gpu_worker.protocol.readiness import ReadinessRuntime
from tests.fleet.conftest import L4, P100, runtime_for

L4_PROFILE = Profile.model_validate(L4)
P100_PROFILE = Profile.model_validate(P100)
NOW = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def reported(profile: Profile, /, **override: Any) -> ReadinessRuntime:
    """The runtime as the endpoint hands it on: the wire body, parsed by the protocol's model."""
    return ReadinessRuntime.model_validate(runtime_for(profile, **override))


def mismatches(profile: Profile, /, **override: Any) -> list[str]:
    return readiness.runtime_mismatches(profile, reported(profile, **override))


@pytest.mark.parametrize("profile", [L4_PROFILE, P100_PROFILE, LOCAL_CPU_PROFILE])
def test_a_matching_runtime_is_accepted(profile: Profile) -> None:
    assert mismatches(profile) == []


MISMATCHES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "model",
        {"model": "base.en"},
        ["model: worker runs 'base.en', profile l4-par2 requires 'tiny.en'"],
    ),
    (
        "compute type",
        {"compute_type": "int8"},
        ["compute_type: worker runs 'int8', profile l4-par2 requires 'float16'"],
    ),
    (
        "vad",
        {"vad": "silero"},
        ["vad: worker runs 'silero', profile l4-par2 requires 'pyannote'"],
    ),
    (
        "alignment",
        {"alignment_device": "cpu"},
        ["alignment_device: worker runs 'cpu', profile l4-par2 requires 'cuda'"],
    ),
    (
        "batch size",
        {"batch_size": 8},
        ["batch_size: worker runs 8, profile l4-par2 requires 16"],
    ),
    (
        # A newer worker's compute type or VAD parses (no closed set on the wire) and is named.
        "unknown compute type",
        {"compute_type": "int4"},
        ["compute_type: worker runs 'int4', profile l4-par2 requires 'float16'"],
    ),
    (
        "unknown vad",
        {"vad": "webrtc"},
        ["vad: worker runs 'webrtc', profile l4-par2 requires 'pyannote'"],
    ),
    (
        "unknown device",
        {"device": "rocm"},
        ["device: worker runs on 'rocm', profile l4-par2 runs on a GPU (cuda)"],
    ),
    (
        "missing field",
        {"vad": None},
        ["vad: not reported (profile l4-par2 requires 'pyannote')"],
    ),
    (
        "other profile",
        {"profile": "p100-par1"},
        ["profile: worker runs 'p100-par1', expected 'l4-par2'"],
    ),
    (
        "no GPU",
        {"device": "cpu"},
        ["device: worker runs on 'cpu', profile l4-par2 runs on a GPU (cuda)"],
    ),
    (
        "float16 on a P100 (list)",
        {"cuda_capability": [6, 0]},
        ["compute_type: float16 needs CUDA capability >= 7.0; the worker's GPU has 6.0"],
    ),
    (
        "float16 on a P100 (text)",
        {"cuda_capability": "6.0"},
        ["compute_type: float16 needs CUDA capability >= 7.0; the worker's GPU has 6.0"],
    ),
    (
        "float16 on a P100 (mapping)",
        {"cuda_capability": {"major": 6, "minor": 1}},
        ["compute_type: float16 needs CUDA capability >= 7.0; the worker's GPU has 6.1"],
    ),
    (
        "capability not reported",
        {"cuda_capability": None},
        ["cuda_capability: not reported; profile l4-par2 needs a GPU that can run float16"],
    ),
]


@pytest.mark.parametrize(
    ("override", "expected"), [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES]
)
def test_each_mismatch_is_named(override: dict[str, Any], expected: list[str]) -> None:
    assert mismatches(L4_PROFILE, **override) == expected


def test_float32_on_a_p100_is_fine_and_float16_newer_gpu_too() -> None:
    assert mismatches(P100_PROFILE) == []
    assert mismatches(L4_PROFILE, cuda_capability=[9, 0]) == []


@pytest.mark.parametrize(
    ("compute_type", "capability", "need"),
    [
        ("int8", [6, 0], "CUDA capability >= 7.0 or exactly 6.1"),
        ("bfloat16", [7, 5], "CUDA capability >= 8.0"),
    ],
)
def test_the_capability_a_compute_type_needs_is_named_by_the_protocols_rule(
    compute_type: str, capability: list[int], need: str
) -> None:
    profile = L4_PROFILE.model_copy(update={"compute_type": compute_type})

    assert mismatches(profile, cuda_capability=capability) == [
        f"compute_type: {compute_type} needs {need}; "
        f"the worker's GPU has {capability[0]}.{capability[1]}"
    ]
    assert mismatches(profile, cuda_capability=[6, 1] if compute_type == "int8" else [8, 0]) == []


def _worker(db: Database, state: str = WorkerState.BOOTING.value) -> str:
    with db.session() as s:
        w = Worker(
            profile="l4-par2",
            provider="scaleway",
            instance_id="i-1",
            state=state,
            requested_at=NOW - timedelta(minutes=3),
            created_at=NOW - timedelta(minutes=2),
        )
        s.add(w)
        s.flush()
        return w.id


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_mark_ready_records_the_runtime_once(db: Database) -> None:
    wid = _worker(db)
    # Fields this control plane does not know are kept: the row holds what the worker sent.
    sent = runtime_for(L4_PROFILE, gpu_driver={"version": "570.1"}, model_load_seconds=2.5)
    runtime = ReadinessRuntime.model_validate(sent)
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        readiness.mark_ready(s, row, runtime, NOW)
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        readiness.mark_ready(s, row, runtime, NOW + timedelta(seconds=30))  # a repeated report
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        assert row.state == WorkerState.READY.value
        assert row.runtime == sent
        assert row.ready_at is not None and row.ready_at.replace(tzinfo=UTC) == NOW
        assert row.idle_since is not None and row.idle_since.replace(tzinfo=UTC) == NOW
        assert row.last_seen_at is not None
        assert row.last_seen_at.replace(tzinfo=UTC) == NOW + timedelta(seconds=30)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_mark_ready_leaves_a_worker_being_deleted_alone(db: Database) -> None:
    wid = _worker(db, WorkerState.DELETING.value)
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        readiness.mark_ready(s, row, reported(L4_PROFILE), NOW)
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None and row.state == WorkerState.DELETING.value and row.ready_at is None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_reject_fails_the_worker_with_its_reasons(db: Database) -> None:
    wid = _worker(db)
    problems = ["vad: worker runs 'silero', profile l4-par2 requires 'pyannote'"]
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        readiness.reject(s, row, problems, NOW)
    with db.session() as s:
        row = s.get(Worker, wid)
        assert row is not None
        assert row.state == WorkerState.FAILED.value
        assert row.error == "runtime rejected: " + problems[0]
        assert row.delete_reason == "runtime rejected" and row.ready_at is None


def test_smoke_reads_a_stored_runtime_through_the_model() -> None:
    # app/fleet/smoke.py checks the row after the run: the same comparison as the endpoint's,
    # and a row that no longer parses is a problem it reports, not a crash.
    assert _runtime_problems(L4_PROFILE, runtime_for(L4_PROFILE)) == []
    assert _runtime_problems(L4_PROFILE, runtime_for(L4_PROFILE, vad="silero")) == [
        "vad: worker runs 'silero', profile l4-par2 requires 'pyannote'"
    ]
    (problem,) = _runtime_problems(L4_PROFILE, runtime_for(L4_PROFILE, batch_size="16"))
    assert problem.startswith("the worker's stored runtime does not parse")
