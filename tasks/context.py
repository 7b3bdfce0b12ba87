"""Process-wide services for Celery tasks: settings, database, Redis, built once per process."""

from __future__ import annotations

from functools import lru_cache

import redis

from app.broker import redis_client as broker_client
from app.config import Settings, load_settings
from app.db import Database


@lru_cache(maxsize=1)
def settings() -> Settings:
    return load_settings()


@lru_cache(maxsize=1)
def database() -> Database:
    return Database(settings().database_url)


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    return broker_client(settings(), socket_timeout=5, socket_connect_timeout=5)


def reset() -> None:
    """Forget cached services (tests that change the environment between runs)."""
    settings.cache_clear()
    database.cache_clear()
    redis_client.cache_clear()
