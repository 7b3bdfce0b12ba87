"""HTTP surface of observability: workers' usage reports, /metrics, per-worker diagnostics.

- `POST /internal/workers/<w>/<i>/report`: a worker's usage report (instance credential).
- `GET /metrics`: Prometheus text format (dedicated scrape token; 404 while unset).
- `GET /v1/workers/<w>/diagnostics`: lifecycle timings, latest report, log tail (admin token).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, jsonify, request
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from app.auth import authenticate_worker, bearer_token, require_admin_token
from app.config import scrape_token_problem
from app.context import Services, services
from app.credentials import constant_time_in
from app.errors import ApiError, Refused
from app.inputs import refuse_duplicate_keys
from app.jobs import service
from app.models import Worker, iso
from app.observability import store
from app.observability.collector import LIFECYCLE_PHASES, render_metrics
from gpu_worker.protocol import routes
from gpu_worker.protocol.redaction import clean_log_line
from gpu_worker.protocol.usage import MAX_REPORT_BYTES, UsageReport

log = logging.getLogger(__name__)

observability_bp = Blueprint("observability", __name__)

_READ_CHUNK = 16 * 1024
# ApiError codes of authenticate_worker -> rejection reason.
_AUTH_REASONS = {
    "unauthorized": "unauthorized",
    "unknown_worker": "unknown_worker",
    "worker_retired": "worker_retired",
}


def _reject(svc: Services, reason: str, error: ApiError) -> ApiError:
    store.count_rejection(svc.redis, reason)
    return error


def _too_large(svc: Services) -> ApiError:
    return _reject(
        svc,
        "payload_too_large",
        ApiError(
            413,
            "payload_too_large",
            f"a usage report is at most {MAX_REPORT_BYTES} bytes",
        ),
    )


def _read_bounded(svc: Services) -> bytes:
    """The body, refusing it as soon as it passes the cap (chunked bodies have no length)."""
    chunks: list[bytes] = []
    received = 0
    stream = request.stream
    while True:
        chunk = stream.read(min(_READ_CHUNK, MAX_REPORT_BYTES + 1 - received))
        if not chunk:
            return b"".join(chunks)
        received += len(chunk)
        if received > MAX_REPORT_BYTES:
            raise _too_large(svc)
        chunks.append(chunk)


def _parse(svc: Services, raw: bytes) -> UsageReport:
    try:
        refuse_duplicate_keys(raw)
    except Refused as dup:
        raise _reject(svc, "invalid_body", ApiError(400, dup.code, dup.message)) from None
    try:
        return UsageReport.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        # `loc` and `msg` only: pydantic's full text quotes the input.
        where = ".".join(str(part) for part in first["loc"])[:100] or "body"
        message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        raise _reject(
            svc,
            "invalid_body",
            ApiError(400, "invalid_report", f"{where}: {message}"),
        ) from None


@observability_bp.post(
    routes.flask_rule(routes.INTERNAL_PREFIX, routes.WORKER_PREFIX, routes.REPORT)
)
def report(worker_id: str, instance_id: str) -> Response:
    svc = services()
    # Identity first: it needs no body, and it decides whether a refusal still shows that a
    # live worker is there.
    try:
        worker = authenticate_worker(worker_id, instance_id)
    except ApiError as err:
        reason = _AUTH_REASONS.get(err.code, "unauthorized")
        if reason == "worker_retired":
            # Its series must not outlive it; its log tail stays for diagnosis (24 h).
            store.forget_worker(svc.redis, worker_id, keep_log=True)
        raise _reject(svc, reason, err) from None
    try:
        return _accept(svc, worker.id)
    except ApiError:
        # Refused (reporting switched off here, a body too large or invalid, a repeat), but
        # sent by a live worker: with reporting on, reports are its only heartbeat, and the
        # fleet deletes workers that miss three reports in a row.
        try:
            service.record_heartbeat(svc.db, worker.id, now=svc.clock())
        except SQLAlchemyError as exc:  # the refusal is the answer, not a 500
            log.warning("report refused; heartbeat not recorded: %s", type(exc).__name__)
        raise


def _accept(svc: Services, worker_id: str) -> Response:
    if not svc.settings.observability.enabled:
        raise _reject(
            svc,
            "reporting_disabled",
            ApiError(
                404,
                "reporting_disabled",
                "usage reporting is disabled on this control plane (observability.enabled)",
            ),
        )
    # Before anything is read: a declared length over the cap is refused unread.
    if request.content_length is not None and request.content_length > MAX_REPORT_BYTES:
        raise _too_large(svc)
    usage = _parse(svc, _read_bounded(svc))
    # The worker cleaned its lines already; this is the control plane's own pass, with the
    # same rules (gpu_worker/protocol/redaction.py) and the presented credential as a secret.
    presented = bearer_token() or ""
    lines = [(line.number, clean_log_line(line.text, (presented,))) for line in usage.log]
    now = svc.clock().timestamp()
    accepted = store.store_report(
        svc.redis,
        worker_id,
        usage,
        lines,
        received_at=now,
        interval_seconds=svc.settings.observability.report_interval_seconds,
    )
    if not accepted:  # counted as stale_sequence by the store, atomically
        raise ApiError(
            409,
            "stale_report",
            f"report {usage.sequence} is not newer than the one already stored",
        )
    # Its arrival time, stored with it above, is the worker's heartbeat (store.last_reports).
    return jsonify({"accepted": True, "sequence": usage.sequence})


@observability_bp.get("/metrics")
def metrics() -> Response:
    svc = services()
    expected = svc.settings.reveal("scrape_token")
    # Unset, short or shared: one answer, so a caller cannot learn which (the reason is
    # logged at start-up for the operator).
    if not expected or scrape_token_problem(svc.settings) is not None:
        raise ApiError(
            404,
            "metrics_disabled",
            "/metrics is disabled: MURMUR_SCRAPE_TOKEN is not set or not usable",
        )
    token = bearer_token()
    if token is None or constant_time_in(token, [expected]) is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing or invalid scrape token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    body = render_metrics(svc.settings, svc.db, svc.redis)
    response = Response(body, mimetype=None, content_type=CONTENT_TYPE_PLAIN_0_0_4)
    response.headers["Cache-Control"] = "no-store"
    return response


def _lifecycle(worker: Worker) -> dict[str, Any]:
    stamps = {
        "requested_at": worker.requested_at,
        "created_at": worker.created_at,
        "booted_at": worker.booted_at,
        "ready_at": worker.ready_at,
        "first_job_at": worker.first_job_at,
        "idle_since": worker.idle_since,
        "last_seen_at": worker.last_seen_at,
        "delete_requested_at": worker.delete_requested_at,
        "deleted_at": worker.deleted_at,
    }
    phases: dict[str, float | None] = {}
    for phase in LIFECYCLE_PHASES:
        if phase.runtime_key is not None:
            reported = (worker.runtime or {}).get(phase.runtime_key)
            number = isinstance(reported, int | float) and not isinstance(reported, bool)
            phases[phase.metric.removeprefix("murmur_worker_")] = (
                float(reported) if number and reported is not None else None
            )
            continue
        start = getattr(worker, phase.start.key)
        end = getattr(worker, phase.end.key)
        name = phase.metric.removeprefix("murmur_worker_")
        phases[name] = (
            round((end - start).total_seconds(), 3)
            if start is not None and end is not None
            else None
        )
    return {"timestamps": {k: iso(v) for k, v in stamps.items()}, "phases": phases}


@observability_bp.get("/v1/workers/<worker_id>/diagnostics")
@require_admin_token
def diagnostics(worker_id: str) -> Response:
    svc = services()
    with svc.db.reader() as s:
        worker = s.get(Worker, worker_id)
    if worker is None:
        raise ApiError(404, "worker_not_found", f"no worker {worker_id!r}")
    snapshot = store.read_snapshot(svc.redis, worker_id)
    last_report = store.read_last_report(svc.redis, worker_id)
    now = svc.clock().timestamp()
    return jsonify(
        {
            "worker": {
                "id": worker.id,
                "profile": worker.profile,
                "provider": worker.provider,
                "instance_id": worker.instance_id,
                "state": worker.state,
                "hourly_cost_eur": worker.hourly_cost_eur,
                "jobs_done": worker.jobs_done,
                "error": worker.error,
                "delete_reason": worker.delete_reason,
            },
            "lifecycle": _lifecycle(worker),
            "report": {
                "last_received_at": (
                    iso(datetime.fromtimestamp(last_report, UTC))
                    if last_report is not None
                    else None
                ),
                "age_seconds": round(now - last_report, 3) if last_report is not None else None,
                # None once the snapshot expired (3 intervals without an accepted report).
                "latest": snapshot.report if snapshot is not None else None,
            },
            "log": {
                "lines": store.read_log(svc.redis, worker_id),
                "retention": (
                    f"last {store.LOG_LINES_KEPT} lines, "
                    f"{store.LOG_RETENTION_SECONDS // 3600} h after the last line"
                ),
            },
        }
    )
