"""Worker-side sampling: missing NVML, failing readings and failing psutil become null + reason."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_worker import telemetry
from gpu_worker.protocol.redaction import MAX_LOG_LINE
from gpu_worker.protocol.usage import MISSING_REASONS
from gpu_worker.telemetry import (
    LogTail,
    NvmlGpuSampler,
    PsutilHostSampler,
    Reading,
    render_record,
)


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The pynvml calls the sampler makes; `failures` makes named calls raise."""

    NVMLError = FakeNvmlError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, count: int = 1, failures: dict[str, BaseException] | None = None):
        self.count = count
        self.failures = failures or {}
        self.inits = 0

    def _maybe_fail(self, name: str) -> None:
        if name in self.failures:
            raise self.failures[name]

    def nvmlInit(self) -> None:
        self.inits += 1
        self._maybe_fail("nvmlInit")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._maybe_fail("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._maybe_fail("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=42, memory=7)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._maybe_fail("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=24_000_000_000, used=6_000_000_000, free=18_000_000_000)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._maybe_fail("nvmlDeviceGetTemperature")
        return 61

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._maybe_fail("nvmlDeviceGetPowerUsage")
        return 72_500  # milliwatts


def _all_values(device: telemetry.GpuReadings) -> list[Reading]:
    return [
        device.utilization_ratio,
        device.memory_used_bytes,
        device.memory_total_bytes,
        device.temperature_celsius,
        device.power_watts,
    ]


def test_nvml_readings_are_converted_to_base_units() -> None:
    gpus = NvmlGpuSampler(FakeNvml()).sample()
    assert gpus.reason is None
    (device,) = gpus.devices
    assert device.utilization_ratio.value == pytest.approx(0.42)
    assert device.memory_used_bytes.value == 6_000_000_000
    assert device.memory_total_bytes.value == 24_000_000_000
    assert device.temperature_celsius.value == 61
    assert device.power_watts.value == pytest.approx(72.5)


def test_nvml_not_installed_is_reported_missing_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_import_optional", lambda name: None)
    gpus = NvmlGpuSampler().sample()
    assert gpus.devices == ()
    assert gpus.reason == "nvml_not_installed"
    assert gpus.to_json() == {"devices": [], "reason": "nvml_not_installed"}


def test_nvml_library_missing_then_driver_appears() -> None:
    nvml = FakeNvml(failures={"nvmlInit": FakeNvmlError(12)})
    sampler = NvmlGpuSampler(nvml)
    assert sampler.sample() == telemetry.GpuTelemetry((), "nvml_unavailable")
    # The driver loads after the worker started: the next sample initialises NVML.
    nvml.failures.clear()
    gpus = sampler.sample()
    assert gpus.reason is None and len(gpus.devices) == 1
    assert nvml.inits == 2


@pytest.mark.parametrize(
    ("code", "reason"),
    [(9, "nvml_driver_not_loaded"), (4, "nvml_no_permission"), (999, "nvml_error")],
)
def test_nvml_init_errors_are_classified(code: int, reason: str) -> None:
    sampler = NvmlGpuSampler(FakeNvml(failures={"nvmlInit": FakeNvmlError(code)}))
    assert sampler.sample().reason == reason


def test_one_unsupported_reading_costs_only_that_field() -> None:
    nvml = FakeNvml(failures={"nvmlDeviceGetTemperature": FakeNvmlError(3)})
    (device,) = NvmlGpuSampler(nvml).sample().devices
    assert device.temperature_celsius == Reading(None, "not_supported")
    assert device.power_watts.value == pytest.approx(72.5)
    assert device.utilization_ratio.value == pytest.approx(0.42)


def test_a_reading_raising_something_else_is_reading_failed() -> None:
    nvml = FakeNvml(failures={"nvmlDeviceGetMemoryInfo": RuntimeError("boom")})
    (device,) = NvmlGpuSampler(nvml).sample().devices
    assert device.memory_used_bytes == Reading(None, "reading_failed")
    assert device.memory_total_bytes == Reading(None, "reading_failed")
    assert device.temperature_celsius.value == 61


def test_lost_gpu_handle_makes_every_field_of_that_gpu_missing() -> None:
    nvml = FakeNvml(failures={"nvmlDeviceGetHandleByIndex": FakeNvmlError(15)})
    (device,) = NvmlGpuSampler(nvml).sample().devices
    assert all(r == Reading(None, "nvml_error") for r in _all_values(device))


def test_no_gpu_counted_is_a_reason() -> None:
    assert NvmlGpuSampler(FakeNvml(count=0)).sample().reason == "no_gpu"


def test_nonsense_values_are_not_reported() -> None:
    assert Reading.of(float("nan")) == Reading(None, "reading_failed")
    assert Reading.of(-1.0) == Reading(None, "reading_failed")
    assert Reading.of(0.0) == Reading(0.0, None)  # a real zero stays a zero


class FakePsutil:
    def __init__(self) -> None:
        self.busy, self.idle = 100.0, 300.0
        self.memory_error: BaseException | None = None
        self.cpu_error: BaseException | None = None

    def cpu_times(self) -> Any:
        if self.cpu_error is not None:
            raise self.cpu_error
        # psutil's named tuple sums to the total; iowait counts as idle.
        return _CpuTimes(self.busy, self.idle)

    def virtual_memory(self) -> Any:
        if self.memory_error is not None:
            raise self.memory_error
        return SimpleNamespace(total=8_000_000_000, available=6_000_000_000)


class _CpuTimes(tuple[float, float, float]):
    def __new__(cls, busy: float, idle: float) -> _CpuTimes:
        return super().__new__(cls, (busy, idle, 0.0))

    @property
    def idle(self) -> float:
        return self[1]

    @property
    def iowait(self) -> float:
        return self[2]


def test_psutil_missing_reports_every_host_reading_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(telemetry, "_import_optional", lambda name: None)
    host = PsutilHostSampler().sample()
    missing = Reading(None, "psutil_unavailable")
    assert host == telemetry.HostReadings(missing, missing, missing)


def test_cpu_utilisation_needs_two_samples_then_is_the_busy_share() -> None:
    fake = FakePsutil()
    sampler = PsutilHostSampler(fake)
    # Nothing has happened since the sampler was built: no rate can be computed.
    assert sampler.sample().cpu_utilization_ratio == Reading(None, "warming_up")
    fake.busy += 30.0
    fake.idle += 10.0
    assert sampler.sample().cpu_utilization_ratio.value == pytest.approx(0.75)


def test_psutil_memory_failure_is_reading_failed_and_cpu_still_works() -> None:
    fake = FakePsutil()
    sampler = PsutilHostSampler(fake)
    fake.busy += 1.0
    fake.memory_error = OSError("no /proc")
    host = sampler.sample()
    assert host.memory_used_bytes == Reading(None, "reading_failed")
    assert host.memory_total_bytes == Reading(None, "reading_failed")
    assert host.cpu_utilization_ratio.value == pytest.approx(1.0)


def test_psutil_cpu_failure_is_reading_failed_and_the_next_sample_recovers() -> None:
    fake = FakePsutil()
    sampler = PsutilHostSampler(fake)
    fake.cpu_error = PermissionError("no /proc/stat")
    host = sampler.sample()
    assert host.cpu_utilization_ratio == Reading(None, "reading_failed")
    assert host.memory_total_bytes.value == 8_000_000_000  # the other readings still come
    fake.cpu_error = None
    fake.busy += 5.0
    fake.idle += 15.0
    assert sampler.sample().cpu_utilization_ratio.value == pytest.approx(0.25)


def test_real_psutil_reports_this_machine() -> None:
    host = PsutilHostSampler().sample()
    assert host.memory_total_bytes.value is not None and host.memory_total_bytes.value > 0
    assert host.memory_used_bytes.value is not None
    assert host.memory_used_bytes.value <= host.memory_total_bytes.value


def test_real_nvml_either_reads_a_gpu_or_says_why_not() -> None:
    gpus = NvmlGpuSampler().sample()
    if gpus.devices:
        assert gpus.reason is None
        assert any(r.value is not None for d in gpus.devices for r in _all_values(d))
    else:
        assert gpus.reason in MISSING_REASONS


# --- the log tail ----------------------------------------------------------------------------

TOKEN = "ab" * 32


def _record(msg: str, *args: Any, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("gpu_worker.jobs", logging.INFO, __file__, 1, msg, args, exc_info)


def test_log_lines_lose_tokens_urls_and_secrets() -> None:
    line = render_record(
        _record(
            "claim job_0123 from %s with Bearer %s; broker %s; audio %s; token=%s",
            "http://10.0.0.1:8000/internal/workers/w/i/jobs/j/claim",
            TOKEN,
            "redis://:brokerpass@10.0.0.2:6379/0",
            "/internal/audio/job_0123?expires=1&sig=" + "f" * 64,
            "hunter2",
        ),
        secrets=[TOKEN],
    )
    for secret in (TOKEN, "brokerpass", "10.0.0.1", "f" * 64, "hunter2", "sig=f"):
        assert secret not in line
    assert "job_0123" in line  # job ids are what an operator looks for in a log


def test_free_text_arguments_are_masked_so_transcripts_stay_out() -> None:
    line = render_record(_record("segment %d: %s", 3, "the quick brown fox jumps"))
    assert "quick brown" not in line
    assert "segment 3: <text: 25 chars>" in line


def test_exceptions_keep_their_type_and_tracebacks_stay_out() -> None:
    try:
        raise ValueError("decode failed at frame 12")
    except ValueError as exc:
        line = render_record(_record("job %s failed: %s", "job_1", exc, exc=exc))
    assert "ValueError: decode failed at frame 12" in line
    assert line.endswith("[ValueError]")
    assert "Traceback" not in line


def test_log_lines_are_one_line_and_bounded() -> None:
    line = render_record(_record("x" * 5000 + "\nsecond line"))
    assert "\n" not in line
    assert len(line) <= MAX_LOG_LINE


def test_log_tail_keeps_the_newest_lines_numbered() -> None:
    tail = LogTail(capacity=3)
    logger = logging.getLogger("test.observability.tail")
    logger.propagate = False
    logger.addHandler(tail)
    logger.setLevel(logging.INFO)
    try:
        for i in range(5):
            logger.info("line %d", i)
    finally:
        logger.removeHandler(tail)
    assert [line.number for line in tail.since(0, 10)] == [3, 4, 5]
    assert [line.number for line in tail.since(4, 10)] == [5]
    assert [line.number for line in tail.since(0, 2)] == [4, 5]
    assert tail.since(0, 10)[-1].text.endswith("INFO test.observability.tail: line 4")


def test_a_broken_argument_never_breaks_logging() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    tail = LogTail()
    tail.emit(_record("value %s", Unprintable()))  # must not raise
    assert tail.since(0, 10) == []
