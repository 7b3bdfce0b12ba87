"""How every control-plane process reaches the Redis primary: `redis_url` as given, or the
server Redis Sentinel currently names as primary (`[redis] sentinels`, `master_name`).

The same settings give the app's redis-py client, Celery's broker URL and transport options,
and the broker GPU workers are told about, so a failover moves all of them together.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from app.config import Settings


def _sentinel_addresses(settings: Settings) -> list[tuple[str, int]]:
    out = []
    for entry in settings.redis.sentinels:
        host, _, port = entry.rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


def _database(url: str) -> int:
    path = urlsplit(url).path.lstrip("/")
    return int(path) if path.isdigit() else 0


def redis_client(
    settings: Settings, *, socket_timeout: float = 5.0, socket_connect_timeout: float = 2.0
) -> redis.Redis:
    """A client for the app's own keys that follows the primary Sentinel names on failover
    (app/broker.py builds the client without Sentinel). Plain TCP: `check_settings` refuses
    rediss:// with Sentinel."""
    parts = urlsplit(settings.redis_url)
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        _sentinel_addresses(settings), sentinel_kwargs=timeouts, **timeouts
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        settings.redis.master_name,
        db=_database(settings.redis_url),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        **timeouts,
    )
    return client


def broker_url(settings: Settings, credentials_from: str | None = None) -> str:
    """Celery's broker URL: `redis_url`, or kombu's `sentinel://a;sentinel://b;...` list.

    `credentials_from` is a URL whose user, password and database are used instead of
    `redis_url`'s (a worker's own broker user, app/fleet/broker_users.py).
    """
    source = credentials_from or settings.redis_url
    if not settings.redis.sentinels:
        return source
    userinfo, at, _ = urlsplit(source).netloc.rpartition("@")
    auth = userinfo + at  # as written (still percent-encoded), for kombu to decode
    db = _database(source)
    return ";".join(f"sentinel://{auth}{entry}/{db}" for entry in settings.redis.sentinels)


def broker_transport_options(settings: Settings) -> dict[str, Any]:
    """What kombu's Sentinel transport needs on top of the URL (nothing without Sentinel)."""
    if not settings.redis.sentinels:
        return {}
    return {"master_name": settings.redis.master_name}
