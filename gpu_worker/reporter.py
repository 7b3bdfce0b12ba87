"""The usage reporter: a daemon thread that posts this worker's usage report every interval.

It starts before the model loads and runs beside transcription, never inside it: a report
is built from the shared worker state and the samplers, sent once with a bounded timeout,
and dropped if it fails (no retry queue: the next report supersedes it). Nothing it does can
fail a job or hold up the process's exit; its exceptions are caught and logged without the
token or any URL. The body is described in docs/observability.md.

A worker whose Celery consumer is stalled (gpu_worker/liveness.py) is not reported: no report
is sent while the state says it is not consuming, so the fleet hears nothing from a process
that cannot take a job, and declares it dead if that lasts (docs/fleet.md, `no heartbeat`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import requests
from pydantic import SecretStr

from gpu_worker.protocol import routes
from gpu_worker.protocol.bounds import MAX_SECONDS
from gpu_worker.protocol.usage import (
    MAX_LOG_BYTES_PER_REPORT,
    MAX_LOG_LINES,
    REPORT_JITTER,
    REPORT_TIMEOUT,
    REPORT_VERSION,
    REPORTED_STATES,
)
from gpu_worker.telemetry import (
    GpuSampler,
    HostSampler,
    LogTail,
    NvmlGpuSampler,
    PsutilHostSampler,
)

log = logging.getLogger(__name__)


def _seconds(value: float) -> float:
    # The control plane refuses a whole report for one NaN or out-of-range number (see
    # gpu_worker/protocol/bounds.py); a broken counter reads as 0 rather than silencing every
    # report.
    if not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), MAX_SECONDS)


class ProcessState(Protocol):
    """What the reporter reads from the worker's state (gpu_worker.state.StateSnapshot)."""

    @property
    def phase(self) -> str: ...
    @property
    def jobs_succeeded(self) -> int: ...
    @property
    def jobs_failed(self) -> int: ...
    @property
    def processing_seconds(self) -> float: ...
    @property
    def audio_seconds(self) -> float: ...
    @property
    def model_load_seconds(self) -> float | None: ...
    @property
    def uptime_seconds(self) -> float: ...
    @property
    def consuming(self) -> bool: ...


class StateSource(Protocol):
    """gpu_worker.state.WorkerState, or a fake in tests."""

    def snapshot(self) -> ProcessState: ...


class UsageReporter:
    """Builds usage reports from the worker state and samplers, and posts them on a thread."""

    def __init__(
        self,
        *,
        control_url: str,
        worker_id: str,
        instance_id: str,
        token: SecretStr,
        state: StateSource,
        interval_seconds: float,
        host: HostSampler | None = None,
        gpus: GpuSampler | None = None,
        log_tail: LogTail | None = None,
        session: requests.Session | None = None,
        timeout: tuple[float, float] = REPORT_TIMEOUT,
        jitter: float = REPORT_JITTER,
        rng: random.Random | None = None,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        self._url = (
            f"{control_url.rstrip('/')}{routes.worker_prefix(worker_id, instance_id)}"
            f"{routes.REPORT}"
        )
        self._token = token
        self._state = state
        self._interval = interval_seconds
        self._host = host or PsutilHostSampler()
        self._gpus = gpus or NvmlGpuSampler()
        self._log_tail = log_tail
        # A session of its own: requests.Session is not meant to be shared across threads,
        # and the job path has its own.
        self._session = session or requests.Session()
        self._timeout = timeout
        self._jitter = jitter
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        # Wall-clock start of this process: with `sequence` it orders reports across restarts.
        self.process_started_at = time.time()
        self._sequence = 0
        self._log_acked = 0  # highest log line number the control plane has accepted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Undo what start_usage_reporter installed around the reporter (log handlers).
        self.on_stop: list[Callable[[], None]] = []
        self.delivered = 0
        self.dropped = 0
        self.withheld = 0  # reports not sent while the consumer was stalled

    # -- one report ---------------------------------------------------------------------------

    def build_report(self) -> dict[str, Any] | None:
        """The next report, or None once the worker has stopped (nothing left to report)."""
        snapshot = self._state.snapshot()
        phase = str(snapshot.phase)
        if phase not in REPORTED_STATES:
            return None
        if not snapshot.consuming:
            self._withhold()
            return None
        if self.withheld:
            log.info("usage reports resume: the consumer takes messages again")
            self.withheld = 0
        self._sequence += 1
        report: dict[str, Any] = {
            "version": REPORT_VERSION,
            "process_started_at": round(self.process_started_at, 6),
            "sequence": self._sequence,
            "state": phase,
            "uptime_seconds": _seconds(snapshot.uptime_seconds),
            "model_load_seconds": (
                None
                if snapshot.model_load_seconds is None
                else _seconds(snapshot.model_load_seconds)
            ),
            "transcriptions": {
                "succeeded": snapshot.jobs_succeeded,
                "failed": snapshot.jobs_failed,
            },
            "processing_seconds": _seconds(snapshot.processing_seconds),
            "audio_seconds": _seconds(snapshot.audio_seconds),
            "host": self._host.sample().to_json(),
            "gpu": self._gpus.sample().to_json(),
        }
        if self._log_tail is not None:
            report["log"] = self._log_lines(self._log_tail)
        return report

    def _log_lines(self, tail: LogTail) -> list[dict[str, Any]]:
        """The unacknowledged lines, oldest first, within the report's byte budget."""
        lines: list[dict[str, Any]] = []
        size = 0
        for line in tail.since(self._log_acked, MAX_LOG_LINES):
            item = line.to_json()
            size += len(json.dumps(item)) + 1  # as requests encodes it, with its comma
            if size > MAX_LOG_BYTES_PER_REPORT and lines:
                break
            lines.append(item)
        return lines

    def send_once(self) -> bool:
        """Build and post one report; True when the control plane accepted it."""
        report = self.build_report()
        if report is None:
            return False
        headers = {"Authorization": f"Bearer {self._token.get_secret_value()}"}
        try:
            response = self._session.post(
                self._url,
                json=report,
                headers=headers,
                timeout=self._timeout,
                # A redirect could send the credential somewhere else; the control plane
                # never redirects this endpoint.
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            # requests puts the URL into its messages; only the exception type is safe.
            self._drop(report["sequence"], f"no answer ({type(exc).__name__})")
            return False
        with response:
            if response.status_code != 200:
                self._drop(report["sequence"], f"HTTP {response.status_code} {_code(response)}")
                return False
        self.delivered += 1
        lines = report.get("log") or []
        if lines:
            self._log_acked = max(self._log_acked, lines[-1]["number"])
        return True

    def _withhold(self) -> None:
        if not self.withheld:
            log.warning("usage reports withheld: the consumer is stalled and takes no job")
        self.withheld += 1

    def _drop(self, sequence: int, why: str) -> None:
        self.dropped += 1
        log.warning("usage report %d dropped: %s", sequence, why)

    # -- the thread ---------------------------------------------------------------------------

    def next_delay(self) -> float:
        return self._interval * self._rng.uniform(1 - self._jitter, 1 + self._jitter)

    def run(self) -> None:
        """Report now, then every interval (jittered) until stopped or the worker stops."""
        while not self._stop.is_set():
            try:
                if str(self._state.snapshot().phase) not in REPORTED_STATES:
                    return
                self.send_once()
            except Exception as exc:
                # A bug here must not end reporting for the life of the worker, nor reach the
                # job path. No traceback: its text could quote the request.
                log.error("usage report failed unexpectedly (%s); continuing", type(exc).__name__)
            self._stop.wait(self.next_delay())

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self.run, name="usage-reporter", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while self.on_stop:
            self.on_stop.pop()()
        close = getattr(self._gpus, "close", None)
        if callable(close):  # NVML keeps the driver open until told otherwise
            close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def _code(response: requests.Response) -> str:
    """The API error code of a refusal (never the message, which we do not control)."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return ""
    return str(code)[:64] if isinstance(code, str) else ""


class ReportingRuntime(Protocol):
    """The parts of gpu_worker.runtime.RuntimeProfile that decide whether and where to report."""

    @property
    def observability_enabled(self) -> bool: ...
    @property
    def report_interval_seconds(self) -> float: ...
    @property
    def identity(self) -> ReportingIdentity | None: ...


class ReportingIdentity(Protocol):
    @property
    def worker_id(self) -> str: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def token(self) -> SecretStr: ...
    @property
    def control_url(self) -> str: ...
    @property
    def broker_url(self) -> SecretStr: ...


def start_usage_reporter(
    runtime: ReportingRuntime, state: StateSource, *, log_capacity: int = 200
) -> UsageReporter | None:
    """Start reporting for this process if the runtime enables it; call before loading models.

    Also installs the redacted log tail on the root logger, so the report carries the last
    lines this process logged. Returns None when reporting is off or there is no identity.
    """
    identity = runtime.identity
    if not runtime.observability_enabled or identity is None:
        return None
    tail = LogTail(
        log_capacity,
        secrets=(identity.token.get_secret_value(), identity.broker_url.get_secret_value()),
    )
    root = logging.getLogger()
    root.addHandler(tail)
    detach = _keep_attached_through_celery(tail)
    reporter = UsageReporter(
        control_url=identity.control_url,
        worker_id=identity.worker_id,
        instance_id=identity.instance_id,
        token=identity.token,
        state=state,
        interval_seconds=runtime.report_interval_seconds,
        log_tail=tail,
    )
    reporter.on_stop += [lambda: logging.getLogger().removeHandler(tail), detach]
    reporter.start()
    log.info("usage reports every %.0f s (±10 %%)", runtime.report_interval_seconds)
    return reporter


def _keep_attached_through_celery(tail: LogTail) -> Callable[[], None]:
    """Re-attach the tail after Celery configures logging; returns how to stop doing so.

    A Celery worker starting up empties the root logger's handlers
    (worker_hijack_root_logger), which would silently end the tail at the moment the worker
    starts consuming. Its after_setup_logger signal hands over the reconfigured root logger.
    """
    try:
        from celery.signals import after_setup_logger
    except ImportError:  # not a Celery process: nothing will remove the handler
        return lambda: None

    def reattach(logger: logging.Logger | None = None, **_: Any) -> None:
        if logger is not None and tail not in logger.handlers:
            logger.addHandler(tail)

    after_setup_logger.connect(reattach, weak=False)
    return lambda: after_setup_logger.disconnect(reattach)
