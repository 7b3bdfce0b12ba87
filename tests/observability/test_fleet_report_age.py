"""`/v1/fleet` and `murmur fleet` read a worker's report age from its latest accepted usage
report, which is recorded in Redis only, never on the worker's row (`last_seen_at`)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.fleet.cli import render
from app.fleet.service import fleet_overview
from app.models import Worker, utcnow
from tests.conftest import ADMIN_TOKEN
from tests.observability.conftest import ObsEnv, live_worker, make_report, post_report


def test_report_age_comes_from_the_latest_accepted_report(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    # The row's heartbeat is old (as when a worker only reports): 110 s ago.
    with obs.db.session() as s:
        s.execute(
            update(Worker)
            .where(Worker.id == worker.id)
            .values(last_seen_at=utcnow() - timedelta(seconds=110))
        )
    silent = live_worker(obs.db)
    assert post_report(obs.client, worker, make_report(1)).status_code == 200

    response = obs.client.get("/v1/fleet", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert response.status_code == 200
    listed = {w["id"]: w for w in response.get_json()["workers"]}
    reporting = listed[worker.id]
    assert reporting["last_report_age_seconds"] is not None
    assert 0 <= reporting["last_report_age_seconds"] < 60
    # The latest sign of life of any kind is the report too, not the older row.
    assert 0 <= reporting["last_seen_age_seconds"] < 60
    # A worker that never reported has no report age (shown as `-`), whatever its row says.
    assert listed[silent.id]["last_report_age_seconds"] is None

    text = render(fleet_overview(obs.settings, obs.db, obs.redis, utcnow()))
    line = next(row for row in text.splitlines() if row.startswith(worker.id))
    assert "110s" not in line and "1m" not in line.split()[4]
    assert line.split()[4].endswith("s") and int(line.split()[4][:-1]) < 60
