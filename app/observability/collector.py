"""The /metrics collector: every scrape is rebuilt from the database and Redis, never from memory.

Under gunicorn each process would otherwise expose its own counters and a scrape would see
whichever process answered. Here a scrape reads shared state only: three queries (live
workers, lifecycle durations, jobs grouped by profile and status) and one Redis pipeline
(snapshots, freshness, queue lengths, counters), then builds metric families into a fresh
registry. Labels are limited to profile, worker (id), gpu (index), state, outcome and
reason; no job id, URL, token or transcript text can reach a label or a value.
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from sqlalchemy import Float, cast, extract, func, select
from sqlalchemy.sql.elements import ColumnElement

from app.config import Settings
from app.db import Database, as_utc
from app.fleet.boot_policy import boot_estimate
from app.fleet.learned import read_learned
from app.fleet.rules import fleet_rules
from app.models import (
    FINISHED_STATES,
    Job,
    JobStatus,
    ProfileState,
    Worker,
    WorkerState,
    server_gone,
)
from app.observability import store
from app.observability.exposition import SeriesFamily, encode_text
from gpu_worker.protocol.broker import profile_of_queue, queue_name
from gpu_worker.protocol.usage import MISSING_REASONS

log = logging.getLogger(__name__)

# Seconds: creating a server takes seconds, booting a GPU image minutes, teardown seconds to
# minutes; an hour bounds anything that is not stuck.
LIFECYCLE_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
                     3600.0)  # fmt: skip


@dataclass(frozen=True)
class LifecyclePhase:
    metric: str
    doc: str
    start: Any  # a Worker timestamp column
    end: Any
    # Teardown is only a measurement when there was an instance to delete: a creation that
    # failed outright is marked deleted at once.
    needs_instance: bool = False
    # Seconds the worker measured and reported in its runtime under this key (end - start
    # otherwise).
    runtime_key: str | None = None


LIFECYCLE_PHASES = (
    LifecyclePhase(
        "murmur_worker_provision_seconds",
        "Worker lifecycle: requested -> created (the provider's create call).",
        Worker.requested_at,
        Worker.created_at,
    ),
    LifecyclePhase(
        "murmur_worker_boot_seconds",
        "Worker lifecycle: created -> booted (the instance is running).",
        Worker.created_at,
        Worker.booted_at,
    ),
    LifecyclePhase(
        "murmur_worker_startup_seconds",
        "Worker lifecycle: booted -> ready (worker start-up, model load, readiness check).",
        Worker.booted_at,
        Worker.ready_at,
    ),
    LifecyclePhase(
        "murmur_worker_first_job_wait_seconds",
        "Worker lifecycle: ready -> first job claimed.",
        Worker.ready_at,
        Worker.first_job_at,
    ),
    LifecyclePhase(
        "murmur_worker_teardown_seconds",
        "Worker lifecycle: delete requested -> deleted (confirmed by the provider).",
        Worker.delete_requested_at,
        Worker.deleted_at,
        needs_instance=True,
    ),
    LifecyclePhase(
        "murmur_worker_image_pull_seconds",
        "Worker lifecycle: the instance pulling the worker image (part of booted -> ready).",
        None,
        None,
        runtime_key="image_pull_seconds",
    ),
)

WAITING_JOB_STATES = (JobStatus.QUEUED.value, JobStatus.DISPATCHED.value)
UNFINISHED_JOB_STATES = (*WAITING_JOB_STATES, JobStatus.RUNNING.value)
INVENTORY_STATES = tuple(s.value for s in WorkerState if s is not WorkerState.DELETED)
# (report key, metric, help) of the per-GPU readings in a report.
_GPU_FIELDS = (
    (
        "utilization_ratio",
        "murmur_gpu_utilization_ratio",
        "GPU busy share over NVML's last sample period (0-1).",
    ),
    ("memory_used_bytes", "murmur_gpu_memory_used_bytes", "GPU memory in use."),
    ("memory_total_bytes", "murmur_gpu_memory_total_bytes", "GPU memory installed."),
    ("temperature_celsius", "murmur_gpu_temperature_celsius", "GPU core temperature."),
    ("power_watts", "murmur_gpu_power_watts", "GPU power draw."),
)
# (report key, metric, help) of the host readings in a report.
_HOST_FIELDS = (
    (
        "cpu_utilization_ratio",
        "murmur_worker_cpu_utilization_ratio",
        "Busy share of all CPU cores of the worker's machine since its previous report (0-1).",
    ),
    (
        "memory_used_bytes",
        "murmur_worker_memory_used_bytes",
        "RAM in use on the worker's machine (total minus available).",
    ),
    (
        "memory_total_bytes",
        "murmur_worker_memory_total_bytes",
        "RAM installed on the worker's machine.",
    ),
)


def _seconds_between(dialect: str, start: Any, end: Any) -> ColumnElement[float]:
    """end - start in seconds, computed by the database (NULL when either is NULL)."""
    if dialect == "sqlite":
        return (func.julianday(end) - func.julianday(start)) * 86400.0
    return cast(extract("epoch", end - start), Float)


def _histogram(
    values: Sequence[int], total: float, bounds: Sequence[float]
) -> list[tuple[str, float]]:
    """Cumulative buckets from per-bucket counts (`values[len(bounds)]` is the +Inf bucket)."""
    buckets, running = [], 0
    for i, bound in enumerate(bounds):
        running += values[i]
        buckets.append((_le(bound), float(running)))
    running += values[len(bounds)]
    buckets.append(("+Inf", float(running)))
    return buckets


def _le(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else str(bound)


class MurmurCollector:
    """A prometheus_client collector over shared state; build one per scrape."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        r: redis.Redis,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._db = db
        self._redis = r
        self._clock = clock

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: collect() queries the database, which register()
        # must not do.
        return []

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        profiles = [p.name for p in self._settings.profiles]
        dialect = self._db.engine.dialect.name
        with self._db.engine.connect() as conn:
            workers = conn.execute(
                select(
                    Worker.id,
                    Worker.profile,
                    Worker.state,
                    Worker.instance_id,
                    Worker.hourly_cost_eur,
                    Worker.delete_requested_at,
                    Worker.resources,
                ).where(
                    # The inventory: rows that may still own an instance. A failed creation
                    # is FAILED with deleted_at set and owns nothing.
                    Worker.state != WorkerState.DELETED.value,
                    Worker.deleted_at.is_(None),
                )
            ).all()
            durations = conn.execute(
                select(
                    Worker.profile,
                    Worker.instance_id.is_not(None),
                    *(
                        Worker.runtime[ph.runtime_key].as_float()
                        if ph.runtime_key is not None
                        else _seconds_between(dialect, ph.start, ph.end)
                        for ph in LIFECYCLE_PHASES
                    ),
                )
            ).all()
            job_rows = conn.execute(
                select(Job.profile, Job.status, func.count(), func.min(Job.created_at)).group_by(
                    Job.profile, Job.status
                )
            ).all()
            learned = conn.execute(
                select(
                    ProfileState.name,
                    ProfileState.consecutive_failed_boots,
                    ProfileState.retry_at,
                    ProfileState.backoff_until,
                    ProfileState.last_error,
                )
            ).all()
        shared = store.read_shared_state(
            self._redis,
            [w.id for w in workers],
            [queue_name(name) for name in profiles],
        )
        yield from self._jobs(job_rows, profiles, shared, now)
        yield from self._fleet(workers, profiles, shared, now)
        yield from self._profile_holds(learned, profiles, now)
        yield from self._learned(profiles, now)
        yield from self._lifecycle(durations, profiles)
        yield from self._workers(workers, shared, now)
        yield from self._reporting(shared)
        self._prune(workers, shared, now)

    # -- jobs and queues ----------------------------------------------------------------------

    def _jobs(
        self, rows: Sequence[Any], profiles: list[str], shared: store.SharedState, now: float
    ) -> Iterator[Metric]:
        submitted = CounterMetricFamily(
            "murmur_jobs_submitted",
            "Jobs ever accepted (rows in the jobs table).",
        )
        finished = CounterMetricFamily(
            "murmur_jobs_finished",
            "Jobs that reached a final state, by the profile they ran on and outcome.",
            labels=["profile", "outcome"],
        )
        unfinished = GaugeMetricFamily(
            "murmur_jobs",
            "Unfinished jobs by profile and state (profile empty: not routed to a profile yet).",
            labels=["profile", "state"],
        )
        waiting = GaugeMetricFamily(
            "murmur_queue_jobs",
            "Jobs waiting for a worker (queued + dispatched) per profile.",
            labels=["profile"],
        )
        oldest = GaugeMetricFamily(
            "murmur_queue_oldest_wait_seconds",
            "How long the oldest waiting (queued or dispatched) job has waited; 0 when none.",
            labels=["profile"],
        )
        messages = GaugeMetricFamily(
            "murmur_queue_messages",
            "Messages waiting in the broker list transcribe.<profile> (not those reserved).",
            labels=["profile"],
        )
        total = 0
        finished_counts: Counter[tuple[str, str]] = Counter(
            {(p, o): 0 for p in profiles for o in FINISHED_STATES}
        )
        unfinished_counts: Counter[tuple[str, str]] = Counter(
            {(p, s): 0 for p in profiles for s in UNFINISHED_JOB_STATES}
        )
        waiting_counts: Counter[str] = Counter({p: 0 for p in profiles})
        oldest_created: dict[str, datetime] = {}
        for profile, status, count, first_created in rows:
            label = profile or ""
            total += count
            if status in FINISHED_STATES:
                finished_counts[(label, status)] += count
            elif status in UNFINISHED_JOB_STATES:
                unfinished_counts[(label, status)] += count
            if status in WAITING_JOB_STATES:
                waiting_counts[label] += count
                created = as_utc(first_created)  # a bare aggregate: no column type
                if created is not None and (
                    label not in oldest_created or created < oldest_created[label]
                ):
                    oldest_created[label] = created
        submitted.add_metric([], float(total))
        for (profile, outcome), count in sorted(finished_counts.items()):
            finished.add_metric([profile, outcome], float(count))
        for (profile, state), count in sorted(unfinished_counts.items()):
            unfinished.add_metric([profile, state], float(count))
        for profile, count in sorted(waiting_counts.items()):
            waiting.add_metric([profile], float(count))
            first = oldest_created.get(profile)
            oldest.add_metric(
                [profile], max(now - first.timestamp(), 0.0) if first is not None else 0.0
            )
        for queue, length in shared.queue_messages.items():
            messages.add_metric([profile_of_queue(queue)], float(length))
        yield from (submitted, finished, unfinished, waiting, oldest, messages)
        yield from self._job_latency(profiles, shared)

    def _job_latency(self, profiles: list[str], shared: store.SharedState) -> Iterator[Metric]:
        bounds = store.JOB_LATENCY_BUCKETS
        counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(bounds) + 1))
        sums: dict[str, float] = defaultdict(float)
        for p in profiles:
            counts[f"wait|{p}"]
            for outcome in FINISHED_STATES:
                counts[f"duration|{p}|{outcome}"]
        for field, value in shared.job_latency.items():
            series, _, slot = field.rpartition("|")
            if slot == "sum":
                sums[series] += value
            elif slot.isdigit() and int(slot) <= len(bounds):
                counts[series][int(slot)] += int(value)
        wait = HistogramMetricFamily(
            "murmur_job_wait_seconds",
            "Job latency: submitted -> started on a worker, per profile it ran on.",
            labels=["profile"],
        )
        duration = HistogramMetricFamily(
            "murmur_job_duration_seconds",
            "Job latency: submitted -> final state, per profile and outcome.",
            labels=["profile", "outcome"],
        )
        for series in sorted(counts):
            kind, _, rest = series.partition("|")
            buckets = _histogram(counts[series], sums[series], bounds)
            if kind == "wait":
                wait.add_metric([rest], buckets, sums[series])
            elif kind == "duration":
                profile, _, outcome = rest.rpartition("|")
                duration.add_metric([profile, outcome], buckets, sums[series])
        yield from (wait, duration)

    # -- the fleet ----------------------------------------------------------------------------

    def _fleet(
        self, workers: Sequence[Any], profiles: list[str], shared: store.SharedState, now: float
    ) -> Iterator[Metric]:
        by_state = GaugeMetricFamily(
            "murmur_workers",
            "Workers in the inventory by profile and fleet state.",
            labels=["profile", "state"],
        )
        cost = GaugeMetricFamily(
            "murmur_fleet_cost_euros_per_hour",
            "Current hourly cost: every worker still billed (until its deletion is confirmed).",
            labels=["profile"],
        )
        counts: Counter[tuple[str, str]] = Counter(
            {(p, s): 0 for p in profiles for s in INVENTORY_STATES}
        )
        costs: dict[str, float] = {p: 0.0 for p in profiles}
        pending = GaugeMetricFamily(
            "murmur_worker_delete_pending_seconds",
            "Seconds since deletion of this worker was requested, while not yet confirmed.",
            labels=["profile", "worker"],
        )
        for w in workers:
            counts[(w.profile, w.state)] += 1
            # Same rule as the planner: a failed worker with no instance costs nothing, nor
            # does one whose instance a teardown confirmed gone (only storage may be left).
            if server_gone(w.resources):
                pass
            elif w.state != WorkerState.FAILED.value or w.instance_id is not None:
                costs[w.profile] = costs.get(w.profile, 0.0) + float(w.hourly_cost_eur or 0.0)
            if w.delete_requested_at is not None:
                since = now - w.delete_requested_at.timestamp()
                pending.add_metric([w.profile, w.id], max(since, 0.0))
        for (profile, state), count in sorted(counts.items()):
            by_state.add_metric([profile, state], float(count))
        for profile, euros in sorted(costs.items()):
            cost.add_metric([profile], euros)
        recorded = shared.planned_hourly_eur is not None
        planned = GaugeMetricFamily(
            "murmur_fleet_planned_cost_euros_per_hour",
            "Hourly cost of the fleet as the last reconcile planned it (what the budget "
            "bounds); the current cost when no plan was published lately.",
            value=shared.planned_hourly_eur if recorded else sum(costs.values()),
        )
        plan_recorded = GaugeMetricFamily(
            "murmur_fleet_plan_recorded",
            "1 when the planned cost comes from a recent reconcile, 0 when it falls back.",
            value=1.0 if recorded else 0.0,
        )
        budget = GaugeMetricFamily(
            "murmur_fleet_budget_euros_per_hour",
            "The configured hourly budget cap of the whole fleet.",
            value=self._settings.budget.max_hourly_eur,
        )
        attempts = CounterMetricFamily(
            "murmur_provision_attempts",
            "Provisioning attempts by profile and outcome.",
            labels=["profile", "outcome"],
        )
        attempt_counts: Counter[tuple[str, str]] = Counter(
            {(p, o): 0 for p in profiles for o in store.PROVISION_OUTCOMES}
        )
        attempt_counts.update(shared.provision_attempts)
        for (profile, outcome), count in sorted(attempt_counts.items()):
            attempts.add_metric([profile, outcome], float(count))
        recreated = CounterMetricFamily(
            "murmur_broker_users_recreated",
            "Workers' broker users re-created after the broker lost them (restart, failover).",
            labels=["profile"],
        )
        for profile in sorted({*profiles, *shared.broker_users_recreated}):
            recreated.add_metric([profile], float(shared.broker_users_recreated.get(profile, 0)))
        yield from (by_state, cost, planned, plan_recorded, budget, pending, attempts, recreated)
        yield from self._control_plane(shared, now)

    def _control_plane(self, shared: store.SharedState, now: float) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "murmur_fleet_reconcile_age_seconds",
            "Seconds since a reconcile last completed: the control plane's liveness (no "
            "sample until one ever completed).",
        )
        if shared.last_reconciled is not None:
            age.add_metric([], max(now - shared.last_reconciled, 0.0))
        bound = GaugeMetricFamily(
            "murmur_fleet_reconcile_stale_seconds",
            "The configured age above which /readyz reports the control plane stalled.",
            value=self._settings.fleet.reconcile_stale_seconds,
        )
        yield from (age, bound)

    def _profile_holds(
        self, rows: Sequence[Any], profiles: list[str], now: float
    ) -> Iterator[Metric]:
        """Why a profile gets no new worker: failed boots in a row, a hold, a back-off."""
        failed = GaugeMetricFamily(
            "murmur_fleet_profile_failed_boots",
            "Workers of the profile in a row that never became ready (reset by a ready one).",
            labels=["profile"],
        )
        limit = GaugeMetricFamily(
            "murmur_fleet_max_failed_boots",
            "Failed boots in a row after which a profile gets no new worker for a while.",
            value=float(self._settings.fleet.max_failed_boots),
        )
        held = GaugeMetricFamily(
            "murmur_fleet_profile_held",
            "1 while the profile gets no new worker: `backoff` after an out-of-stock, `error` "
            "after another provisioning error, `failed_boots` after too many failed boots.",
            labels=["profile", "reason"],
        )
        by_name = {r[0]: r for r in rows}
        for name in profiles:
            row = by_name.get(name)
            boots = int(row[1] or 0) if row is not None else 0
            retry = row[2] if row is not None else None
            backoff = row[3] if row is not None else None
            failed.add_metric([name], float(boots))
            # retry_at holds after an error and after failed boots; the count tells which.
            # ... or after one boot failure the instance reported (app/fleet/apply.py).
            said = str(row[4] or "") if row is not None else ""
            boot_hold = boots >= self._settings.fleet.max_failed_boots or (
                boots > 0 and "never became ready" in said
            )
            for reason, until, applies in (
                ("backoff", backoff, True),
                ("error", retry, not boot_hold),
                ("failed_boots", retry, boot_hold),
            ):
                on = applies and until is not None and until.timestamp() > now
                held.add_metric([name, reason], 1.0 if on else 0.0)
        yield from (failed, limit, held)

    def _learned(self, profiles: list[str], now: float) -> Iterator[Metric]:
        """What the fleet measured (app/fleet/learned.py): boot estimate and speed per profile."""
        images = {p.name: p.worker_image for p in self._settings.profiles}
        history = read_learned(self._db, self._redis, datetime.fromtimestamp(now, UTC), images)
        rules = fleet_rules(self._settings)
        boot = GaugeMetricFamily(
            "murmur_fleet_profile_boot_estimate_seconds",
            "The profile's boot estimate and boot timeout: p95 of its recent successful boots "
            "x fleet.boot_estimate_margin, within the floor and fleet.boot_timeout_seconds.",
            labels=["profile"],
        )
        measured = GaugeMetricFamily(
            "murmur_fleet_profile_boots_measured",
            "Recent successful boots the profile's boot estimate comes from.",
            labels=["profile"],
        )
        speed = GaugeMetricFamily(
            "murmur_fleet_profile_speed_ratio",
            "Audio seconds transcribed per wall second on the profile, over recent finished "
            "jobs (no sample until one finished).",
            labels=["profile"],
        )
        for name in profiles:
            samples = history.boots.get(name, ())
            boot.add_metric([name], boot_estimate(samples, rules))
            measured.add_metric([name], float(len(samples)))
            if name in history.speed:
                speed.add_metric([name], history.speed[name])
        yield from (boot, measured, speed)

    def _lifecycle(self, rows: Sequence[Any], profiles: list[str]) -> Iterator[Metric]:
        bounds = LIFECYCLE_BUCKETS
        for index, phase in enumerate(LIFECYCLE_PHASES, start=2):
            counts: dict[str, list[int]] = {p: [0] * (len(bounds) + 1) for p in profiles}
            sums: dict[str, float] = {p: 0.0 for p in profiles}
            for row in rows:
                seconds = row[index]
                if seconds is None or (phase.needs_instance and not row[1]):
                    continue
                # Milliseconds: SQLite's julianday arithmetic is off by a few microseconds,
                # which must not move a value across a bucket boundary.
                seconds = max(round(float(seconds), 3), 0.0)
                profile = row[0]
                if profile not in counts:
                    counts[profile] = [0] * (len(bounds) + 1)
                    sums[profile] = 0.0
                counts[profile][bisect.bisect_left(bounds, seconds)] += 1
                sums[profile] += seconds
            family = HistogramMetricFamily(phase.metric, phase.doc, labels=["profile"])
            for profile in sorted(counts):
                family.add_metric(
                    [profile], _histogram(counts[profile], sums[profile], bounds), sums[profile]
                )
            yield family

    # -- per-worker usage ---------------------------------------------------------------------

    def _workers(
        self, workers: Sequence[Any], shared: store.SharedState, now: float
    ) -> Iterator[Metric]:
        families = _WorkerFamilies.new()
        for w in workers:
            labels = (w.profile, w.id)
            received = shared.last_report.get(w.id)
            if received is not None:
                families.age.add(labels, max(now - received, 0.0))
            snapshot = shared.snapshots.get(w.id)
            if snapshot is not None:
                families.add_report(labels, snapshot.report)
        yield from families.all()

    def _reporting(self, shared: store.SharedState) -> Iterator[Metric]:
        observability = self._settings.observability
        yield GaugeMetricFamily(
            "murmur_worker_reporting_enabled",
            "1 when workers are told to send usage reports.",
            value=1.0 if observability.enabled else 0.0,
        )
        yield GaugeMetricFamily(
            "murmur_worker_report_interval_seconds",
            "Seconds between a worker's usage reports (each jittered by ±10 %).",
            value=observability.report_interval_seconds,
        )
        yield CounterMetricFamily(
            "murmur_worker_reports_accepted",
            "Usage reports accepted.",
            value=float(shared.accepted),
        )
        rejected = CounterMetricFamily(
            "murmur_worker_report_rejections",
            "Usage reports refused, by reason.",
            labels=["reason"],
        )
        for reason in store.REJECTION_REASONS:
            rejected.add_metric([reason], float(shared.rejections.get(reason, 0)))
        yield rejected

    def _prune(self, workers: Sequence[Any], shared: store.SharedState, now: float) -> None:
        if not shared.foreign_freshness:
            return
        horizon = store.SNAPSHOT_INTERVALS * self._settings.observability.report_interval_seconds
        try:
            store.prune_retired(self._redis, {w.id for w in workers}, older_than=horizon, now=now)
        except redis.RedisError as exc:  # the next scrape tries again
            log.warning("could not prune retired workers' series: %s", type(exc).__name__)


def _reading(
    family: SeriesFamily, labels: tuple[str, ...], reading: Any, missing: Counter[str]
) -> bool:
    """Add a reading's value; count its reason when it has none. True when it had a value."""
    value = reading.get("value") if isinstance(reading, dict) else None
    if value is None:
        reason = reading.get("reason") if isinstance(reading, dict) else None
        missing[str(reason or "reading_failed")] += 1
        return False
    family.add(labels, float(value))
    return True


def render_metrics(settings: Settings, db: Database, r: redis.Redis) -> bytes:
    """One scrape in the Prometheus text format, from a fresh registry."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MurmurCollector(settings, db, r))
    # A scrape of 1,000 workers allocates about a million short-lived objects, none in
    # cycles; letting the collector run through them made scrapes 50 % slower and erratic.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return encode_text(registry)
    finally:
        if was_enabled:
            gc.enable()


_WORKER_LABELS = ("profile", "worker")


@dataclass
class _WorkerFamilies:
    """The per-worker series of one scrape, filled from each worker's last accepted report."""

    age: SeriesFamily
    state: SeriesFamily
    model_load: SeriesFamily
    transcriptions: SeriesFamily
    processing: SeriesFamily
    audio: SeriesFamily
    host: dict[str, SeriesFamily]
    gpus: dict[str, SeriesFamily]
    available: SeriesFamily
    missing: SeriesFamily

    @classmethod
    def new(cls) -> _WorkerFamilies:
        labels = _WORKER_LABELS
        return cls(
            age=SeriesFamily(
                "murmur_worker_report_age_seconds",
                "Seconds since the worker's last accepted usage report.",
                "gauge",
                labels,
            ),
            state=SeriesFamily(
                "murmur_worker_reported_state",
                "1 for the state the worker reported last (starting|loading|ready|busy|draining).",
                "gauge",
                (*labels, "state"),
            ),
            model_load=SeriesFamily(
                "murmur_worker_model_load_seconds",
                "How long the worker took to load its model.",
                "gauge",
                labels,
            ),
            transcriptions=SeriesFamily(
                "murmur_worker_transcriptions",
                "Transcriptions by this worker process and outcome (per process, best effort).",
                "counter",
                (*labels, "outcome"),
            ),
            processing=SeriesFamily(
                "murmur_worker_processing_seconds",
                "Seconds this worker process spent on jobs (per process, best effort).",
                "counter",
                labels,
            ),
            audio=SeriesFamily(
                "murmur_worker_audio_seconds",
                "Seconds of audio this worker process transcribed (per process, best effort).",
                "counter",
                labels,
            ),
            host={key: SeriesFamily(name, doc, "gauge", labels) for key, name, doc in _HOST_FIELDS},
            gpus={
                key: SeriesFamily(name, doc, "gauge", (*labels, "gpu"))
                for key, name, doc in _GPU_FIELDS
            },
            available=SeriesFamily(
                "murmur_worker_gpu_telemetry_available",
                "1 when the worker's last report carried at least one GPU reading, else 0.",
                "gauge",
                labels,
            ),
            missing=SeriesFamily(
                "murmur_worker_readings_missing",
                "Readings missing from the worker's last report, by reason.",
                "gauge",
                (*labels, "reason"),
            ),
        )

    def add_report(self, labels: tuple[str, str], report: dict[str, Any]) -> None:
        self.state.add((*labels, str(report["state"])), 1.0)
        if report.get("model_load_seconds") is not None:
            self.model_load.add(labels, float(report["model_load_seconds"]))
        done = report["transcriptions"]
        self.transcriptions.add((*labels, "succeeded"), float(done["succeeded"]))
        self.transcriptions.add((*labels, "failed"), float(done["failed"]))
        self.processing.add(labels, float(report["processing_seconds"]))
        self.audio.add(labels, float(report["audio_seconds"]))
        missing: Counter[str] = Counter()
        for key, family in self.host.items():
            _reading(family, labels, report["host"][key], missing)
        gpu = report["gpu"]
        if gpu.get("reason"):
            missing[str(gpu["reason"])] += 1
        any_gpu = False
        for device in gpu["devices"]:
            device_labels = (*labels, str(int(device["index"])))
            for key, family in self.gpus.items():
                any_gpu |= _reading(family, device_labels, device[key], missing)
        self.available.add(labels, 1.0 if any_gpu else 0.0)
        for reason in sorted(missing):
            if reason in MISSING_REASONS:
                self.missing.add((*labels, reason), float(missing[reason]))

    def all(self) -> Iterator[Metric]:
        yield from (self.age, self.state, self.model_load, self.transcriptions)
        yield from (self.processing, self.audio)
        yield from self.host.values()
        yield from self.gpus.values()
        yield from (self.available, self.missing)
