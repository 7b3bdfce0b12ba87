"""The usage report a worker posts every interval, and how reports are timed and bounded.

The worker builds the report (gpu_worker/reporter.py from gpu_worker/telemetry.py's
readings); the control plane parses it with `UsageReport` (app/observability/views.py).
docs/observability.md describes every field.

Invariants:
- `UsageReport` is strict: unknown fields and odd types fail, no "1" -> 1 coercion, every
  number finite and bounded on both sides. A worker newer than its control plane must keep
  `REPORT_VERSION` until both sides speak the next one.
- Every measured value is a `Reading`: a value, or null and a reason from the closed set
  `MissingReason`, so a missing GPU reading can never be mistaken for zero and a reason can
  be a metric label without unbounded cardinality.
- A report the worker sends fits `MAX_REPORT_BYTES` (its log lines take at most
  `MAX_LOG_BYTES_PER_REPORT`), or the control plane would refuse it and every later one.
- Timing: a worker reports (or, with reports off, sends a bare heartbeat) every interval,
  jittered by `REPORT_JITTER`, and gives an attempt up after `REPORT_TIMEOUT`; the fleet
  declares it dead after `heartbeat_timeout_seconds(interval)` of silence.
"""

from __future__ import annotations

from typing import Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpu_worker.protocol.bounds import MAX_SECONDS

REPORT_VERSION = 1
ReportedState = Literal["starting", "loading", "ready", "busy", "draining"]
REPORTED_STATES: tuple[str, ...] = get_args(ReportedState)

# Why a reading has no value.
MissingReason = Literal[
    "nvml_not_installed",  # the pynvml module (package nvidia-ml-py) is not importable
    "nvml_unavailable",  # libnvidia-ml is not there (no driver, no GPU passed to a container)
    "nvml_driver_not_loaded",
    "nvml_no_permission",
    "nvml_error",  # any other NVML error (GPU lost, unknown, ...)
    "not_supported",  # this board does not support this query
    "no_gpu",  # NVML works and counts zero devices
    "psutil_unavailable",  # psutil is not importable
    "reading_failed",  # the call raised something else, or returned nonsense
    "warming_up",  # a rate needs two samples; this is the first
]
MISSING_REASONS: tuple[str, ...] = get_args(MissingReason)

# One worker drives one GPU (multi-GPU types are not allowed); a cap keeps a report bounded.
MAX_GPUS = 16

# -- size -------------------------------------------------------------------------------------

# A report is ~2 KB with one GPU; the control plane refuses a larger body than this unread.
MAX_REPORT_BYTES = 64 * 1024
# Log lines per report, and what a line may hold (the worker sends at most
# gpu_worker/protocol/redaction.py's MAX_LOG_LINE; the control plane accepts a little more).
MAX_LOG_LINES = 50
MAX_LOG_LINE_CHARS = 512
# The bytes a report's log lines may take on the worker's side: JSON writes each non-ASCII
# character as a 6-byte escape, so 50 lines of 400 such characters would be 120 KB; refused,
# and never acknowledged, they would block every later report. Lines left out go next time.
MAX_LOG_BYTES_PER_REPORT = 32 * 1024

# -- timing -----------------------------------------------------------------------------------

# Seconds between reports (MURMUR_REPORT_INTERVAL, observability.report_interval_seconds).
DEFAULT_REPORT_INTERVAL_SECONDS = 30.0
# ±10 %: a fleet started together does not report in lock-step.
REPORT_JITTER = 0.1
# (connect, read) seconds of one report or heartbeat: both are small, and a slow control
# plane must not make them pile up behind each other.
REPORT_TIMEOUT = (3.0, 5.0)


def heartbeat_timeout_seconds(interval: float) -> float:
    """Silence that means three reports in a row did not arrive, at their latest.

    The worker waits its (jittered) interval after each attempt returns, and a failed attempt
    can take a whole timeout: three intervals at their longest, each with one timeout. Two
    reports lost in a row (a network blip, an API restart) never get a worker deleted.
    """
    return 3 * (interval * (1 + REPORT_JITTER) + sum(REPORT_TIMEOUT))


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
