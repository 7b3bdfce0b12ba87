"""A control worker in a process of its own: one reconcile run, for tests that SIGKILL it.

Usage: python -m tests.fleet.reconcile_holder SETTINGS_JSON. Prints "started" before the run
and "finished" after it.
"""

from __future__ import annotations

import json
import sys

from app.celery_config import make_celery
from app.config import Settings
from app.fleet.providers import ProviderRegistry
from app.fleet.providers.scaleway import ScalewayProvider
from app.fleet.reconcile import reconcile
from app.services import build_services


def main(raw: str) -> None:
    settings = Settings.model_validate(json.loads(raw))
    provider = ScalewayProvider(settings, poll_interval=0.01, teardown_wait=1.0)
    svc = build_services(
        settings,
        make_celery(settings),
        providers=ProviderRegistry(settings, {"scaleway": provider}),
    )
    print("started", flush=True)
    report = reconcile(svc)
    print("finished" if report.ran else "not run", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
