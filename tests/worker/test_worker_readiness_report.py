"""The readiness report as the worker builds it and the protocol's model reads it.

The control plane's side of the same body (status codes, what is stored) is in
tests/test_ready_endpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.inputs import json_problem
from gpu_worker.hardware import DeviceFacts, check_hardware
from gpu_worker.manifest import VerifiedAsset
from gpu_worker.preflight import Preflight
from gpu_worker.protocol.readiness import ReadinessRuntime
from gpu_worker.runtime import load_runtime_profile

L4 = DeviceFacts(
    cuda_device_count=1,
    cuda_capability=(8, 9),
    gpu_name="NVIDIA L4",
    gpu_memory_free_bytes=20 * 1024**3,
    gpu_memory_total_bytes=24 * 1024**3,
    ct2_cuda_compute_types=frozenset({"float32", "float16", "int8", "int8_float16"}),
    torch_version="2.8.0",
    torch_arch_list=("sm_80", "sm_86", "sm_90"),
    notes=("a note",),
)


def preflight(env: dict[str, str], facts: DeviceFacts, **settings: str) -> Preflight:
    """What `run_preflight` returns on a machine with `facts`, without probing or hashing."""
    env = {**env, **{f"MURMUR_{key.upper()}": value for key, value in settings.items()}}
    profile = load_runtime_profile(env, model_names=("tiny.en",), require_identity=False)
    return Preflight(
        profile=profile,
        backend="faster-whisper",
        model=VerifiedAsset("tiny.en", Path("/models/tiny.en"), 75_000_000),
        vad=VerifiedAsset("silero-vad", Path("/models/silero-vad"), 2_000_000),
        alignment=None,
        hardware=check_hardware(profile, facts, model_gpu_memory_mb=1024),
    )


def through_the_wire(runtime: ReadinessRuntime) -> ReadinessRuntime:
    """The report as the control plane's parser sees it after an HTTP round trip."""
    return ReadinessRuntime.model_validate_json(json.dumps(runtime.to_json()))


def test_a_cpu_workers_report_round_trips(cpu_env: dict[str, str]) -> None:
    built = preflight(cpu_env, DeviceFacts(cuda_device_count=0)).runtime(model_load_seconds=1.25)
    sent = built.to_json()

    assert built.model_extra == {}  # every field the worker sends is one the model declares
    assert through_the_wire(built) == built
    assert through_the_wire(built).to_json() == sent
    assert json_problem(sent, max_depth=4) is None  # within what the control plane stores
    assert sent["cuda_capability"] is None and sent["gpu_name"] is None  # sent, as null
    assert "image_pull_seconds" not in sent  # no pull measured: not sent at all
    assert sent["assets"]["tiny.en"] == {"root": "/models/tiny.en", "bytes": 75_000_000}
    assert (sent["compute_type"], sent["batch_size"], sent["model_load_seconds"]) == (
        "int8",
        1,
        1.25,
    )


def test_a_gpu_workers_report_round_trips(cpu_env: dict[str, str]) -> None:
    built = preflight(
        cpu_env, L4, device="cuda", compute_type="float16", alignment_device="cuda"
    ).runtime(model_load_seconds=3.5, image_pull_seconds=41.2)
    sent = built.to_json()

    assert built.model_extra == {} and built.hardware is not None
    assert built.hardware.model_extra == {}
    assert through_the_wire(built).to_json() == sent
    assert json_problem(sent, max_depth=4) is None
    assert sent["cuda_capability"] == [8, 9] and sent["gpu_name"] == "NVIDIA L4"
    assert sent["hardware"]["gpu_memory_required_mb"] is not None
    assert sent["image_pull_seconds"] == 41.2


WRONG_TYPES: list[tuple[str, dict[str, Any]]] = [
    ("batch size as text", {"batch_size": "16"}),
    ("batch size as a bool", {"batch_size": True}),
    ("batch size as a float", {"batch_size": 16.0}),
    ("model as a number", {"model": 3}),
    ("compute type as a list", {"compute_type": ["float16"]}),
    ("capability unreadable", {"cuda_capability": "eight"}),
    ("capability of one number", {"cuda_capability": [8]}),
    ("capability of bools", {"cuda_capability": [True, False]}),
    ("negative load time", {"model_load_seconds": -1.0}),
    ("load time as text", {"model_load_seconds": "1.5"}),
    ("a version as a number", {"versions": {"ctranslate2": 4}}),
    ("hardware count as text", {"hardware": {"cuda_device_count": "1"}}),
    ("an asset without its size", {"assets": {"tiny.en": {"root": "/models"}}}),
]


@pytest.mark.parametrize("body", [w[1] for w in WRONG_TYPES], ids=[w[0] for w in WRONG_TYPES])
def test_a_wrong_type_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ReadinessRuntime.model_validate_json(json.dumps(body))
    with pytest.raises(ValidationError):
        ReadinessRuntime.model_validate(body)


@pytest.mark.parametrize("value", [[8, 9], "8.9", 8.9, {"major": 8, "minor": 9}])
def test_a_capability_reads_in_every_form_and_stores_as_a_pair(value: Any) -> None:
    runtime = ReadinessRuntime.model_validate({"cuda_capability": value})
    assert runtime.cuda_capability == (8, 9)
    assert runtime.to_json() == {"cuda_capability": [8, 9]}


def test_unknown_values_and_fields_parse_and_are_kept() -> None:
    body = {
        "compute_type": "int4",
        "vad": "webrtc",
        "device": "rocm",
        "gpu_driver": {"version": "570.1", "cuda": [12, 8]},
    }
    runtime = ReadinessRuntime.model_validate_json(json.dumps(body))
    assert (runtime.compute_type, runtime.vad, runtime.device) == ("int4", "webrtc", "rocm")
    assert runtime.to_json() == body  # nothing added (no nulls for unset fields), nothing lost
