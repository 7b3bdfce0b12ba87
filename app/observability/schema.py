"""The usage report a worker posts, as a strict pydantic model: unknown fields and odd types fail.

The worker side builds it in gpu_worker/reporter.py; docs/observability.md describes every
field. Every measured value is a `Reading` (a value, or null and a reason from a closed
set), so a missing GPU reading can never be mistaken for zero and a reason can be a metric
label without unbounded cardinality.
"""

from __future__ import annotations

from typing import Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpu_worker.bounds import MAX_SECONDS

REPORT_VERSION = 1
ReportedState = Literal["starting", "loading", "ready", "busy", "draining"]
REPORTED_STATES: tuple[str, ...] = get_args(ReportedState)
MissingReason = Literal[
    "nvml_not_installed",
    "nvml_unavailable",
    "nvml_driver_not_loaded",
    "nvml_no_permission",
    "nvml_error",
    "not_supported",
    "no_gpu",
    "psutil_unavailable",
    "reading_failed",
    "warming_up",
]
MISSING_REASONS: tuple[str, ...] = get_args(MissingReason)

MAX_GPUS = 16
MAX_LOG_LINES = 50
MAX_LOG_LINE_CHARS = 512
# Generous physical bounds: a value outside them is a broken sampler, not a measurement.
_MAX_BYTES = 2**50  # 1 PiB
_MAX_SECONDS = MAX_SECONDS
# A Unix time before the year 2500: any clock that says otherwise is broken.
_MAX_UNIX_TIME = 16_725_225_600.0
_MAX_COUNT = 2**53


class _Strict(BaseModel):
    # strict: no "1" → 1 or 1.0 → 1 coercion; allow_inf_nan=False: Python's json emits NaN.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class Reading(_Strict):
    # Every number here is finite (allow_inf_nan=False) and bounded on both sides; the
    # subclasses narrow the bound to their unit.
    value: float | None = Field(ge=0, le=_MAX_BYTES)
    reason: MissingReason | None = None

    @model_validator(mode="after")
    def _value_or_reason(self) -> Self:
        if (self.value is None) == (self.reason is None):
            raise ValueError("give either a value or a reason, not both or neither")
        return self


class Ratio(Reading):
    value: float | None = Field(ge=0, le=1)


class ByteCount(Reading):
    value: float | None = Field(ge=0, le=_MAX_BYTES)


class Celsius(Reading):
    value: float | None = Field(ge=0, le=200)


class Watts(Reading):
    value: float | None = Field(ge=0, le=10_000)


class HostReport(_Strict):
    cpu_utilization_ratio: Ratio
    memory_used_bytes: ByteCount
    memory_total_bytes: ByteCount


class GpuDeviceReport(_Strict):
    index: int = Field(ge=0, lt=MAX_GPUS)
    utilization_ratio: Ratio
    memory_used_bytes: ByteCount
    memory_total_bytes: ByteCount
    temperature_celsius: Celsius
    power_watts: Watts


class GpuReport(_Strict):
    devices: list[GpuDeviceReport] = Field(max_length=MAX_GPUS)
    reason: MissingReason | None = None

    @model_validator(mode="after")
    def _devices_or_reason(self) -> Self:
        if bool(self.devices) == (self.reason is not None):
            raise ValueError("give GPU devices, or no devices and a reason")
        if len({d.index for d in self.devices}) != len(self.devices):
            raise ValueError("GPU indexes must be unique")
        return self


class Transcriptions(_Strict):
    succeeded: int = Field(ge=0, le=_MAX_COUNT)
    failed: int = Field(ge=0, le=_MAX_COUNT)


class LogLine(_Strict):
    number: int = Field(ge=1, le=_MAX_COUNT)
    text: str = Field(max_length=MAX_LOG_LINE_CHARS)


class UsageReport(_Strict):
    """One report: the worker's state and counters since its process started, and readings."""

    version: Literal[1]
    # Wall-clock start of the worker process; with `sequence` it orders reports across a
    # restart of the process (the sequence starts again at 1).
    process_started_at: float = Field(gt=0, le=_MAX_UNIX_TIME)
    sequence: int = Field(ge=1, le=_MAX_COUNT)
    state: ReportedState
    uptime_seconds: float = Field(ge=0, le=_MAX_SECONDS)
    model_load_seconds: float | None = Field(ge=0, le=_MAX_SECONDS)
    transcriptions: Transcriptions
    processing_seconds: float = Field(ge=0, le=_MAX_SECONDS * 100)
    audio_seconds: float = Field(ge=0, le=_MAX_SECONDS * 100)
    host: HostReport
    gpu: GpuReport
    log: list[LogLine] = Field(default_factory=list, max_length=MAX_LOG_LINES)

    @field_validator("log")
    @classmethod
    def _log_in_order(cls, lines: list[LogLine]) -> list[LogLine]:
        numbers = [line.number for line in lines]
        if numbers != sorted(set(numbers)):
            raise ValueError("log line numbers must be strictly increasing")
        return lines
