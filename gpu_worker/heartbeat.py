"""The worker's liveness signal when usage reports are off: a tiny authenticated POST per interval.

The fleet deletes a worker it has not heard from for three intervals and re-routes its job, so
a crashed worker process on a still-running machine does not hold a job (and a bill) forever.
With usage reports on, each report is the heartbeat and this thread is not started.

Like a usage report, no heartbeat is sent while the worker state says its Celery consumer is
stalled (gpu_worker/liveness.py): a process that cannot take a job must not look alive.
"""

from __future__ import annotations

import logging
import threading

from gpu_worker.client import ControlPlaneClient, ControlPlaneError
from gpu_worker.state import WorkerState

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        client: ControlPlaneClient,
        interval_seconds: float,
        state: WorkerState | None = None,
    ) -> None:
        # A client of its own: requests sessions are not shared across threads.
        self._client = client
        self._state = state
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.delivered = 0
        self.withheld = 0

    def beat(self) -> bool:
        if self._state is not None and not self._state.snapshot().consuming:
            if not self.withheld:
                log.warning("heartbeats withheld: the consumer is stalled and takes no job")
            self.withheld += 1
            return False
        self.withheld = 0
        try:
            self._client.heartbeat()
        except ControlPlaneError as exc:  # its message names the path and status, no secret
            log.warning("heartbeat lost: %s", exc)
            return False
        self.delivered += 1
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
