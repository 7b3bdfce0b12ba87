"""Observability: workers' usage reports, /metrics for Prometheus, per-worker diagnostics.

The fleet calls `forget_worker` at teardown and `record_provision_attempt` after each
provisioning attempt (and `record_broker_user_recreated` for each worker broker user it
re-creates); the jobs domain calls `record_job_finished` once a job's final state is
stored. The HTTP surface is `app.observability.views.observability_bp`.
"""

from __future__ import annotations

from app.observability.store import (
    PROVISION_OUTCOMES,
    forget_worker,
    record_broker_user_recreated,
    record_job_finished,
    record_provision_attempt,
)

__all__ = [
    "PROVISION_OUTCOMES",
    "forget_worker",
    "record_broker_user_recreated",
    "record_job_finished",
    "record_provision_attempt",
]
