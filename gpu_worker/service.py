"""One worker process: load the model, report ready, serve the profile's queue until drained.

Shutdown. Celery's warm shutdown (SIGTERM) sets a flag that its event loop checks between
messages; with the solo pool the running job is a plain call inside that loop, so the job
finishes, its message is acknowledged, and the worker exits without taking another. The
one thing Celery does not bound is how long that takes, so `Drain` arms a timer when
SIGTERM arrives during a job: at MURMUR_DRAIN_TIMEOUT it raises DrainDeadlineExceeded
inside the job, and the task rejects its message with requeue, so another worker picks the
job up at once instead of after the broker's visibility timeout. SIGQUIT (cold shutdown)
hands the running job back immediately.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from celery.signals import worker_shutting_down

from gpu_worker.celery_app import make_celery
from gpu_worker.client import ControlPlaneClient, ControlPlaneError, RuntimeMismatch
from gpu_worker.heartbeat import Heartbeat
from gpu_worker.jobs import DrainDeadlineExceeded, JobContext, Outcome, process_job
from gpu_worker.liveness import ConsumerWatch, consumer_liveness_step
from gpu_worker.preflight import Preflight
from gpu_worker.protocol.runtime import EXIT_RUNTIME_MISMATCH
from gpu_worker.protocol.usage import REPORT_TIMEOUT
from gpu_worker.reporter import start_usage_reporter
from gpu_worker.runtime import RuntimeProfile, WorkerIdentity, image_pull_seconds
from gpu_worker.state import Phase, WorkerState
from gpu_worker.transcriber import load_diarizer, load_transcriber

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1


class Drain:
    """Bounds a SIGTERM drain: the running job gets `timeout_seconds`, then is handed back."""

    def __init__(self, state: WorkerState, timeout_seconds: float) -> None:
        self._state = state
        self._timeout = timeout_seconds
        self._deadline: float | None = None
        self._running = False

    def run(self, job_id: str, job: Callable[[str], Outcome]) -> Outcome:
        self._running = True
        if self._deadline is not None:
            # A message taken just as SIGTERM arrived gets only what is left of the drain.
            self._arm(max(self._deadline - time.monotonic(), 0.001))
        try:
            return job(job_id)
        finally:
            self._running = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    def on_shutdown(self, sender: Any = None, how: str = "Warm", **_: Any) -> None:
        """Receiver of Celery's worker_shutting_down; runs in the main thread's handler."""
        busy = self._state.begin_drain()
        timeout = self._timeout if how == "Warm" else 0.001
        self._deadline = time.monotonic() + timeout
        log.info(
            "%s shutdown: %s",
            how,
            f"finishing the current job (at most {timeout:g} s)" if busy else "idle, stopping",
        )
        if self._running:
            self._arm(timeout)

    def _arm(self, seconds: float) -> None:
        signal.signal(signal.SIGALRM, self._expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def _expire(self, signum: int, frame: FrameType | None) -> None:
        if self._running:
            log.warning("drain deadline reached: handing the running job back to the queue")
            raise DrainDeadlineExceeded()


def serve(preflight: Preflight, *, state: WorkerState | None = None, loglevel: str = "INFO") -> int:
    """Load, report ready and consume; returns the process exit code."""
    profile = preflight.profile
    identity = profile.identity
    if identity is None:
        raise ValueError("serve() needs a runtime with the worker identity")
    state = state or WorkerState()
    # Usage reports start before the model loads, so a slow or failed load is visible too.
    reporter = start_usage_reporter(profile, state)  # None when reporting is off
    heartbeat = None
    if reporter is None:  # without reports the fleet still needs to know this process lives
        client = ControlPlaneClient(
            identity.control_url,
            identity.worker_id,
            identity.instance_id,
            identity.token,
            # A heartbeat waits no longer than a report: the fleet's silence rule counts one
            # such timeout per interval (gpu_worker/protocol/usage.py).
            timeout=REPORT_TIMEOUT,
        )
        heartbeat = Heartbeat(client, profile.report_interval_seconds, state)
        heartbeat.start()
    try:
        return _serve(preflight, profile, identity, state, loglevel)
    finally:
        for beat in (reporter, heartbeat):
            if beat is not None:
                beat.stop(timeout=2)


def _serve(
    preflight: Preflight,
    profile: RuntimeProfile,
    identity: WorkerIdentity,
    state: WorkerState,
    loglevel: str,
) -> int:
    state.set_phase(Phase.LOADING)
    started = time.monotonic()
    try:
        transcriber = load_transcriber(profile, preflight.model, alignment=preflight.alignment)
    except Exception:
        # The checks passed, so this is a library or driver failure: say so and exit; the
        # fleet's boot timeout replaces a worker that never reports ready.
        log.exception("loading model %s failed", profile.model)
        return EXIT_FAILED
    diarizer = None
    if preflight.diarization is not None:
        try:
            diarizer = load_diarizer(profile, preflight.diarization)
        except Exception:
            log.exception("loading diarization weights %s failed", profile.diarization)
            return EXIT_FAILED
    load_seconds = time.monotonic() - started
    state.model_loaded(load_seconds)
    log.info("model %s loaded in %.2f s (%s)", profile.model, load_seconds, transcriber.backend)

    client = ControlPlaneClient(
        identity.control_url, identity.worker_id, identity.instance_id, identity.token
    )
    # The pull is a lifecycle timing the control plane exports per profile; None: not pulled.
    runtime = preflight.runtime(
        model_load_seconds=round(load_seconds, 3), image_pull_seconds=image_pull_seconds(os.environ)
    )
    try:
        client.ready(runtime)
    except RuntimeMismatch as exc:
        log.error("the control plane refused this runtime, exiting: %s", exc)
        return EXIT_RUNTIME_MISMATCH
    except ControlPlaneError as exc:
        log.error("could not report ready: %s", exc)
        return EXIT_FAILED
    state.set_phase(Phase.READY)

    context = JobContext(client=client, transcriber=transcriber, state=state, diarizer=diarizer)
    drain = Drain(state, profile.drain_timeout_seconds)
    worker_shutting_down.connect(drain.on_shutdown, weak=False, dispatch_uid="murmur-drain")

    def run_job(job_id: str) -> Outcome:
        return drain.run(job_id, lambda job: process_job(job, context))

    app = make_celery(
        identity.broker_url.get_secret_value(),
        profile.queue,
        run_job,
        master_name=identity.broker_master_name,
        broker_ca_certs=identity.broker_ca_certs,
    )
    # Restarts a consumer left stalled by an acknowledgement lost with the broker, and keeps a
    # stalled worker from being reported live (gpu_worker/liveness.py).
    app.steps["consumer"].add(consumer_liveness_step(ConsumerWatch(state)))
    worker = app.Worker(
        hostname=f"{identity.worker_id}@{identity.instance_id}",
        pool_cls="solo",
        concurrency=1,
        queues=[profile.queue],
        loglevel=loglevel,
        # Mingle and gossip synchronise with other workers; a transcription worker needs
        # neither and would only start slower and listen to every worker's events.
        without_mingle=True,
        without_gossip=True,
    )
    log.info("consuming %s", profile.queue)
    worker.start()
    state.set_phase(Phase.STOPPED)
    return int(worker.exitcode or EXIT_OK)
