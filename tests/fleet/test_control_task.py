"""The beat task `murmur.control.reconcile`: registered, routed to `control`, thin; and the
control plane's other tasks, which wait on peers, routed to `io`."""

from __future__ import annotations

import pytest

from app.celery_config import CONTROL_QUEUE, CONTROL_TASKS, IO_QUEUE
from tasks import context
from tasks.celery_app import celery_app
from tasks.control import reconcile
from tests.fleet.conftest import MakeFleet


def test_the_beat_schedule_names_the_task() -> None:
    celery_app.loader.import_default_modules()  # what a worker imports at start (`include`)
    for task in CONTROL_TASKS:  # each named once, registered under that name, on its queue
        assert celery_app.tasks[task.name].name == task.name
        assert celery_app.conf.task_routes[task.name] == {"queue": task.queue}
    # Only the reconcile runs on the control worker: everything else waits on a peer (a
    # URL's server, a webhook receiver, the audio store) and goes to the I/O worker.
    on_control = {t.name for t in CONTROL_TASKS if t.queue == CONTROL_QUEUE}
    assert on_control == {reconcile.name}
    assert {t.queue for t in CONTROL_TASKS} == {CONTROL_QUEUE, IO_QUEUE}
    for name, entry in celery_app.conf.beat_schedule.items():
        assert entry["options"]["queue"] == celery_app.conf.task_routes[entry["task"]]["queue"], (
            name
        )
    entry = celery_app.conf.beat_schedule["reconcile"]
    assert entry["task"] == "murmur.control.reconcile" == reconcile.name
    assert celery_app.tasks["murmur.control.reconcile"].name == reconcile.name
    assert entry["options"]["queue"] == CONTROL_QUEUE


def test_the_task_runs_one_reconcile(
    make_fleet: MakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = make_fleet()
    fleet.add_jobs(1)
    monkeypatch.setattr(context, "services", lambda: fleet.svc)
    result = reconcile.run()
    assert result["ran"] is True and result["actions"] == 1
    assert result["planned_hourly_eur"] == pytest.approx(0.75)
    assert [w.profile for w in fleet.workers()] == ["l4-par2"]
