"""The control plane's Redis clients: built here only, so every one verifies a rediss:// broker
and follows the primary that Redis Sentinel names when `[redis] sentinels` is set.

`redis_url` with `redis_ca_certs` (the CA that signed the broker's certificate) is all any
process of the control plane needs; the TLS rules are gpu_worker/broker_tls.py's, the Sentinel
rules app/redis_primary.py's.
"""

from __future__ import annotations

from typing import Any

import redis

from app import redis_primary
from app.config import Settings
from gpu_worker.broker_tls import celery_broker, split_url, ssl_options


def redis_client(settings: Settings, **options: Any) -> redis.Redis:
    """A redis-py client of `settings.redis_url` (timeouts etc. in `options`), or of the primary
    Sentinel names."""
    if settings.redis.sentinels:
        return redis_primary.redis_client(settings, **options)
    return url_client(settings.redis_url, settings.redis_ca_certs, **options)


def celery_broker_settings(settings: Settings) -> dict[str, Any]:
    """Celery's `broker_url` (and `broker_use_ssl` for rediss://, or kombu's sentinel:// list)."""
    if settings.redis.sentinels:
        return {"broker_url": redis_primary.broker_url(settings)}
    return celery_broker(settings.redis_url, settings.redis_ca_certs)


def url_client(url: str, ca_certs: str | None, **options: Any) -> redis.Redis:
    """A redis-py client of `url`, verifying a rediss:// broker against `ca_certs`."""
    tls = ssl_options(url, ca_certs)
    if tls is None:
        return redis.Redis.from_url(url, **options)
    return redis.Redis.from_url(split_url(url)[0], **options, **tls)
