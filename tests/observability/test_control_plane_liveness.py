"""The control plane's liveness: the age of the last completed reconcile in /readyz and /metrics.

Real Redis and database behind the real app; the reconcile's record is written with the same
function the fleet uses (app.fleet.liveness).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from app.fleet.liveness import RECONCILED_KEY, record_reconciled
from tests.conftest import API_TOKEN
from tests.observability.conftest import SCRAPE_TOKEN, ObsEnv
from tests.observability.test_metrics import scrape, value


def _reconciled(obs: ObsEnv, seconds_ago: float) -> None:
    record_reconciled(obs.redis, datetime.now(UTC) - timedelta(seconds=seconds_ago))


def test_ready_while_reconciles_complete(obs: ObsEnv) -> None:
    _reconciled(obs, 5)
    response = obs.client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json()["checks"]["control_plane"] == "ok"


def test_not_ready_when_the_last_reconcile_is_older_than_the_bound(obs: ObsEnv) -> None:
    bound = obs.settings.fleet.reconcile_stale_seconds
    _reconciled(obs, bound + 100)
    response = obs.client.get("/readyz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] == "ok"
    reason = body["checks"]["control_plane"]
    assert reason.startswith("failed: last reconcile completed")
    assert f"(bound {bound:.0f} s)" in reason
    text = response.get_data(as_text=True)
    assert API_TOKEN not in text and SCRAPE_TOKEN not in text


def test_a_control_plane_that_never_reconciled_is_noticed_after_the_bound(obs: ObsEnv) -> None:
    obs.redis.delete(RECONCILED_KEY)
    assert obs.client.get("/readyz").status_code == 200  # just started: give it time
    obs.app.extensions["murmur"].started_at = time.time() - 1000
    response = obs.client.get("/readyz")
    assert response.status_code == 503
    assert response.get_json()["checks"]["control_plane"].startswith(
        "failed: no reconcile completed since this API started"
    )


def test_metrics_expose_the_age_and_the_bound(obs: ObsEnv) -> None:
    obs.redis.delete(RECONCILED_KEY)
    text = scrape(obs)
    assert value(text, "murmur_fleet_reconcile_age_seconds") is None  # none ever: no sample
    assert value(text, "murmur_fleet_reconcile_stale_seconds") == 180.0
    _reconciled(obs, 42)
    age = value(scrape(obs), "murmur_fleet_reconcile_age_seconds")
    assert age == pytest.approx(42, abs=5)
