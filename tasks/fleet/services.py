"""What a reconcile run needs from the outside world, gathered in one record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from celery import Celery

from app.config import Settings
from app.db import Database
from app.fleet.planner import FleetRules
from tasks.providers import ProviderRegistry

# How long a REQUESTED/CREATING row may exist: the provider calls of one create, plus slack.
_CREATE_CALLS = 4


def utc_clock() -> datetime:
    return datetime.now(UTC)


@dataclass
class FleetServices:
    settings: Settings
    db: Database
    redis: redis.Redis
    celery: Celery
    providers: ProviderRegistry
    # Tests pass a fake clock; nothing in the shell reads the time any other way.
    clock: Callable[[], datetime] = field(default=utc_clock)

    def rules(self) -> FleetRules:
        fleet = self.settings.fleet
        obs = self.settings.observability
        return FleetRules(
            idle_timeout=timedelta(seconds=fleet.idle_timeout_seconds),
            boot_timeout=timedelta(seconds=fleet.boot_timeout_seconds),
            create_timeout=timedelta(
                seconds=_CREATE_CALLS * fleet.provider_timeout_seconds
                + 2 * fleet.reconcile_interval_seconds
            ),
            # Workers report (observability on) or send a bare heartbeat (off) every interval.
            heartbeat_timeout=timedelta(
                seconds=heartbeat_timeout_seconds(obs.report_interval_seconds)
            ),
            # When no ready worker at all is heard, suspect the control plane first.
            outage_timeout=timedelta(seconds=10 * obs.report_interval_seconds),
            max_hourly_eur=self.settings.budget.max_hourly_eur,
        )


# How workers report (gpu_worker/reporter.py, a package the control plane does not ship; a
# test keeps the two in step): every interval, jittered by up to this share, and a report
# is given up after this many seconds.
WORKER_REPORT_JITTER = 0.1
WORKER_REPORT_TIMEOUT_SECONDS = 8.0


def heartbeat_timeout_seconds(interval: float) -> float:
    """Silence that means three reports in a row did not arrive, at their latest.

    The reporter waits its (jittered) interval after each attempt returns, and a failed
    attempt can take a whole timeout: three intervals at their longest, each with one
    timeout. Two reports lost in a row (a network blip, an API restart) never get a worker
    deleted.
    """
    return 3 * (interval * (1 + WORKER_REPORT_JITTER) + WORKER_REPORT_TIMEOUT_SECONDS)


def process_services() -> FleetServices:
    """The services of this Celery process (built once; see tasks.context)."""
    from tasks import context
    from tasks.celery_app import celery_app

    global _PROCESS
    if _PROCESS is None:
        settings = context.settings()
        _PROCESS = FleetServices(
            settings=settings,
            db=context.database(),
            redis=context.redis_client(),
            celery=celery_app,
            providers=ProviderRegistry(settings),
        )
    return _PROCESS


_PROCESS: FleetServices | None = None
