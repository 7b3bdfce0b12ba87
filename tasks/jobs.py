"""I/O-queue tasks of the jobs domain: fetching URL inputs (app/jobs/fetch.py) and
delivering webhooks (app/jobs/delivery.py). Each holds a slot of its kind while it waits on a
peer (app/jobs/io_slots.py); one that finds none (or finds the audio store away) is retried with
its own back-off (`busy_countdown`) for as long as `SLOT_WAIT_SECONDS` from its first try: the
tasks set `max_retries=None`, since `self.retry(max_retries=None)` alone means Celery's default
cap (3), after which the job sat queued until the resend sweep (issue 32 §5). Past the wait
deadline a fetch fails its job saying why; a webhook is failed by its next try once past its
delivery deadline (`webhooks.DELIVERY_DEADLINE`, the same 30 minutes, counted from the job's
end), never left to the sweep."""

from __future__ import annotations

import logging

from celery import Task
from celery.exceptions import Retry

from app.celery_config import DELIVER_WEBHOOK, FETCH_AUDIO, SWEEP_FETCHES, SWEEP_WEBHOOKS
from app.jobs import delivery, fetch
from app.jobs.fetch_spool import FetchSpool
from app.jobs.io_slots import SLOT_WAIT_SECONDS, SlotsBusy, busy_countdown
from tasks import context
from tasks.celery_app import celery_app

log = logging.getLogger(__name__)


def _waited(since: float | None, now: float) -> tuple[float, float]:
    """(first try's epoch seconds, seconds waited since)."""
    first = now if since is None else since
    return first, max(0.0, now - first)


@celery_app.task(
    name=FETCH_AUDIO.name, bind=True, acks_late=True, ignore_result=True, max_retries=None
)
def fetch_audio(self: Task, job_id: str, waiting_since: float | None = None) -> None:
    """Download a URL job's audio, store it, then dispatch it; or end the job with why not."""
    svc = context.services()
    try:
        fetch.fetch_audio(svc, context.io_slots(), job_id)
    except SlotsBusy as busy:
        since, waited = _waited(waiting_since, svc.clock().timestamp())
        if waited >= SLOT_WAIT_SECONDS:
            fetch.give_up_waiting(svc, job_id, busy.kind, waited)
            return
        # The job stays queued; its fetch waits for a slot (the retry is a new message on
        # the broker, as durable as this one, which is acknowledged once it is sent).
        raise self.retry(
            args=[job_id],
            kwargs={"waiting_since": since},
            countdown=busy_countdown(self.request.retries),
            max_retries=None,
        ) from None


@celery_app.task(
    name=DELIVER_WEBHOOK.name, bind=True, acks_late=True, ignore_result=True, max_retries=None
)
def deliver_webhook(self: Task, job_id: str, waiting_since: float | None = None) -> None:
    """One attempt at a finished job's webhook, if one is due.

    A failed attempt is tried again when its back-off ends by a retry of this task; should
    Redis lose that retry, the sweep makes the attempt instead (the claim lets only one send).
    """
    svc = context.services()
    since: float | None
    try:
        settled = delivery.attempt_webhook(
            svc.settings, svc.db, job_id, svc.clock, context.io_slots()
        )
    except SlotsBusy:
        # No attempt was claimed: the webhook stays due, for this retry (or the sweep), until
        # its delivery deadline, when the next of them fails it (app/jobs/webhooks.py).
        since, _ = _waited(waiting_since, svc.clock().timestamp())
        countdown = busy_countdown(self.request.retries)
    else:
        if settled is None or settled.next_at is None:
            return
        since, countdown = None, max(0.0, (settled.next_at - svc.clock()).total_seconds())
    try:
        raise self.retry(
            args=[job_id],
            kwargs={"waiting_since": since},
            countdown=countdown,
            max_retries=None,
        )
    except Retry:
        raise
    except Exception as exc:  # the broker refused the retry: the sweep will make it
        log.warning("could not schedule the webhook retry for %s: %s", job_id, type(exc).__name__)


@celery_app.task(name=SWEEP_WEBHOOKS.name, ignore_result=True)
def sweep_webhooks() -> int:
    """Beat: attempt every due webhook, from the database's state (whatever Redis lost)."""
    svc = context.services()
    return delivery.deliver_due(svc.settings, svc.db, svc.clock, context.io_slots())


@celery_app.task(name=SWEEP_FETCHES.name, ignore_result=True)
def sweep_fetches() -> int:
    """Beat: send again the fetch of every URL job whose message was lost, and delete kept
    downloads past their age (app/jobs/fetch_spool.py)."""
    svc = context.services()
    FetchSpool.of(svc.settings).prune()
    return fetch.resend_stranded(svc)
