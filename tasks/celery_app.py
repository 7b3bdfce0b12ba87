"""The control plane's Celery app of this process (`celery -A tasks`): the configuration
(app/celery_config.py) built from the settings, and the task modules it runs."""

from __future__ import annotations

from app.celery_config import make_celery
from app.config import load_settings

celery_app = make_celery(load_settings())
# Task modules register themselves on import; the worker imports them at start.
celery_app.conf.include = ["tasks.jobs", "tasks.control", "tasks.retention"]
