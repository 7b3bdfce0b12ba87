"""This Celery process's `Services` (app/services.py) and I/O bounds, built on first use and
kept. The I/O worker runs tasks on threads: the first ones may ask at once, and the lock makes
them share one build (one database engine, one Redis pool)."""

from __future__ import annotations

import threading
from functools import lru_cache

from app.config import load_settings
from app.jobs.io_slots import IoSlots
from app.services import Services, build_services
from tasks.celery_app import celery_app

_build = threading.RLock()


@lru_cache(maxsize=1)
def _services() -> Services:
    return build_services(load_settings(), celery_app)


@lru_cache(maxsize=1)
def _io_slots() -> IoSlots:
    svc = services()
    return IoSlots(svc.redis, svc.settings.io)


def services() -> Services:
    with _build:
        return _services()


def io_slots() -> IoSlots:
    """The fetch and webhook bounds (app/jobs/io_slots.py), shared through this process's Redis."""
    with _build:
        return _io_slots()


def reset() -> None:
    """Forget the built services (tests that change the environment between runs)."""
    with _build:
        _services.cache_clear()
        _io_slots.cache_clear()
