"""This Celery process's `Services` (app/services.py), built on first use and kept."""

from __future__ import annotations

from functools import lru_cache

from app.config import load_settings
from app.services import Services, build_services
from tasks.celery_app import celery_app


@lru_cache(maxsize=1)
def services() -> Services:
    return build_services(load_settings(), celery_app)


def reset() -> None:
    """Forget the built services (tests that change the environment between runs)."""
    services.cache_clear()
