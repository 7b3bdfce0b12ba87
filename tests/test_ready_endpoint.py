"""POST /internal/workers/W/I/ready: the readiness report through the protocol's model.

A runtime that differs from the profile, or does not parse (a wrong type), is
`409 runtime_mismatch` with the reasons, and the worker is failed; one we would not store (a
NUL, nesting past 4 levels) or not an object is `400 invalid_body`; a body over the limit is
`413 payload_too_large`; in both of those the worker is left as it was. What is stored is
what the worker sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from app.db import Database
from app.inputs import MAX_JSON_BYTES
from app.models import Worker, WorkerState
from gpu_worker.hardware import DeviceFacts, check_hardware
from gpu_worker.manifest import VerifiedAsset
from gpu_worker.preflight import Preflight
from gpu_worker.runtime import load_runtime_profile
from tests.conftest import add_worker
from tests.test_api_input import error_of
from tests.test_worker_endpoints import call


def runtime_of(settings: Settings, **override: Any) -> dict[str, Any]:
    """The runtime a correct worker of the local-cpu profile sends."""
    profile = settings.profile("local-cpu")
    runtime: dict[str, Any] = {
        "profile": profile.name,
        "model": profile.model,
        "device": "cpu",
        "compute_type": profile.compute_type,
        "vad": profile.vad,
        "alignment_device": profile.alignment_device,
        "batch_size": profile.batch_size,
        "gpu_name": None,
        "cuda_capability": None,
        "versions": {"faster_whisper": "1.2.1"},
        "model_load_seconds": 0.5,
    }
    return {**runtime, **override}


def stored(db: Database, worker: Worker) -> Worker:
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None
        return row


def test_a_matching_runtime_is_stored_as_sent(
    client: Any, db: Database, settings: Settings
) -> None:
    worker = add_worker(db)
    # A newer worker's field is kept, within the storable limits.
    sent = runtime_of(settings, gpu_driver={"version": "570.1"})
    response = call(client, worker, "/ready", {"runtime": sent})
    assert response.status_code == 200 and response.get_json() == {"accepted": True}
    row = stored(db, worker)
    assert row.state == WorkerState.READY.value and row.runtime == sent


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"compute_type": "int4"}, "compute_type: worker runs 'int4'"),
        ({"vad": "webrtc"}, "vad: worker runs 'webrtc'"),
        ({"batch_size": 3}, "batch_size: worker runs 3"),
        ({"model": None}, "model: not reported"),
        ({"device": "cuda"}, "device: worker runs on 'cuda'"),
    ],
    ids=["unknown compute type", "unknown vad", "batch size", "missing model", "device"],
)
def test_a_runtime_the_profile_refuses_is_409_with_its_reason(
    client: Any, db: Database, settings: Settings, override: dict[str, Any], reason: str
) -> None:
    worker = add_worker(db)
    response = call(client, worker, "/ready", {"runtime": runtime_of(settings, **override)})
    assert reason in error_of(response, 409, "runtime_mismatch")
    row = stored(db, worker)
    assert row.state == WorkerState.FAILED.value and reason in (row.error or "")


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"batch_size": "8"}, "batch_size: worker sent '8'"),
        ({"batch_size": True}, "batch_size: worker sent True"),
        ({"model": 1}, "model: worker sent 1"),
        ({"cuda_capability": "eight"}, "cuda_capability: worker sent 'eight'"),
        ({"model_load_seconds": -1}, "model_load_seconds: worker sent -1"),
        ({"versions": {"ctranslate2": 4}}, "versions.ctranslate2: worker sent 4"),
    ],
    ids=[
        "batch size as text",
        "batch size as a bool",
        "model as a number",
        "unreadable capability",
        "negative load time",
        "version as a number",
    ],
)
def test_a_runtime_of_the_wrong_type_is_refused_and_fails_the_worker(
    client: Any, db: Database, settings: Settings, override: dict[str, Any], reason: str
) -> None:
    """As any mismatch: 409 naming the field and what was sent, the worker failed with it."""
    worker = add_worker(db)
    response = call(client, worker, "/ready", {"runtime": runtime_of(settings, **override)})
    assert reason in error_of(response, 409, "runtime_mismatch")
    row = stored(db, worker)
    assert row.state == WorkerState.FAILED.value and reason in (row.error or "")
    assert row.runtime is None


@pytest.mark.parametrize(
    "override",
    [{"note": "nul\x00byte"}, {"nested": {"a": {"b": {"c": {"d": 1}}}}}],
    ids=["NUL in an unknown field", "five levels deep"],
)
def test_a_runtime_we_would_not_store_is_400_and_changes_nothing(
    client: Any, db: Database, settings: Settings, override: dict[str, Any]
) -> None:
    worker = add_worker(db)
    response = call(client, worker, "/ready", {"runtime": runtime_of(settings, **override)})
    assert error_of(response, 400, "invalid_body").startswith("runtime")
    row = stored(db, worker)
    assert row.state == WorkerState.BOOTING.value and row.runtime is None


def test_a_runtime_that_is_not_an_object_is_400(client: Any, db: Database) -> None:
    worker = add_worker(db)
    for body in ({"runtime": ["model"]}, {"runtime": "tiny.en"}, {}):
        error_of(call(client, worker, "/ready", body), 400, "invalid_body")


def test_an_oversize_runtime_is_413_and_changes_nothing(
    client: Any, db: Database, settings: Settings
) -> None:
    worker = add_worker(db)
    huge = runtime_of(settings, notes=["x" * 1000] * (MAX_JSON_BYTES // 1000))
    error_of(call(client, worker, "/ready", {"runtime": huge}), 413, "payload_too_large")
    assert stored(db, worker).state == WorkerState.BOOTING.value


def test_the_workers_own_report_is_accepted_and_stored_as_built(
    client: Any, db: Database, settings: Settings, tmp_path: Path
) -> None:
    profile = settings.profile("local-cpu")
    env = {
        "MURMUR_PROFILE": profile.name,
        "MURMUR_MODEL": profile.model,
        "MURMUR_DEVICE": "cpu",
        "MURMUR_COMPUTE_TYPE": profile.compute_type,
        "MURMUR_VAD": profile.vad,
        "MURMUR_ALIGNMENT_DEVICE": profile.alignment_device,
        "MURMUR_BATCH_SIZE": str(profile.batch_size),
    }
    runtime_profile = load_runtime_profile(
        env, model_names=(profile.model,), require_identity=False
    )
    built = Preflight(
        profile=runtime_profile,
        backend="faster-whisper",
        model=VerifiedAsset(profile.model, tmp_path / "model", 1000),
        vad=VerifiedAsset("silero-vad", tmp_path / "vad", 10),
        alignment=None,
        hardware=check_hardware(
            runtime_profile, DeviceFacts(cuda_device_count=0), model_gpu_memory_mb=None
        ),
    ).runtime(model_load_seconds=0.75, image_pull_seconds=12.5)

    worker = add_worker(db)
    response = call(client, worker, "/ready", {"runtime": built.to_json()})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert stored(db, worker).runtime == built.to_json()
