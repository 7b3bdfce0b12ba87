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
from app.fleet.providers import ProviderRegistry
from gpu_worker.protocol.usage import heartbeat_timeout_seconds

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
