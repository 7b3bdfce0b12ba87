"""Control-queue tasks of the jobs domain: fetching URL inputs and delivering webhooks.

Webhook delivery state lives in the database (app/jobs/webhooks.py): a task queued when a job
ends makes the first attempt at once and retries itself after each back-off, and the beat's
sweep attempts every webhook that is due, so a lost task, a lost retry or a broker that lost
its data delays a webhook by one sweep, never loses it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from celery import Task
from celery.exceptions import Retry
from sqlalchemy import update

from app.audio import probe_audio
from app.celery_config import DELIVER_WEBHOOK, FETCH_AUDIO, SWEEP_WEBHOOKS
from app.config import Settings
from app.db import Database, rows_changed
from app.deadline import exchange_deadline
from app.errors import ApiError
from app.jobs import service, webhooks
from app.models import Job, JobStatus, utcnow
from app.storage import LocalAudioStore
from app.urls import check_url, pinned_session
from tasks import context
from tasks.celery_app import celery_app

log = logging.getLogger(__name__)

FETCH_TIMEOUT = (5.0, 30.0)  # connect, read (each socket read)
# The whole exchange: connect, headers and body (app/deadline.py enforces it; a read timeout
# alone lets a server dripping bytes hold a worker for ever).
FETCH_DEADLINE_SECONDS = 300
WEBHOOK_TIMEOUT = (5.0, 10.0)
# One attempt, connect to status line, ends well within the lease that keeps another deliverer
# off it (app/jobs/webhooks.py LEASE, 60 s): an attempt never outlives its lease, so a slow
# receiver is not sent the same attempt twice.
WEBHOOK_DEADLINE_SECONDS = 20.0
SIGNATURE_HEADER = "X-Murmur-Signature"
# One sweep attempts at most this many webhooks and starts none after this long: with every
# receiver timing out, a sweep still ends well within a few beat intervals.
SWEEP_LIMIT = 50
SWEEP_BUDGET_SECONDS = 60.0


def _store() -> LocalAudioStore:
    return LocalAudioStore(context.settings().storage_path)


@celery_app.task(name=FETCH_AUDIO.name, acks_late=True, ignore_result=True)
def fetch_audio(job_id: str) -> None:
    """Download a URL job's audio (SSRF-checked, size-capped), store it, then dispatch it."""
    settings = context.settings()
    db = context.database()
    job = service.get_job(db, job_id)
    if job.status != JobStatus.QUEUED.value or job.audio_key is not None or not job.source_url:
        return  # redelivered after success, or cancelled meanwhile
    store = _store()
    staged = store.staging_path()
    limit = settings.api.max_upload_bytes
    try:
        checked = check_url(job.source_url, allow_private=settings.api.allow_private_urls)
        with (
            pinned_session(checked) as http,
            exchange_deadline(http, FETCH_DEADLINE_SECONDS) as deadline,
        ):
            try:
                size = _download(http, checked.url, staged, limit)
            except Exception:
                if deadline.fired:
                    raise _too_slow() from None
                raise
            if deadline.fired:  # a response without a length just looks as if it ended
                raise _too_slow()
        info = probe_audio(staged, settings.api.max_audio_seconds)
    except ApiError as err:
        staged.unlink(missing_ok=True)
        code = "url_not_audio" if err.code in ("invalid_audio", "empty_file") else err.code
        message = err.message if code != "url_not_audio" else f"the URL's content: {err.message}"
        _fail(job_id, code, message)
        return
    except requests.RequestException as exc:
        staged.unlink(missing_ok=True)
        _fail(job_id, "url_fetch_failed", f"fetching the URL failed: {type(exc).__name__}")
        return
    except Exception as exc:
        # Anything else (disk full, a decoder error) must still end the job: a URL job left
        # queued without audio has no other path forward.
        staged.unlink(missing_ok=True)
        log.exception("fetching audio for %s failed", job_id)
        _fail(job_id, "url_fetch_failed", f"storing the URL's content failed: {type(exc).__name__}")
        return
    key = staged.name + ".audio"
    store.commit(staged, key)
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED.value, Job.audio_key.is_(None))
            .values(audio_key=key, size_bytes=size, duration_seconds=info.duration_seconds),
        )
    if not moved:
        store.delete(key)
        return
    service.try_dispatch_now(db, settings, celery_app, job_id)


def _too_slow() -> ApiError:
    return ApiError(
        422, "url_fetch_failed", f"the URL did not deliver within {FETCH_DEADLINE_SECONDS} s"
    )


def _download(http: requests.Session, url: str, staged: Path, limit: int) -> int:
    """Stream the URL's content into `staged`, refusing more than `limit` bytes; its size."""
    response = http.get(url, stream=True, timeout=FETCH_TIMEOUT, allow_redirects=False)
    if response.status_code != 200:
        raise ApiError(422, "url_fetch_failed", f"the URL answered HTTP {response.status_code}")
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, "url_too_large", f"the URL's content is larger than the limit of {limit} bytes"
        )
    size = 0
    with staged.open("wb") as out:
        for chunk in response.iter_content(chunk_size=256 * 1024):
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413,
                    "url_too_large",
                    f"the URL's content is larger than the limit of {limit} bytes",
                )
            out.write(chunk)
    return size


def _fail(job_id: str, code: str, message: str) -> None:
    db = context.database()
    if service.fail_job(db, job_id, code, message):
        service.announce_finished(context.redis_client(), celery_app, service.get_job(db, job_id))


def webhook_payload(job: Any) -> dict[str, Any]:
    body = service.job_json(job)
    body["event"] = f"job.{job.status}"
    return body


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """`t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`: receivers verify and reject replays."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@celery_app.task(name=DELIVER_WEBHOOK.name, bind=True, acks_late=True, ignore_result=True)
def deliver_webhook(self: Task, job_id: str) -> None:
    """One attempt at a finished job's webhook, if one is due.

    A failed attempt is tried again when its back-off ends by a retry of this task; should
    Redis lose that retry, the sweep makes the attempt instead (the claim lets only one send).
    """
    settled = attempt_webhook(context.settings(), context.database(), job_id)
    if settled is None or settled.next_at is None:
        return
    countdown = max(0.0, (settled.next_at - utcnow()).total_seconds())
    try:
        raise self.retry(countdown=countdown, max_retries=None)
    except Retry:
        raise
    except Exception as exc:  # the broker refused the retry: the sweep will make it
        log.warning("could not schedule the webhook retry for %s: %s", job_id, type(exc).__name__)


@celery_app.task(name=SWEEP_WEBHOOKS.name, ignore_result=True)
def sweep_webhooks() -> int:
    """Beat: attempt every due webhook, from the database's state (whatever Redis lost)."""
    return deliver_due(context.settings(), context.database())


def deliver_due(
    settings: Settings,
    db: Database,
    clock: Callable[[], datetime] = utcnow,
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
        if attempt_webhook(settings, db, job_id, clock) is not None:
            made += 1
    return made


def attempt_webhook(
    settings: Settings, db: Database, job_id: str, clock: Callable[[], datetime] = utcnow
) -> webhooks.Settled | None:
    """Claim, send and settle one attempt; the webhook's new state, or None if none was made."""
    attempt = webhooks.claim_attempt(db, job_id, clock())
    if attempt is None:
        return None  # not due: delivered, failed, waiting for its back-off, or being sent
    job = service.get_job(db, job_id)
    ok, reason = _send_webhook(settings, job)
    settled = webhooks.settle_attempt(db, job_id, attempt, ok, clock())
    if settled is not None and settled.status == "failed":
        log.warning("webhook for %s gave up after %d tries (%s)", job_id, attempt, reason)
    return settled


def _send_webhook(settings: Settings, job: Job) -> tuple[bool, str]:
    """POST the signed summary once; (delivered, why not)."""
    if not job.webhook_url:
        return False, "no_webhook_url"
    body = json.dumps(webhook_payload(job), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "murmur-webhook/1",
        SIGNATURE_HEADER: sign_webhook(settings.reveal("webhook_secret"), int(time.time()), body),
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
    except ApiError as err:
        return False, err.code
