"""Webhook delivery state, kept in the database: which webhooks are due, who sends, how it ended.

A job's webhook goes `pending → retrying → delivered | failed`, with `webhook_attempts` and
`webhook_next_at` on the job row. Redis carries only hints (the task queued when a job ends, the
periodic sweep), so whatever the broker loses, the next sweep finds every webhook still due.

An attempt is claimed with one compare-and-set that counts it and pushes `webhook_next_at` a
lease ahead: two sweeps, or a sweep and a redelivered task, never send the same attempt twice.
A deliverer that dies mid-attempt leaves the row due again when the lease ends, so delivery is
at-least-once. After `MAX_ATTEMPTS` failed attempts the webhook is marked `failed`; so is one
still undelivered `DELIVERY_DEADLINE` after its job ended (its token's receivers held every
webhook slot meanwhile, say): the attempt that finds it due past the deadline fails it instead
of sending, so no webhook waits on the sweep for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_, select, update

from app.db import Database, as_utc, rows_changed
from app.jobs.io_slots import SLOT_WAIT_SECONDS
from app.models import FINISHED_STATES, Job, WebhookStatus

OPEN_STATES = tuple(s.value for s in WebhookStatus if s.open)
# One first try and six retries, 2, 4, ... 64 s apart: about two minutes in all, as before.
MAX_ATTEMPTS = 7
# Longer than one attempt can take (app/jobs/delivery.py WEBHOOK_DEADLINE_SECONDS bounds it, connect
# to status line): a live deliverer's attempt is never taken over, a dead one's is retried
# after this.
LEASE = timedelta(seconds=60)
# A webhook not delivered this long after its job ended is failed. Far past the retry window
# (MAX_ATTEMPTS attempts, about four minutes with each attempt's deadline): only a webhook that
# waited for a slot (app/jobs/io_slots.py) this long, as a URL fetch may, reaches it.
DELIVERY_DEADLINE = timedelta(seconds=SLOT_WAIT_SECONDS)


def backoff(attempt: int) -> timedelta:
    """The wait after failed attempt `attempt` (1-based) before the next one."""
    return timedelta(seconds=2**attempt)


def _due(now: datetime) -> list[ColumnElement[bool]]:
    return [
        Job.webhook_status.in_(OPEN_STATES),
        Job.status.in_(FINISHED_STATES),
        or_(Job.webhook_next_at.is_(None), Job.webhook_next_at <= now),
    ]


def due_webhooks(db: Database, now: datetime, limit: int) -> list[str]:
    """Ids of finished jobs whose webhook should be attempted now, the longest waiting first."""
    with db.reader() as s:
        return list(
            s.execute(
                select(Job.id)
                .where(*_due(now))
                .order_by(Job.webhook_next_at.is_not(None), Job.webhook_next_at, Job.finished_at)
                .limit(limit)
            ).scalars()
        )


def claim_attempt(db: Database, job_id: str, now: datetime) -> int | None:
    """Take the next attempt of a due webhook; its number, or None (not due, or taken)."""
    with db.session() as s:
        seen = s.execute(
            select(Job.webhook_attempts).where(Job.id == job_id, *_due(now))
        ).scalar_one_or_none()
        if seen is None:
            return None
        moved = rows_changed(
            s,
            update(Job)
            .where(Job.id == job_id, Job.webhook_attempts == seen, *_due(now))
            .values(webhook_attempts=seen + 1, webhook_next_at=now + LEASE),
        )
    return seen + 1 if moved else None


@dataclass(frozen=True)
class Settled:
    status: WebhookStatus  # delivered | retrying | failed
    next_at: datetime | None  # when the next attempt is due, while retrying


def settle_attempt(
    db: Database, job_id: str, attempt: int, ok: bool, now: datetime
) -> Settled | None:
    """Record how attempt `attempt` ended; the webhook's new state, or None if taken over.

    Only the deliverer still holding the attempt settles it: one whose lease ran out and whose
    attempt another deliverer has since claimed leaves the row to that one.
    """
    if ok:
        status, next_at = WebhookStatus.DELIVERED, None
    elif attempt >= MAX_ATTEMPTS:
        status, next_at = WebhookStatus.FAILED, None
    else:
        status, next_at = WebhookStatus.RETRYING, now + backoff(attempt)
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(
                Job.id == job_id,
                Job.webhook_attempts == attempt,
                Job.webhook_status.in_(OPEN_STATES),
            )
            .values(webhook_status=status.value, webhook_next_at=next_at),
        )
    return Settled(status, next_at) if moved else None


def past_deadline(finished_at: datetime | None, now: datetime) -> bool:
    """Whether a webhook of a job that ended at `finished_at` is past its delivery deadline."""
    ended = as_utc(finished_at)
    return ended is not None and ended + DELIVERY_DEADLINE <= now


def expire(db: Database, job_id: str, now: datetime) -> bool:
    """Fail a due webhook past its delivery deadline instead of attempting it; whether it did
    (not when delivered meanwhile, or while an attempt holds its lease: that one settles it)."""
    with db.session() as s:
        moved = rows_changed(
            s,
            update(Job)
            .where(
                Job.id == job_id,
                *_due(now),
                Job.finished_at.is_not(None),
                Job.finished_at <= now - DELIVERY_DEADLINE,
            )
            .values(webhook_status=WebhookStatus.FAILED.value, webhook_next_at=None),
        )
    return moved > 0
