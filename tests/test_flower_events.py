"""What Flower (and the Celery exporter) see: the task events of the work an operator follows,
none for beat's housekeeping (app/celery_config.py, HOUSEKEEPING; tasks/celery_app.py).

Real processes: beat sends the reconcile and the webhook sweep on its schedule, the control
and I/O workers run them; an event receiver on the broker (what Flower is) records every
task event meanwhile.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from app.celery_config import (
    DELIVER_WEBHOOK,
    HOUSEKEEPING,
    RECONCILE,
    SWEEP_WEBHOOKS,
    make_celery,
)
from tests.conftest import LiveApi, Proc, start_process, wait_for


def _ran(proc: Proc, name: str) -> list[str]:
    """Ids of the `name` tasks a worker's log says succeeded."""
    return re.findall(rf"Task {re.escape(name)}\[([0-9a-f-]+)\] succeeded", proc.output())


@pytest.mark.slow
def test_beat_housekeeping_sends_no_task_events_and_jobs_work_does(
    live_api: LiveApi, control_worker: Proc, io_worker: Proc, tmp_path: Path
) -> None:
    app = make_celery(live_api.settings)
    events: list[dict[str, Any]] = []
    ready = threading.Event()
    receiver_box: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"*": events.append})
            receiver_box.append(receiver)
            ready.set()
            receiver.capture(limit=None, timeout=None, wakeup=False)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(30)
    # The receiver's queue is bound once it consumes: until it hears an event of ours, an
    # event sent would be lost before it listens.
    with app.events.default_dispatcher() as dispatcher:

        def heard() -> bool:
            dispatcher.send("test-ready")
            return any(e["type"] == "test-ready" for e in events)

        wait_for(heard, 30, "the event receiver to listen", step=0.2)
    beat = start_process(
        [sys.executable, "-m", "celery", "-A", "tasks", "beat", "--loglevel", "INFO"]
        + ["--schedule", str(tmp_path / "beat-schedule")],
        live_api.env,
        tmp_path / "beat.log",
    )
    try:
        # Work an operator follows (a webhook attempt; for a job that does not exist it ends
        # at once), sent as the API sends it.
        webhook_id = "job-that-is-not-there"
        DELIVER_WEBHOOK.send(app, webhook_id)
        wait_for(lambda: _ran(io_worker, DELIVER_WEBHOOK.name), 60, "the webhook task")
        # Two rounds of beat's housekeeping, each run to its end.
        wait_for(lambda: len(_ran(control_worker, RECONCILE.name)) >= 2, 60, "two reconciles")
        wait_for(lambda: len(_ran(io_worker, SWEEP_WEBHOOKS.name)) >= 2, 60, "two sweeps")
        # The receiver has the webhook task's last event: what came before it was read too.
        delivered = _ran(io_worker, DELIVER_WEBHOOK.name)[0]
        wait_for(
            lambda: any(
                e.get("uuid") == delivered and e["type"] == "task-succeeded" for e in events
            ),
            30,
            "the webhook task's events",
        )
    finally:
        beat.stop()
        if receiver_box:
            receiver_box[0].should_stop = True
        thread.join(10)

    housekeeping_ids = set(_ran(control_worker, RECONCILE.name))
    housekeeping_ids |= set(_ran(io_worker, SWEEP_WEBHOOKS.name))
    task_events = [e for e in events if e["type"].startswith("task-")]
    assert [e for e in task_events if e.get("uuid") in housekeeping_ids] == []
    names = {task.name for task in HOUSEKEEPING}
    assert [e for e in task_events if e.get("name") in names] == []
    # The work an operator follows is all there, from sent to succeeded.
    mine = [e["type"] for e in task_events if e.get("uuid") == delivered]
    assert mine[:1] == ["task-sent"] and "task-succeeded" in mine, mine
    assert {"task-received", "task-started"} <= set(mine)
    sent = next(e for e in task_events if e.get("uuid") == delivered and e["type"] == "task-sent")
    assert sent["name"] == DELIVER_WEBHOOK.name
