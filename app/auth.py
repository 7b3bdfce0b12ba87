"""Who is calling: API clients (bearer API tokens), workers (instance credentials), admins.

Every comparison is constant-time; no token is ever logged or echoed in an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar, cast

from flask import g, request
from sqlalchemy import bindparam, select

from app.context import services
from app.credentials import constant_time_in, token_fingerprint, verify_instance_credential
from app.errors import ApiError
from app.models import LIVE_WORKER_STATES, Worker

F = TypeVar("F", bound=Callable[..., Any])

_BEARER = "bearer "


def bearer_token() -> str | None:
    header = request.headers.get("Authorization", "")
    if header[: len(_BEARER)].lower() != _BEARER:
        return None
    return header[len(_BEARER) :].strip() or None


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def require_api_token(view: F) -> F:
    """Accept any of the configured API tokens; `g.owner` identifies the caller's token."""

    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = bearer_token()
        if token is None:
            raise _unauthorized("missing bearer token: send 'Authorization: Bearer <API token>'")
        allowed = [t.get_secret_value() for t in services().settings.api_tokens]
        match = constant_time_in(token, allowed)
        if match is None:
            raise _unauthorized("invalid API token")
        g.owner = token_fingerprint(match)
        return view(*args, **kwargs)

    return cast(F, wrapper)


def require_admin_token(view: F) -> F:
    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        admin = services().settings.reveal("admin_token")
        if not admin:
            raise ApiError(404, "not_found", "the admin API is disabled (MURMUR_ADMIN_TOKEN unset)")
        token = bearer_token()
        if token is None or constant_time_in(token, [admin]) is None:
            raise _unauthorized("missing or invalid admin token")
        return view(*args, **kwargs)

    return cast(F, wrapper)


@dataclass(frozen=True)
class WorkerCaller:
    """The authenticated worker behind a request: what the worker endpoints need of its row."""

    id: str
    profile: str
    instance_id: str
    state: str
    first_job_at: datetime | None
    last_seen_at: datetime | None


def authenticate_worker(
    worker_id: str, instance_id: str, *, live_only: bool = True
) -> WorkerCaller:
    """The worker behind an instance credential, or ApiError 401/403.

    The credential must be the HMAC of this (worker, instance) pair, and the pair must match a
    worker in the inventory that is still live: a deleted worker's credential is worthless.
    Every usage report comes through here: one indexed read of six columns, run on the
    DBAPI connection (see RowReader), no ORM object.
    """
    svc = services()
    token = bearer_token()
    key = svc.settings.reveal("signing_key")
    if (
        token is None
        or not key
        or not verify_instance_credential(key, worker_id, instance_id, token)
    ):
        raise _unauthorized("invalid worker credential")
    row = svc.db.row_reader(_WORKER_CALLER).first(worker_id=worker_id)
    if row is None or row[2] != instance_id:
        raise ApiError(403, "unknown_worker", "no such worker on this instance")
    caller = WorkerCaller(*row)
    if live_only and caller.state not in LIVE_WORKER_STATES:
        raise ApiError(403, "worker_retired", "this worker is no longer in the inventory")
    return caller


_WORKER_CALLER = select(
    Worker.id,
    Worker.profile,
    Worker.instance_id,
    Worker.state,
    Worker.first_job_at,
    Worker.last_seen_at,
).where(Worker.id == bindparam("worker_id"))
