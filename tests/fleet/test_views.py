"""The operator surface: `GET /v1/fleet` (admin token) and `murmur fleet`."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from app import create_app
from app.config import Settings
from app.db import Database
from app.fleet.cli import fleet_command
from app.fleet.planner import FleetPlan, ProfilePlan
from app.fleet.reconcile import publish_plan
from app.migrate import upgrade
from app.models import ProfileState, Worker, WorkerState, utcnow
from tests.conftest import REDIS_URL
from tests.fleet.conftest import L4, P100, SIGNING_KEY

ADMIN = "fleet-admin-token-" + "z" * 32


@pytest.fixture()
def app_settings(tmp_path: Path, clean_redis: redis.Redis) -> Settings:
    return Settings.model_validate(
        {
            "database_url": f"sqlite:///{tmp_path}/murmur.db",
            "redis_url": REDIS_URL,
            "storage_path": str(tmp_path / "audio"),
            "profiles": [L4, P100],
            "security_groups": {
                "workers-par2": {"id": "g2", "zone": "fr-par-2"},
                "workers-par1": {"id": "g1", "zone": "fr-par-1"},
            },
            "budget": {"max_hourly_eur": 5.0},
            "api_tokens": ["api-token-" + "a" * 32],
            "admin_token": ADMIN,
            "signing_key": SIGNING_KEY,
        }
    )


@pytest.fixture()
def populated(app_settings: Settings, clean_redis: redis.Redis) -> Iterator[Database]:
    upgrade(app_settings.database_url)
    db = Database(app_settings.database_url)
    now = utcnow()
    with db.session() as s:
        s.add(
            Worker(
                id="wrk_ready",
                profile="l4-par2",
                provider="scaleway",
                instance_id="i-1",
                state=WorkerState.READY.value,
                hourly_cost_eur=0.75,
                requested_at=now - timedelta(seconds=300),
                created_at=now - timedelta(seconds=290),
                booted_at=now - timedelta(seconds=200),
                ready_at=now - timedelta(seconds=100),
                idle_since=now - timedelta(seconds=10),
                last_seen_at=now - timedelta(seconds=4),
            )
        )
        s.add(
            Worker(
                id="wrk_gone",
                profile="p100-par1",
                provider="scaleway",
                instance_id="i-2",
                state=WorkerState.DELETED.value,
                hourly_cost_eur=1.2426,
                requested_at=now - timedelta(seconds=900),
                deleted_at=now - timedelta(seconds=60),
                delete_reason="idle",
            )
        )
        s.add(
            ProfileState(
                name="p100-par1",
                consecutive_stockouts=2,
                backoff_until=now + timedelta(seconds=100),
                last_error="create_server: HTTP 503 out_of_stock resource is out of stock",
                availability="shortage",
            )
        )
    plan = FleetPlan(
        now=now,
        actions=(),
        held_back=("p100-par1: out of stock, backing off until later",),
        profiles=(ProfilePlan("l4-par2", "ok", 1, 2, 2.25, 0, 0),),
        current_hourly_eur=0.75,
        planned_hourly_eur=2.25,
        waiting=0,
    )
    services: Any = type("S", (), {"redis": clean_redis, "settings": app_settings})
    publish_plan(services, plan)
    clean_redis.rpush("transcribe.l4-par2", b"m1", b"m2")
    yield db
    db.dispose()


def test_fleet_requires_the_admin_token(app_settings: Settings, populated: Database) -> None:
    client = create_app(app_settings, db=populated).test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {'a' * 42}"}):
        response = client.get("/v1/fleet", headers=headers)
        assert response.status_code == 401
        assert response.get_json()["error"]["code"] == "unauthorized"
    api_token = app_settings.api_tokens[0].get_secret_value()
    assert (
        client.get("/v1/fleet", headers={"Authorization": f"Bearer {api_token}"}).status_code == 401
    )


def test_fleet_view(app_settings: Settings, populated: Database) -> None:
    client = create_app(app_settings, db=populated).test_client()
    response = client.get("/v1/fleet", headers={"Authorization": f"Bearer {ADMIN}"})
    assert response.status_code == 200
    body = response.get_json()
    assert body["budget"] == {
        "max_hourly_eur": 5.0,
        "current_hourly_eur": 0.75,
        "planned_hourly_eur": 2.25,
    }
    l4, p100 = body["profiles"]
    assert (l4["name"], l4["enabled"], l4["workers"], l4["queue_depth"]) == (
        "l4-par2",
        True,
        {"ready": 1},
        2,
    )
    assert (l4["current_hourly_eur"], l4["planned_hourly_eur"], l4["backoff_until"]) == (
        0.75,
        2.25,
        None,
    )
    assert p100["backoff_until"] is not None and p100["consecutive_stockouts"] == 2
    assert p100["last_error"].endswith("resource is out of stock")
    assert p100["availability"] == "shortage" and p100["workers"] == {}
    assert body["plan"]["held_back"] == ["p100-par1: out of stock, backing off until later"]
    workers = {w["id"]: w for w in body["workers"]}
    ready = workers["wrk_ready"]
    assert ready["state"] == "ready" and 299 <= ready["age_seconds"] <= 310
    # No usage report arrived: no report age, whatever the row's heartbeat says.
    assert ready["last_report_age_seconds"] is None
    assert ready["last_seen_age_seconds"] is not None and ready["last_seen_age_seconds"] < 60
    assert ready["timings"]["created"] == 10.0 and ready["timings"]["ready"] == 200.0
    assert ready["timings"]["deleted"] is None
    assert workers["wrk_gone"]["delete_reason"] == "idle"


def test_fleet_command(
    app_settings: Settings, populated: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "MURMUR_DATABASE_URL": app_settings.database_url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_CONFIG": str(Path(__file__).resolve().parents[2] / "config" / "local.toml"),
    }
    result = CliRunner().invoke(fleet_command, [], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "budget: 0.75 EUR/h now, 2.25 planned, max 10.00" in result.output
    assert "wrk_ready" in result.output and "wrk_gone" in result.output
    assert "[idle]" in result.output
    assert "local-cpu" in result.output  # the profiles of this configuration
    as_json = CliRunner().invoke(fleet_command, ["--json"], env=env, catch_exceptions=False)
    assert '"id": "wrk_ready"' in as_json.output


def test_fleet_overview_lists_what_an_operator_needs(
    app_settings: Settings, populated: Database, clean_redis: redis.Redis
) -> None:
    from app.fleet.cli import render
    from app.fleet.service import fleet_overview

    view = fleet_overview(app_settings, populated, clean_redis, datetime.now(UTC))
    text = render(view)
    assert "l4-par2" in text and "p100-par1" in text
    assert "ready=1" in text
    assert "create_server: HTTP 503 out_of_stock" in text
    assert "held back:" in text and "p100-par1: out of stock" in text
