"""Whether this worker still holds its job: a cheap, rate-limited check between segments.

A worker holds no database credentials and the broker carries no cancel message, so it learns
that its job was cancelled (or re-routed, or finished elsewhere) by asking. The transcriber
calls a `CancelWatch` between segments; at most once per `interval_seconds` the watch asks the
control plane whether this worker still holds the job, and raises `JobCancelled` when it does
not. A check that fails never stops the job: the control plane refuses a late result anyway,
so carrying on only wastes time, while stopping on a network hiccup would lose work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from gpu_worker.client import ControlPlaneError

log = logging.getLogger(__name__)

# A cancelled job stops within this plus the time of one segment (or one batch).
CHECK_INTERVAL_SECONDS = 2.0


class JobCancelled(Exception):
    """The control plane no longer has this worker on the job: stop and store nothing."""


class HoldCheck(Protocol):
    def job_held(self, job_id: str) -> bool: ...


class CancelWatch:
    """Callable between segments; raises JobCancelled once the job is no longer ours."""

    def __init__(
        self,
        client: HoldCheck,
        job_id: str,
        *,
        interval_seconds: float = CHECK_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._job_id = job_id
        self._interval = interval_seconds
        self._clock = clock
        self._last = clock()  # the claim just said the job is ours

    def __call__(self) -> None:
        now = self._clock()
        if now - self._last < self._interval:
            return
        self._last = now
        try:
            held = self._client.job_held(self._job_id)
        except ControlPlaneError as exc:
            log.warning("job %s: status check failed, carrying on: %s", self._job_id, exc)
            return
        if not held:
            raise JobCancelled(f"job {self._job_id} is no longer held by this worker")
