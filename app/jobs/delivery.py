"""Delivering a finished job's webhook: one signed POST per attempt, its state in the database.

Webhook delivery state lives in the database (app/jobs/webhooks.py): a task queued when a job
ends makes the first attempt at once and retries itself after each back-off, and the beat's
sweep attempts every webhook that is due, so a lost task, a lost retry or a broker that lost
its data delays a webhook by one sweep, never loses it.

Each attempt holds a webhook slot (app/jobs/io_slots.py), taken before the attempt is claimed:
with none free the task raises `SlotsBusy` and tries again shortly, and the sweep leaves that
webhook due for a later round; either way no attempt is counted. A webhook found due past its
delivery deadline (app/jobs/webhooks.py DELIVERY_DEADLINE) is failed at once, by the task or
the sweep, whichever comes first, with the same log line as one whose attempts ran out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any

import requests
from sqlalchemy import select

from app.config import Settings
from app.db import Database
from app.deadline import exchange_deadline
from app.errors import Refused
from app.jobs import service, webhooks
from app.jobs.io_slots import WEBHOOK_DEADLINE_SECONDS, IoSlots, SlotsBusy
from app.models import Job, WebhookStatus
from app.services import Clock
from app.urls import check_url, pinned_session

log = logging.getLogger(__name__)

WEBHOOK_TIMEOUT = (5.0, 10.0)
# One attempt, connect to status line, ends well within the lease that keeps another deliverer
# off it (app/jobs/webhooks.py LEASE, 60 s): an attempt never outlives its lease, so a slow
# receiver is not sent the same attempt twice.
# WEBHOOK_DEADLINE_SECONDS: app/jobs/io_slots.py.
SIGNATURE_HEADER = "X-Murmur-Signature"
# One sweep attempts at most this many webhooks and starts none after this long: with every
# receiver timing out, a sweep still ends well within a few beat intervals.
SWEEP_LIMIT = 50
SWEEP_BUDGET_SECONDS = 60.0


def webhook_payload(job: Any) -> dict[str, Any]:
    body = service.job_json(job)
    body["event"] = f"job.{job.status}"
    return body


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """`t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`: receivers verify and reject replays."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def deliver_due(
    settings: Settings,
    db: Database,
    clock: Clock,
    slots: IoSlots,
    *,
    limit: int = SWEEP_LIMIT,
    budget_seconds: float = SWEEP_BUDGET_SECONDS,
) -> int:
    """Attempt due webhooks one after another, within a bounded count and time; attempts made.

    Inline rather than one task each: a sweep every few seconds must not pile duplicate tasks
    onto a busy control queue, and what it leaves undone is still due for the next sweep.
    """
    started = time.monotonic()
    made = 0
    for job_id in webhooks.due_webhooks(db, clock(), limit):
        if time.monotonic() - started > budget_seconds:
            break
        try:
            settled = attempt_webhook(settings, db, job_id, clock, slots)
        except SlotsBusy:
            continue  # still due: a later sweep, or its own task, makes the attempt
        if settled is not None:
            made += 1
    return made


def attempt_webhook(
    settings: Settings, db: Database, job_id: str, clock: Clock, slots: IoSlots
) -> webhooks.Settled | None:
    """Claim, send and settle one attempt; the webhook's new state, or None if none was made.
    `SlotsBusy` when the job's token, or all tokens, have as many attempts running as allowed:
    nothing is claimed then."""
    with db.reader() as s:
        found = s.execute(
            select(Job.owner, Job.finished_at, Job.webhook_attempts).where(Job.id == job_id)
        ).one_or_none()
    if found is None:
        return None  # purged meanwhile
    owner, finished_at, tries = found
    now = clock()
    if webhooks.past_deadline(finished_at, now) and webhooks.expire(db, job_id, now):
        log.warning(
            "webhook for %s gave up after %d tries (%s)", job_id, tries, _past_deadline_reason()
        )
        return webhooks.Settled(WebhookStatus.FAILED, None)
    with slots.held(slots.webhooks, owner):
        attempt = webhooks.claim_attempt(db, job_id, clock())
        if attempt is None:
            return None  # not due: delivered, failed, waiting for its back-off, or being sent
        job = service.get_job(db, job_id)
        ok, reason = _send_webhook(settings, job, int(clock().timestamp()))
        settled = webhooks.settle_attempt(db, job_id, attempt, ok, clock())
    if settled is not None and settled.status is WebhookStatus.FAILED:
        log.warning("webhook for %s gave up after %d tries (%s)", job_id, attempt, reason)
    return settled


def _past_deadline_reason() -> str:
    seconds = int(webhooks.DELIVERY_DEADLINE.total_seconds())
    return f"not delivered within {seconds} s of the job's end: its deadline"


def _send_webhook(settings: Settings, job: Job, timestamp: int) -> tuple[bool, str]:
    """POST the signed summary once, signed at `timestamp`; (delivered, why not)."""
    if not job.webhook_url:
        return False, "no_webhook_url"
    body = json.dumps(webhook_payload(job), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "murmur-webhook/1",
        SIGNATURE_HEADER: sign_webhook(settings.reveal("webhook_secret"), timestamp, body),
    }
    try:
        checked = check_url(
            job.webhook_url, field="webhook_url", allow_private=settings.api.allow_private_urls
        )
        with (
            pinned_session(checked) as http,
            exchange_deadline(http, WEBHOOK_DEADLINE_SECONDS) as deadline,
        ):
            try:
                # Only the status counts: the body is never read, so a receiver's endless or
                # trickling answer costs no memory and no time (stream=True, closed unread).
                with http.post(
                    checked.url,
                    data=body,
                    headers=headers,
                    timeout=WEBHOOK_TIMEOUT,
                    allow_redirects=False,
                    stream=True,
                ) as response:
                    status = response.status_code
            except requests.RequestException as exc:
                return False, "deadline" if deadline.fired else type(exc).__name__
        if deadline.fired:  # headers cut short by the watchdog parse as if they had ended
            return False, "deadline"
        return 200 <= status < 300, f"HTTP {status}"
    except Refused as err:
        return False, err.code
