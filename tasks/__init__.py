"""Celery side of the control plane: the app (`celery -A tasks`), beat schedule and tasks."""

from __future__ import annotations

from tasks.celery_app import celery_app

app = celery_app

__all__ = ["app", "celery_app"]
