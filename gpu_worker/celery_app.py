"""The worker-side Celery app: reliability settings and the `murmur.transcribe` task.

The worker consumes only its profile's queue `transcribe.<profile>` with the solo pool (the
model lives in this process), one job at a time, acknowledging a message only after the job
returns. It keeps no results: the job's record of truth is the control plane's database.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject

from gpu_worker.broker_tls import celery_broker
from gpu_worker.client import ControlPlaneError, ControlPlaneUnavailable
from gpu_worker.jobs import DrainDeadlineExceeded, Outcome
from gpu_worker.protocol.broker import TRANSCRIBE_TASK, VISIBILITY_TIMEOUT_SECONDS, unacked_keys

log = logging.getLogger(__name__)

# A claim or result call that found the control plane down is retried as a whole task,
# with back-off well below the visibility timeout (long ETAs are redelivered over and over).
MAX_RETRIES = 5
RETRY_BACKOFF_MAX_SECONDS = 60


def celery_config(
    broker_url: str,
    queue: str,
    master_name: str | None = None,
    broker_ca_certs: str | None = None,
) -> dict[str, Any]:
    # A sentinel:// broker names the Redis primary through Sentinel: kombu needs its name.
    sentinel = {"master_name": master_name} if master_name else {}
    return {
        # rediss://: the broker's certificate is verified against `broker_ca_certs` (or the
        # system's CAs), whatever the URL's query says (gpu_worker/broker_tls.py).
        **celery_broker(broker_url, broker_ca_certs),
        "broker_connection_retry_on_startup": True,
        # In-flight messages under this queue's own keys (gpu_worker/protocol/broker.py).
        "broker_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
            **sentinel,
            **unacked_keys(queue),
        },
        "visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": 1,
        "worker_pool": "solo",
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # No remote control (`celery inspect`/`control`, Flower's worker actions): on a broker
        # shared with other workers it would take orders (shutdown, revoke) from any of them.
        "worker_enable_remote_control": False,
        # Declared by name: Celery creates the queue (a Redis list) on first use.
        "task_queues": {queue: {}},
        "task_default_queue": queue,
        "task_routes": {TRANSCRIBE_TASK: {"queue": queue}},
        "accept_content": ["json"],
        "task_serializer": "json",
        "timezone": "UTC",
    }


def retry_countdown(retries: int) -> float:
    """Exponential back-off with jitter, capped well below the visibility timeout."""
    return float(min(RETRY_BACKOFF_MAX_SECONDS, 2**retries) * (0.5 + random.random() / 2))


def make_celery(
    broker_url: str,
    queue: str,
    run_job: Callable[[str], Outcome],
    on_retired: Callable[[], None] = lambda: os.kill(os.getpid(), signal.SIGTERM),
    master_name: str | None = None,
    broker_ca_certs: str | None = None,
) -> Celery:
    """A Celery app whose `murmur.transcribe` task calls `run_job(job_id)`.

    No failure of ours acknowledges a message without the job being settled: the control plane
    unreachable is retried, then the message is handed back; a credential the control plane
    no longer accepts (this worker was retired) hands the message back and stops the worker.
    """
    app = Celery("murmur-worker", set_as_current=False)
    app.conf.update(celery_config(broker_url, queue, master_name, broker_ca_certs))

    def transcribe(task: Task, job_id: str) -> str:
        try:
            return run_job(job_id).value
        except DrainDeadlineExceeded:
            # The worker is shutting down and the job did not finish in time: put the
            # message back on the queue at once (not after the visibility timeout).
            raise Reject(
                "drain deadline reached; job handed back to the queue", requeue=True
            ) from None
        except ControlPlaneUnavailable as exc:
            if task.request.retries >= MAX_RETRIES:
                raise Reject(
                    "control plane unreachable; job handed back to the queue", requeue=True
                ) from None
            raise task.retry(exc=exc, countdown=retry_countdown(task.request.retries)) from None
        except ControlPlaneError as exc:
            if exc.status in (401, 403):
                log.error(
                    "the control plane no longer accepts this worker (%s); stopping", exc.code
                )
                on_retired()
                raise Reject("worker retired; job handed back to the queue", requeue=True) from None
            raise

    # Registered with a call, not a decorator: the task function stays typed for mypy.
    app.task(
        name=TRANSCRIBE_TASK,
        bind=True,
        # Not shared: a shared task is added to every Celery app created later in the process.
        shared=False,
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=MAX_RETRIES,
    )(transcribe)
    return app
