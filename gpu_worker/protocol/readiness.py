"""The readiness report: the runtime a worker posts to `POST .../ready` once its model is loaded.

The worker builds it with `ReadinessRuntime` (gpu_worker/preflight.py, gpu_worker/service.py)
and sends `ReadyBody.of(runtime).to_json()` (gpu_worker/client.py); the control plane parses
the body with `ReadyBody` and its `runtime` with `ReadinessRuntime` (app/internal.py),
compares it with the worker's profile (app/fleet/readiness.py) and stores `to_json()` on the
worker row, where the fleet views and /metrics read it (app/observability/views.py,
app/observability/collector.py).

Invariants:
- Every field the worker sends is typed and strict: a wrong type (`"16"` for a batch size, a
  number for a model name, a capability none of `parse_capability`'s forms reads) does not
  parse, and the control plane answers it as any other mismatch: `409 runtime_mismatch`
  naming the field and what was sent, the worker failed with that reason
  (app/fleet/readiness.py, `read_runtime`). A capability is stored as `[major, minor]`,
  whichever form it came in.
- A well-typed value outside what this control plane knows still parses. `compute_type`,
  `vad`, `alignment_device` and `device` are plain strings, not the closed sets of
  gpu_worker/protocol/runtime.py: the control plane compares them with the profile, whose
  values always lie in those sets, so an unknown value (a newer worker's compute type, a VAD
  this side has never heard of) is answered `409 runtime_mismatch` naming the field, the
  answer that makes the worker exit for good (gpu_worker/protocol/runtime.py,
  `EXIT_RUNTIME_MISMATCH`), and the row records why. The compared fields may be missing or
  null: the answer is then a mismatch saying "not reported", as before this model existed.
- Unknown fields are allowed and kept (`extra="allow"`), not refused and not dropped. Not
  refused, for the reason gpu_worker/protocol/transcript.py gives: a worker image newer than
  its control plane must still get an answer, and a 400 here would leave every new worker
  unready until the fleet's boot timeout deletes it, profile after profile. Not dropped,
  unlike a transcript's unknown fields: a transcript is served to clients in the API's shape,
  while the runtime is stored only as the worker's own account of itself for operators, and a
  newer worker's diagnostics are worth keeping. The control plane still bounds them: the
  whole stored value passes app/inputs.py's `json_problem` (no NUL or lone surrogate, finite
  numbers, at most 4 levels deep) and the body its size limit (app/internal.py). The usage
  report is strict instead because it carries `REPORT_VERSION` (gpu_worker/protocol/usage.py);
  readiness has no version to negotiate with.
- `to_json()` sends exactly the fields that were set, so the stored JSON is what the worker
  sent: a field never set is absent, not null (rows and readers written before this model
  see the same keys).
- The body (`ReadyBody`) is `{"runtime": {...}}` and nothing else. Its `runtime` is any JSON
  object there, typed afterwards by `ReadinessRuntime`: a runtime of the wrong shape is the
  worker's mismatch (409), while a body that is not an object with an object `runtime` is
  a bad body (400).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpu_worker.protocol.bounds import Seconds
from gpu_worker.protocol.runtime import Capability

# A count or size the worker measured (threads, MiB, bytes): never negative.
Count = Annotated[int, Field(ge=0)]


class _Report(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True, allow_inf_nan=False)


class HardwareDiagnostics(_Report):
    """What the worker's hardware check saw (gpu_worker/hardware.py, `DeviceFacts`)."""

    cuda_device_count: Count | None = None
    gpu_name: str | None = None
    cuda_capability: list[int] | None = None
    gpu_memory_free_mb: Count | None = None
    gpu_memory_total_mb: Count | None = None
    # Set for a GPU runtime: what the model, VAD and alignment need, by the worker's estimate.
    gpu_memory_required_mb: Count | None = None
    ct2_cpu_compute_types: list[str] | None = None
    ct2_cuda_compute_types: list[str] | None = None
    torch_version: str | None = None
    torch_arch_list: list[str] | None = None
    notes: list[str] | None = None


class AssetReport(_Report):
    """One verified model asset: where it was loaded from and how many bytes were checked."""

    root: str
    bytes: Count


class ReadinessRuntime(_Report):
    """The body's `runtime` (docs/worker-protocol.md, "Runtime (readiness)")."""

    # Compared with the worker's profile (app/fleet/readiness.py); None = not reported.
    profile: str | None = None
    model: str | None = None
    device: str | None = None
    compute_type: str | None = None
    vad: str | None = None
    alignment_device: str | None = None
    batch_size: int | None = None
    # The diarization weight set loaded and verified (its files are in `assets`); None: none.
    diarization: str | None = None
    # The GPU's CUDA capability, checked against the profile's compute type.
    cuda_capability: Capability | None = None
    # The claim features this worker serves (gpu_worker/protocol/claim.py, `PARTS`): a part
    # is handed only to a worker that lists "parts". Absent on workers from before parts.
    features: list[str] | None = None
    # Diagnostics, never compared.
    gpu_name: str | None = None
    backend: str | None = None
    cpu_threads: Count | None = None
    versions: dict[str, str] | None = None
    hardware: HardwareDiagnostics | None = None
    assets: dict[str, AssetReport] | None = None
    # Lifecycle timings the control plane exports per profile (app/observability/collector.py).
    model_load_seconds: Seconds | None = None
    image_pull_seconds: Seconds | None = None

    @field_validator("cuda_capability", mode="before")
    @classmethod
    def _capability(cls, value: Any) -> Any:
        """`[8, 9]` as the worker sends it; `"8.9"`, `8.9` and `{"major": 8, "minor": 9}` too."""
        if value is None:
            return None
        capability = parse_capability(value)
        if capability is None:
            raise ValueError("expected [major, minor], two integers")
        return capability

    def to_json(self) -> dict[str, Any]:
        """The body's `runtime`, and what the control plane stores: the fields that were set."""
        return self.model_dump(mode="json", exclude_unset=True)


class ReadyBody(BaseModel):
    """The readiness body, `POST .../ready`: the runtime as a JSON object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: dict[str, Any]

    @classmethod
    def of(cls, runtime: ReadinessRuntime) -> ReadyBody:
        """The body for this runtime: its `to_json()`, the fields that were set."""
        return cls(runtime=runtime.to_json())

    def to_json(self) -> dict[str, Any]:
        """The body as the worker sends it."""
        return {"runtime": self.runtime}


def parse_capability(value: Any) -> Capability | None:
    """A CUDA capability from `[8, 9]`, `"8.9"`, `8.9` or `{"major": 8, "minor": 9}`; else None."""
    parts: list[Any]
    if isinstance(value, dict) and value.keys() == {"major", "minor"}:
        parts = [value["major"], value["minor"]]
    elif isinstance(value, list | tuple) and len(value) == 2:
        parts = list(value)
    elif isinstance(value, str | float):
        major, _, minor = str(value).partition(".")
        parts = [major, minor or "0"]
        if not all(part.isascii() and part.isdigit() for part in parts):
            return None
        parts = [int(part) for part in parts]
    else:
        return None
    if not all(isinstance(part, int) and not isinstance(part, bool) for part in parts):
        return None
    return parts[0], parts[1]
