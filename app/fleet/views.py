"""`GET /v1/fleet`: the fleet as operators see it (admin token only)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from app.auth import require_admin_token
from app.context import services
from app.fleet.service import fleet_overview

fleet_bp = Blueprint("fleet", __name__)


@fleet_bp.get("/v1/fleet")
@require_admin_token
def fleet() -> Response:
    svc = services()
    return jsonify(fleet_overview(svc.settings, svc.db, svc.redis, svc.clock()))
