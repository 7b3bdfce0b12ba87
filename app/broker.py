"""The control plane's Redis clients: built here only, so every one verifies a rediss:// broker.

`redis_url` with `redis_ca_certs` (the CA that signed the broker's certificate) is all any
process of the control plane needs; the TLS rules are gpu_worker/broker_tls.py's.
"""

from __future__ import annotations

from typing import Any

import redis

from app.config import Settings
from gpu_worker.broker_tls import split_url, ssl_options


def redis_client(settings: Settings, **options: Any) -> redis.Redis:
    """A redis-py client of `settings.redis_url` (timeouts etc. in `options`)."""
    return url_client(settings.redis_url, settings.redis_ca_certs, **options)


def url_client(url: str, ca_certs: str | None, **options: Any) -> redis.Redis:
    """A redis-py client of `url`, verifying a rediss:// broker against `ca_certs`."""
    tls = ssl_options(url, ca_certs)
    if tls is None:
        return redis.Redis.from_url(url, **options)
    return redis.Redis.from_url(split_url(url)[0], **options, **tls)
