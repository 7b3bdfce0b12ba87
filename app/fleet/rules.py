"""The planner's `FleetRules`, derived from the settings: every timeout the fleet acts on."""

from __future__ import annotations

from datetime import timedelta

from app.config import Settings
from app.fleet.learned import ARRIVAL_WINDOW
from app.fleet.planner import FleetRules
from gpu_worker.protocol.usage import heartbeat_timeout_seconds

# How long a REQUESTED/CREATING row may exist: the provider calls of one create, plus slack.
_CREATE_CALLS = 4


def fleet_rules(settings: Settings) -> FleetRules:
    """The planner's timing and budget rules, from the settings."""
    fleet = settings.fleet
    obs = settings.observability
    return FleetRules(
        idle_timeout=timedelta(seconds=fleet.idle_timeout_seconds),
        boot_timeout=timedelta(seconds=fleet.boot_timeout_seconds),
        create_timeout=timedelta(
            seconds=_CREATE_CALLS * fleet.provider_timeout_seconds
            + 2 * fleet.reconcile_interval_seconds
        ),
        # Workers report (observability on) or send a bare heartbeat (off) every interval.
        heartbeat_timeout=timedelta(seconds=heartbeat_timeout_seconds(obs.report_interval_seconds)),
        # When no ready worker at all is heard, suspect the control plane first.
        outage_timeout=timedelta(seconds=10 * obs.report_interval_seconds),
        max_hourly_eur=settings.budget.max_hourly_eur,
        target_wait=timedelta(seconds=fleet.target_wait_seconds),
        boot_margin=fleet.boot_estimate_margin,
        boot_floor=timedelta(seconds=fleet.boot_estimate_floor_seconds),
        idle_floor=timedelta(seconds=fleet.idle_floor_seconds),
        arrival_window=ARRIVAL_WINDOW,
    )
