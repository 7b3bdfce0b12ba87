"""`Services`: what a Murmur process holds, one record for the API, the Celery tasks and the CLI.

Built once per process by `build_services` (the API in `create_app`, a Celery process in
tasks/context.py, `murmur smoke` in app/fleet/smoke.py) and passed down. Invariant: the jobs
and fleet domains read the time only through `Services.clock`, passed down as `now` (or as the
clock, where a step needs the time more than once), so a test that injects a clock controls
every timestamp a job or worker row gets (tests/test_clock.py). Outside it: the bookkeeping
column `updated_at`, which SQLAlchemy stamps; file modification times, which the filesystem
sets (app/storage.py); real-time waits, on the monotonic clock; the `local` provider, which
plays a cloud with its own clock; and command-line entry points that build no `Services`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from celery import Celery

from app.broker import redis_client
from app.config import Settings
from app.db import Database, Timeouts
from app.fleet.providers import ProviderRegistry
from app.storage import AudioStore, open_store

Clock = Callable[[], datetime]


def utc_clock() -> datetime:
    return datetime.now(UTC)


@dataclass
class Services:
    settings: Settings
    db: Database
    redis: redis.Redis
    celery: Celery
    storage: AudioStore
    # Built on first use of each provider: the API process never builds an SDK client.
    providers: ProviderRegistry
    clock: Clock = utc_clock
    # When this process started, by `clock`: until a reconcile is ever recorded, the control
    # plane's silence counts from here (app/fleet/liveness.py).
    started_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.started_at:
            self.started_at = self.clock().timestamp()


def database_timeouts(settings: Settings) -> Timeouts:
    """The bounds of every wait on the database (README, Configuration)."""
    d = settings.database
    return Timeouts(
        connect=d.connect_timeout_seconds,
        statement=d.statement_timeout_seconds,
        busy=d.busy_timeout_seconds,
    )


def build_services(
    settings: Settings,
    celery: Celery,
    *,
    db: Database | None = None,
    providers: ProviderRegistry | None = None,
    clock: Clock = utc_clock,
    redis_timeout: float = 5.0,
    redis_connect_timeout: float = 5.0,
) -> Services:
    """The services of one process, from its settings and its Celery app."""
    return Services(
        settings=settings,
        db=db or Database(settings.database_url, database_timeouts(settings)),
        redis=redis_client(
            settings, socket_timeout=redis_timeout, socket_connect_timeout=redis_connect_timeout
        ),
        celery=celery,
        storage=open_store(settings),
        providers=providers or ProviderRegistry(settings),
        clock=clock,
    )
