"""Liveness, readiness (database and its schema, broker, audio store, a recent reconcile) and
the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from app.context import services
from app.fleet.liveness import control_plane_problem
from app.migrate import schema_problem
from app.openapi import openapi_document
from app.storage import free_bytes

health_bp = Blueprint("health", __name__)


@health_bp.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@health_bp.get("/readyz")
def readyz() -> Response:
    svc = services()
    checks: dict[str, str] = {}
    try:
        # One query, as cheap as a ping: a database nobody migrated answers too, and would
        # fail every request on a missing table.
        problem = schema_problem(svc.db.schema_revision())
        checks["database"] = "ok" if problem is None else f"failed: {problem}"
    except Exception as exc:
        checks["database"] = f"failed: {type(exc).__name__}"
    try:
        svc.redis.ping()
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"failed: {type(exc).__name__}"
    # A full audio store refuses every upload (507): not ready before it gets there.
    try:
        floor = svc.settings.storage_min_free_bytes
        free = free_bytes(svc.settings.storage_path)
        checks["storage"] = (
            "ok" if free >= floor else f"failed: {free} bytes free, below the floor of {floor}"
        )
    except OSError as exc:
        checks["storage"] = f"failed: {type(exc).__name__}"
    # The bucket of an S3 store: a cached probe (app/storage.py HEALTH_TTL_SECONDS), never one
    # request to the bucket per /readyz.
    if checks["storage"] == "ok":
        try:
            down = svc.storage.health()
        except Exception as exc:
            down = type(exc).__name__
        if down is not None:
            checks["storage"] = f"failed: {down}"
    # A dead control plane leaves jobs queued and idle GPUs billed while the API still
    # accepts work: not ready, and the answer says since when.
    try:
        stale = control_plane_problem(
            svc.redis,
            svc.clock().timestamp(),
            svc.started_at,
            svc.settings.fleet.reconcile_stale_seconds,
        )
        checks["control_plane"] = "ok" if stale is None else f"failed: {stale}"
    except Exception as exc:
        checks["control_plane"] = f"failed: {type(exc).__name__}"
    failed = sorted(name for name, state in checks.items() if state != "ok")
    response = jsonify({"status": "ok" if not failed else "unavailable", "checks": checks})
    if failed:
        response.status_code = 503
    return response


@health_bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(openapi_document())
