"""The control plane's Celery app, as configuration: broker settings, reliability options,
the beat schedule, and the control plane's tasks, each named once with its queue (`ControlTask`).

The same broker carries the `control` queue (the reconcile), the `io` queue (URL fetches,
webhook deliveries and their sweep, retention) and one `transcribe.<profile>` queue per
profile, which only GPU workers consume; the task and queue names and the visibility timeout
are the wire contract's (gpu_worker/protocol/broker.py).

Invariant: nothing that waits on a peer (a URL's server, a webhook receiver, the audio store)
is routed to `control`. The control worker consumes `control` only, so the reconcile (which
dispatches, provisions and deletes) never waits behind a client's slow server; the I/O
worker consumes `io` with a thread pool, and app/jobs/io_slots.py bounds how many fetches and
deliveries run at once, in all and per API token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Celery

from app.broker import celery_broker_settings
from app.config import Settings
from app.redis_primary import broker_transport_options
from gpu_worker.protocol.broker import VISIBILITY_TIMEOUT_SECONDS

CONTROL_QUEUE = "control"
IO_QUEUE = "io"


@dataclass(frozen=True)
class ControlTask:
    """A task of the control plane and the queue it runs on. The domain that needs it sends
    it through this object; tasks/ registers its body under `name`. Nowhere else is the name
    spelled. (The names keep their `murmur.control.` prefix whatever the queue: a message
    queued before an upgrade still finds its task.)"""

    name: str
    queue: str = CONTROL_QUEUE

    def send(self, celery: Celery, *args: str, **options: Any) -> None:
        celery.send_task(self.name, args=list(args), queue=self.queue, **options)


RECONCILE = ControlTask("murmur.control.reconcile")
FETCH_AUDIO = ControlTask("murmur.control.fetch_audio", IO_QUEUE)
DELIVER_WEBHOOK = ControlTask("murmur.control.deliver_webhook", IO_QUEUE)
SWEEP_WEBHOOKS = ControlTask("murmur.control.sweep_webhooks", IO_QUEUE)
SWEEP_RETENTION = ControlTask("murmur.control.sweep_retention", IO_QUEUE)
SWEEP_FETCHES = ControlTask("murmur.control.sweep_fetches", IO_QUEUE)
CONTROL_TASKS = (
    RECONCILE,
    FETCH_AUDIO,
    DELIVER_WEBHOOK,
    SWEEP_WEBHOOKS,
    SWEEP_RETENTION,
    SWEEP_FETCHES,
)
# Beat's housekeeping, sent every few seconds: its workers send no task events for it, and
# beat sends no task-sent events (tasks/celery_app.py), so Flower's task list and the
# exporter's task counters hold the work an operator follows (jobs' transcriptions, URL
# fetches, webhook deliveries), not hundreds of reconcile and sweep runs. The reconcile's
# health is Murmur's own metric (murmur_fleet_reconcile_age_seconds, /readyz).
HOUSEKEEPING = (RECONCILE, SWEEP_WEBHOOKS, SWEEP_RETENTION, SWEEP_FETCHES)


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        # rediss://: the broker's certificate is always verified (gpu_worker/broker_tls.py).
        **celery_broker_settings(settings),
        "broker_connection_retry_on_startup": True,
        # An API request that finds the broker down answers quickly instead of hanging.
        "broker_connection_timeout": 2.0,
        "broker_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
            **broker_transport_options(settings),
        },
        "visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_annotations": {task.name: {"send_events": False} for task in HOUSEKEEPING},
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # The control worker takes no remote control (shutdown, revoke, pool changes): GPU
        # workers share its broker. Flower and `celery inspect` get no answer from it; its
        # events still show it (docs/deploy-workers.md, "The broker").
        "worker_enable_remote_control": False,
        "task_default_queue": CONTROL_QUEUE,
        "task_routes": {task.name: {"queue": task.queue} for task in CONTROL_TASKS},
        "beat_schedule": {
            "reconcile": {
                "task": RECONCILE.name,
                "schedule": settings.fleet.reconcile_interval_seconds,
                "options": {
                    "queue": RECONCILE.queue,
                    "expires": settings.fleet.reconcile_interval_seconds,
                },
            },
            # Webhook retries are due times in the database, not ETA tasks Redis could lose.
            "webhooks": {
                "task": SWEEP_WEBHOOKS.name,
                "schedule": settings.fleet.reconcile_interval_seconds,
                "options": {
                    "queue": SWEEP_WEBHOOKS.queue,
                    "expires": settings.fleet.reconcile_interval_seconds,
                },
            },
            # A URL job's fetch message lost with Redis is sent again (app/jobs/fetch.py).
            "fetches": {
                "task": SWEEP_FETCHES.name,
                "schedule": 60.0,
                "options": {"queue": SWEEP_FETCHES.queue, "expires": 60.0},
            },
            "retention": {
                "task": SWEEP_RETENTION.name,
                "schedule": settings.retention.sweep_interval_seconds,
                "options": {
                    "queue": SWEEP_RETENTION.queue,
                    "expires": settings.retention.sweep_interval_seconds,
                },
            },
        },
        "timezone": "UTC",
    }


def make_celery(settings: Settings) -> Celery:
    app = Celery("murmur")
    app.conf.update(celery_config(settings))
    return app
