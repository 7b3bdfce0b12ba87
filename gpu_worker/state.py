"""What this worker process is doing and has done: the seam a usage reporter reads from.

The job path and the service write to one `WorkerState`; the usage reporter
(gpu_worker/reporter.py) calls `snapshot()` every report interval and posts it. All methods
are thread-safe.

`consuming` is False only while the consumer watch (gpu_worker/liveness.py) has found the
Celery consumer stalled and no healthy check has followed: the reporter and the bare heartbeat
stay silent then, so the fleet never counts a worker that cannot take a job as live.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Literal

# How a claimed job ended in this process: "requeued" when a drain handed it back.
JobEnd = Literal["succeeded", "failed", "requeued"]


class Phase(enum.StrEnum):
    STARTING = "starting"  # validating the runtime, checking hardware and model files
    LOADING = "loading"  # loading the model
    READY = "ready"  # accepted by the control plane, waiting for a job
    BUSY = "busy"  # running a job
    DRAINING = "draining"  # SIGTERM received: finishing the current job, then exiting
    STOPPED = "stopped"


@dataclass(frozen=True)
class StateSnapshot:
    phase: Phase
    current_job_id: str | None
    jobs_succeeded: int
    jobs_failed: int
    jobs_requeued: int
    processing_seconds: float
    audio_seconds: float
    model_load_seconds: float | None
    uptime_seconds: float
    # Not a report field: whether this process may be reported at all (see the module docstring).
    consuming: bool = True


class WorkerState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._phase = Phase.STARTING
        self._current_job_id: str | None = None
        self._succeeded = 0
        self._failed = 0
        self._requeued = 0
        self._processing_seconds = 0.0
        self._audio_seconds = 0.0
        self._model_load_seconds: float | None = None
        self._consumer_stalled = False

    @property
    def phase(self) -> Phase:
        with self._lock:
            return self._phase

    def set_phase(self, phase: Phase) -> None:
        with self._lock:
            # Draining is final until the process stops: a finishing job must not flip the
            # worker back to ready.
            if self._phase is Phase.DRAINING and phase is not Phase.STOPPED:
                return
            self._phase = phase

    def model_loaded(self, seconds: float) -> None:
        with self._lock:
            self._model_load_seconds = seconds

    def job_started(self, job_id: str) -> None:
        with self._lock:
            self._current_job_id = job_id
            if self._phase is not Phase.DRAINING:
                self._phase = Phase.BUSY

    def job_finished(self, end: JobEnd, *, processing_seconds: float, audio_seconds: float) -> None:
        with self._lock:
            self._current_job_id = None
            if end == "succeeded":
                self._succeeded += 1
            elif end == "failed":
                self._failed += 1
            else:
                self._requeued += 1
            self._processing_seconds += processing_seconds
            self._audio_seconds += audio_seconds
            if self._phase is Phase.BUSY:
                self._phase = Phase.READY

    def consumer_stalled(self) -> None:
        """The consumer holds its prefetch window with no job running: it takes nothing."""
        with self._lock:
            self._consumer_stalled = True

    def consumer_alive(self) -> None:
        """A check of the consumer found it able to take a message (or working on one)."""
        with self._lock:
            self._consumer_stalled = False

    def begin_drain(self) -> bool:
        """Enter draining; returns whether a job is running right now."""
        with self._lock:
            if self._phase is not Phase.STOPPED:
                self._phase = Phase.DRAINING
            return self._current_job_id is not None

    def snapshot(self) -> StateSnapshot:
        with self._lock:
            return StateSnapshot(
                phase=self._phase,
                current_job_id=self._current_job_id,
                jobs_succeeded=self._succeeded,
                jobs_failed=self._failed,
                jobs_requeued=self._requeued,
                processing_seconds=self._processing_seconds,
                audio_seconds=self._audio_seconds,
                model_load_seconds=self._model_load_seconds,
                uptime_seconds=time.monotonic() - self._started,
                consuming=not self._consumer_stalled,
            )
