"""What a worker measures about itself for its usage report: CPU, RAM, GPUs and a redacted log tail.

Every measurement is a `Reading`: a value, or no value and the reason it is missing. A
missing reading is never reported as zero, because "0 % GPU busy" and "could not ask the
GPU" call for opposite actions. Samplers take the library module as an argument (psutil,
pynvml) so tests can make any call fail; in production they import it lazily, because CPU
workers do not install `nvidia-ml-py`.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import importlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_worker.protocol.redaction import clean_log_line
from gpu_worker.protocol.usage import MAX_GPUS, MissingReason

# NVML return codes (nvml.h), compared by value so no pynvml import is needed to classify.
_NVML_NOT_SUPPORTED = 3
_NVML_NO_PERMISSION = 4
_NVML_DRIVER_NOT_LOADED = 9
_NVML_LIBRARY_NOT_FOUND = 12
_NVML_FUNCTION_NOT_FOUND = 13


@dataclass(frozen=True)
class Reading:
    """One measurement: `value`, or None and `reason`."""

    value: float | None
    reason: MissingReason | None = None

    @classmethod
    def of(cls, value: float) -> Reading:
        if not math.isfinite(value) or value < 0:
            return cls(None, "reading_failed")
        return cls(float(value), None)

    @classmethod
    def missing(cls, reason: MissingReason) -> Reading:
        return cls(None, reason)

    def to_json(self) -> dict[str, float | str | None]:
        return {"value": self.value, "reason": self.reason}


@dataclass(frozen=True)
class HostReadings:
    cpu_utilization_ratio: Reading
    memory_used_bytes: Reading
    memory_total_bytes: Reading

    def to_json(self) -> dict[str, Any]:
        return {
            "cpu_utilization_ratio": self.cpu_utilization_ratio.to_json(),
            "memory_used_bytes": self.memory_used_bytes.to_json(),
            "memory_total_bytes": self.memory_total_bytes.to_json(),
        }


@dataclass(frozen=True)
class GpuReadings:
    index: int
    utilization_ratio: Reading
    memory_used_bytes: Reading
    memory_total_bytes: Reading
    temperature_celsius: Reading
    power_watts: Reading

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "utilization_ratio": self.utilization_ratio.to_json(),
            "memory_used_bytes": self.memory_used_bytes.to_json(),
            "memory_total_bytes": self.memory_total_bytes.to_json(),
            "temperature_celsius": self.temperature_celsius.to_json(),
            "power_watts": self.power_watts.to_json(),
        }


@dataclass(frozen=True)
class GpuTelemetry:
    """Readings per GPU; with no device list at all, `reason` says why."""

    devices: tuple[GpuReadings, ...]
    reason: MissingReason | None = None

    def to_json(self) -> dict[str, Any]:
        return {"devices": [d.to_json() for d in self.devices], "reason": self.reason}


class HostSampler(Protocol):
    def sample(self) -> HostReadings: ...


class GpuSampler(Protocol):
    def sample(self) -> GpuTelemetry: ...


def _import_optional(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class PsutilHostSampler:
    """CPU utilisation (busy share of all cores since the previous sample) and RAM, via psutil.

    CPU utilisation is computed from our own `cpu_times()` deltas rather than
    `psutil.cpu_percent()`, whose state is global to the process and whose first answer is
    a meaningless 0.0.
    """

    def __init__(self, psutil_module: Any | None = None) -> None:
        # Any: the module, or None when psutil is not installed.
        self._psutil: Any = (
            psutil_module if psutil_module is not None else _import_optional("psutil")
        )
        self._last: tuple[float, float] | None = None
        if self._psutil is not None:
            try:
                self._last = self._cpu_totals()
            except Exception:
                self._last = None

    def _cpu_totals(self) -> tuple[float, float]:
        """(busy, total) CPU seconds of the whole machine since boot."""
        times = self._psutil.cpu_times()
        total = float(sum(times))
        idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
        return total - idle, total

    def _cpu(self) -> Reading:
        try:
            busy, total = self._cpu_totals()
        except Exception:
            return Reading.missing("reading_failed")
        last, self._last = self._last, (busy, total)
        if last is None or total <= last[1]:
            return Reading.missing("warming_up")
        return Reading.of(min(max((busy - last[0]) / (total - last[1]), 0.0), 1.0))

    def sample(self) -> HostReadings:
        if self._psutil is None:
            missing = Reading.missing("psutil_unavailable")
            return HostReadings(missing, missing, missing)
        cpu = self._cpu()
        try:
            memory = self._psutil.virtual_memory()
            total = float(memory.total)
            # "used" as the headroom you no longer have: total minus what is available.
            used = Reading.of(total - float(memory.available))
            total_reading = Reading.of(total)
        except Exception:
            used = total_reading = Reading.missing("reading_failed")
        return HostReadings(cpu, used, total_reading)


def _nvml_reason(exc: BaseException, nvml: Any) -> MissingReason:
    error_type = getattr(nvml, "NVMLError", None)
    if not (isinstance(error_type, type) and isinstance(exc, error_type)):
        return "reading_failed"
    code = getattr(exc, "value", None)
    if code in (_NVML_NOT_SUPPORTED, _NVML_FUNCTION_NOT_FOUND):
        return "not_supported"
    if code == _NVML_LIBRARY_NOT_FOUND:
        return "nvml_unavailable"
    if code == _NVML_DRIVER_NOT_LOADED:
        return "nvml_driver_not_loaded"
    if code == _NVML_NO_PERMISSION:
        return "nvml_no_permission"
    return "nvml_error"


class NvmlGpuSampler:
    """GPU utilisation, memory, temperature and power through NVML (package `nvidia-ml-py`).

    `nvmlInit` is retried on every sample until it succeeds: on a fresh instance the driver
    may load after the worker starts. Each field is read on its own so one unsupported query
    (common on some boards) costs only that field.
    """

    def __init__(self, nvml_module: Any | None = None, *, max_gpus: int = MAX_GPUS) -> None:
        self._nvml: Any = nvml_module  # imported on first use when not given
        self._max_gpus = max_gpus
        self._initialised = False
        self._lock = threading.Lock()

    def _init(self) -> MissingReason | None:
        if self._initialised:
            return None
        if self._nvml is None:
            self._nvml = _import_optional("pynvml")
            if self._nvml is None:
                return "nvml_not_installed"
        try:
            self._nvml.nvmlInit()
        except Exception as exc:
            return _nvml_reason(exc, self._nvml)
        self._initialised = True
        return None

    def _read(self, call: Callable[[], float]) -> Reading:
        try:
            return Reading.of(float(call()))
        except Exception as exc:
            return Reading.missing(_nvml_reason(exc, self._nvml))

    def _device(self, index: int) -> GpuReadings:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            missing = Reading.missing(_nvml_reason(exc, nvml))
            return GpuReadings(index, missing, missing, missing, missing, missing)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = Reading.of(float(memory.used)), Reading.of(float(memory.total))
        except Exception as exc:
            used = total = Reading.missing(_nvml_reason(exc, nvml))
        return GpuReadings(
            index=index,
            # NVML gives percent over its last sample period; we report a 0-1 ratio.
            utilization_ratio=self._read(
                lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            ),
            memory_used_bytes=used,
            memory_total_bytes=total,
            temperature_celsius=self._read(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            # Milliwatts from NVML.
            power_watts=self._read(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        )

    def sample(self) -> GpuTelemetry:
        with self._lock:
            reason = self._init()
            if reason is not None:
                return GpuTelemetry((), reason)
            try:
                count = int(self._nvml.nvmlDeviceGetCount())
            except Exception as exc:
                return GpuTelemetry((), _nvml_reason(exc, self._nvml))
            if count <= 0:
                return GpuTelemetry((), "no_gpu")
            return GpuTelemetry(tuple(self._device(i) for i in range(min(count, self._max_gpus))))

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                # Shutting down: nothing useful to do with an error.
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
                self._initialised = False


# --- the log tail ----------------------------------------------------------------------------

# Free-text arguments longer than this, or with whitespace, are masked (see `_safe_arg`).
_MAX_TOKEN_ARG = 64


def _safe_arg(arg: object) -> object:
    """A log argument as the tail may keep it.

    Numbers and short identifier-like strings (ids, codes, profile names) stay. Anything
    longer or with whitespace is free text and could be a transcript (a segment, a prompt,
    a model's output inside an error), so only its length is kept. Exceptions keep their
    type and a bounded, redacted message: their texts are ours or a library's, and losing
    them would make the tail useless for the failures it exists to explain.
    """
    if arg is None or isinstance(arg, bool | int | float):
        return arg
    if isinstance(arg, enum.Enum):
        return str(arg.value)
    if isinstance(arg, BaseException):
        return f"{type(arg).__name__}: {str(arg)[:200]}"
    text = str(arg)
    if len(text) <= _MAX_TOKEN_ARG and not any(c.isspace() for c in text):
        return text
    return f"<text: {len(text)} chars>"


def render_record(record: logging.LogRecord, secrets: Iterable[str] = ()) -> str:
    """One redacted line for the tail: level, logger, message; tracebacks become a type name."""
    template = str(record.msg)
    args = record.args
    try:
        if isinstance(args, Mapping):
            message = template % {k: _safe_arg(v) for k, v in args.items()}
        elif args:
            message = template % tuple(_safe_arg(a) for a in args)
        else:
            message = template
    except (TypeError, ValueError, KeyError):
        message = f"{template} <unrenderable arguments>"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
    line = f"{when} {record.levelname} {record.name}: {message}"
    if record.exc_info and record.exc_info[0] is not None:
        line += f" [{record.exc_info[0].__name__}]"
    return clean_log_line(line, secrets)


@dataclass(frozen=True)
class LogLine:
    number: int  # 1, 2, ... per process: the control plane drops lines it already stored
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "text": self.text}


class LogTail(logging.Handler):
    """The last `capacity` log lines of this process, redacted as they are recorded."""

    def __init__(
        self, capacity: int = 200, *, secrets: Iterable[str] = (), level: int = logging.INFO
    ) -> None:
        super().__init__(level)
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._secrets = tuple(s for s in secrets if s)
        self._count = 0
        self._tail_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = render_record(record, self._secrets)
        except Exception:  # a logging handler must never raise into the caller
            return
        with self._tail_lock:
            self._count += 1
            self._lines.append(LogLine(self._count, text))

    def since(self, number: int, limit: int) -> list[LogLine]:
        """The newest `limit` lines numbered above `number`, oldest first."""
        with self._tail_lock:
            newer = [line for line in self._lines if line.number > number]
        return newer[-limit:] if limit > 0 else []
