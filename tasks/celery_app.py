"""The control plane's Celery app of this process (`celery -A tasks`): the configuration
(app/celery_config.py) built from the settings, and the task modules it runs."""

from __future__ import annotations

import sys
from typing import Any

from celery import signals

from app.celery_config import CONTROL_QUEUE, make_celery
from app.config import StartupRefused, load_settings, refuse_bad_settings

celery_app = make_celery(load_settings())
# Task modules register themselves on import; the worker imports them at start.
celery_app.conf.include = ["tasks.jobs", "tasks.control", "tasks.retention"]


def _refuse(process: str, role: str) -> None:
    """Stop this process with one message if its configuration has what validate-config
    refuses for its role: better now than at the first job a misconfigured fleet strands."""
    try:
        refuse_bad_settings(load_settings(), process=process, role=role)
    except StartupRefused as exc:
        print(exc, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _refuse_unmigrated(process: str) -> None:
    """Stop a worker whose database nobody migrated: each of its tasks would fail on a missing
    table or column. (Beat does not use the database.)"""
    from app.migrate import configured_schema_problem

    problem = configured_schema_problem(load_settings().database_url)
    if problem is not None:
        print(f"cannot start the {process}: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(1)


@signals.celeryd_after_setup.connect
def _check_worker_settings(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    # The queues are known here (after -Q): the control worker alone creates servers and
    # holds the provider keys; any other worker of this app is checked like the API.
    if instance is None or instance.app is not celery_app:
        return  # another Celery app's worker in a process that imported this one
    queues = set(instance.app.amqp.queues.consume_from or ())
    process, role = (
        ("control worker", "control") if CONTROL_QUEUE in queues else ("Celery worker", "api")
    )
    _refuse(process, role)
    _refuse_unmigrated(process)


@signals.beat_init.connect
def _check_beat_settings(sender: Any = None, **kwargs: Any) -> None:
    if getattr(sender, "app", celery_app) is celery_app:
        _refuse("beat", "beat")
        # Beat sends only housekeeping (app.celery_config.HOUSEKEEPING), whose task events
        # are off: its task-sent events would list every run in Flower as sent, never done.
        celery_app.conf.task_send_sent_event = False
