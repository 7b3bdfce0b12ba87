"""Where observability state lives in Redis, shared by every API process, worker and the fleet.

Layout (all keys under `murmur:`; the broker's own keys are untouched):

- `murmur:worker:<id>:report` (string): the latest accepted snapshot, JSON; expires after
  3 report intervals.
- `murmur:worker:<id>:cursor` (hash): `started`, `seq`, `line`, `origin` of the newest
  report, which orders reports; 7 days, or until `forget_worker`.
- `murmur:worker:<id>:log` (list): the redacted log tail, newest last; 200 lines, expires
  24 h after the last line arrived.
- `murmur:worker_last_report` (hash): worker id -> receipt time (unix s); until
  `forget_worker` or the scrape-time prune.
- `murmur:reports_accepted` (string) and `murmur:report_rejections` (hash reason -> count).
- `murmur:provision_attempts` (hash `<profile>|<outcome>` -> count), written by the fleet.
- `murmur:broker_users_recreated` (hash profile -> count): workers' broker users the fleet
  re-created after the broker lost them (app/fleet/broker_users.py).
- `murmur:fleet:plan` (string, JSON) is the fleet's: each reconcile publishes its plan
  there (app.fleet.liveness.PLAN_KEY); the planned cost is read from it.
- `murmur:fleet:reconciled-at` (string, unix s) is the fleet's too: when a reconcile last
  completed (app.fleet.liveness); its age is the control plane's liveness.
- `murmur:job_latency` (hash): job wait and duration histogram buckets.

Counters live in Redis, not in process memory, so every gunicorn process serves the same
totals; they reset only if Redis is flushed, which Prometheus treats as a counter reset.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pydantic_core
import redis

from app.fleet.liveness import PLAN_KEY, RECONCILED_KEY
from app.models import FINISHED_STATES, Job
from gpu_worker.protocol.broker import PROFILE_NAME
from gpu_worker.protocol.usage import UsageReport

log = logging.getLogger(__name__)

FRESHNESS_KEY = "murmur:worker_last_report"
ACCEPTED_KEY = "murmur:reports_accepted"
REJECTIONS_KEY = "murmur:report_rejections"
PROVISION_ATTEMPTS_KEY = "murmur:provision_attempts"
BROKER_USERS_RECREATED_KEY = "murmur:broker_users_recreated"
JOB_LATENCY_KEY = "murmur:job_latency"

SNAPSHOT_INTERVALS = 3  # a snapshot outlives its report by this many report intervals
LOG_LINES_KEPT = 200
LOG_RETENTION_SECONDS = 24 * 3600
CURSOR_TTL_SECONDS = 7 * 24 * 3600

# Why a report was refused; a closed set, so `reason` is a bounded metric label.
REJECTION_REASONS = (
    "reporting_disabled",
    "payload_too_large",
    "unauthorized",
    "unknown_worker",
    "worker_retired",
    "invalid_body",
    "stale_sequence",
)
# How a provisioning attempt ended, as the fleet records it (app/fleet/providers/base.py errors).
PROVISION_OUTCOMES = (
    "succeeded",
    "out_of_stock",
    "quota_exceeded",
    "permission_denied",
    "invalid_argument",
    "provider_unavailable",
    "timeout",
    "error",
)

# Seconds; shared by job wait and job duration (a 4-hour file is the longest job).
JOB_LATENCY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                       7200.0, 14400.0)  # fmt: skip


def snapshot_key(worker_id: str) -> str:
    return f"murmur:worker:{worker_id}:report"


def cursor_key(worker_id: str) -> str:
    return f"murmur:worker:{worker_id}:cursor"


def log_key(worker_id: str) -> str:
    return f"murmur:worker:{worker_id}:log"


def snapshot_ttl_ms(interval_seconds: float) -> int:
    # Rounded to the microsecond first: 3 x 0.2 s is 600.0000000000001 ms in floating point.
    return max(1, math.ceil(round(interval_seconds * SNAPSHOT_INTERVALS * 1000, 3)))


# Atomic "newer wins", and only then replace the snapshot, append unseen log lines and
# update freshness. A report that is not newer changes nothing but the rejection counter.
#
# Which report is newer is decided on the control plane's clock, never the worker's: a worker
# whose clock is hours off must not make its own later reports look old. `started` (the
# worker's wall-clock process start) only names the process; within one process the
# sequence orders its reports. Between two processes, the later one is the one whose
# `origin` is later: the report's arrival here minus its uptime (the worker's monotonic
# clock), i.e. when the process started, on this clock, plus the report's time in transit.
# A process keeps the earliest origin seen, the closest to its real start.
# KEYS: cursor, snapshot, log, freshness, accepted, rejections
# ARGV: worker id, started, seq, snapshot JSON, received at, snapshot ttl ms, cursor ttl s,
#       log ttl s, log lines kept, origin, then pairs of (line number, text)
_STORE_REPORT = """
local cur = redis.call('HMGET', KEYS[1], 'started', 'seq', 'line', 'origin')
local seq = tonumber(ARGV[3])
local origin = tonumber(ARGV[10])
local same = cur[1] == ARGV[2]
local cur_origin = tonumber(cur[4])
if cur[1] then
  local stale
  if same then
    stale = seq <= tonumber(cur[2])
  else
    -- a cursor written before origins were kept cannot order processes: the newcomer wins
    stale = cur_origin ~= nil and origin <= cur_origin
  end
  if stale then
    redis.call('HINCRBY', KEYS[6], 'stale_sequence', 1)
    return 0
  end
end
if same and cur_origin and cur_origin < origin then origin = cur_origin end
local line = 0
if same then line = tonumber(cur[3]) or 0 end
local appended = 0
for i = 11, #ARGV, 2 do
  local n = tonumber(ARGV[i])
  if n > line then
    redis.call('RPUSH', KEYS[3], ARGV[i + 1])
    line = n
    appended = appended + 1
  end
end
if appended > 0 then
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[9]), -1)
  redis.call('EXPIRE', KEYS[3], ARGV[8])
end
redis.call('HSET', KEYS[1], 'started', ARGV[2], 'seq', ARGV[3], 'line', tostring(line),
           'origin', string.format('%.17g', origin))
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[6])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[5])
redis.call('INCR', KEYS[5])
return 1
"""
_STORE_REPORT_SHA = hashlib.sha1(_STORE_REPORT.encode()).hexdigest()  # noqa: S324 - Redis' id


def store_report(
    r: redis.Redis,
    worker_id: str,
    report: UsageReport,
    log_lines: Sequence[tuple[int, str]],
    *,
    received_at: float,
    interval_seconds: float,
) -> bool:
    """Keep `report` as the worker's snapshot unless a newer one is stored; True if kept.

    Newer by the control plane's clock (`received_at`), whatever the worker's clock says.
    """
    # Built as text: the report is already validated, and this runs for every report.
    snapshot = (
        f'{{"received_at":{received_at!r},"report":{report.model_dump_json(exclude={"log"})}}}'
    )
    args: list[str | int | float] = [
        worker_id,
        repr(report.process_started_at),
        report.sequence,
        snapshot,
        repr(received_at),
        snapshot_ttl_ms(interval_seconds),
        CURSOR_TTL_SECONDS,
        LOG_RETENTION_SECONDS,
        LOG_LINES_KEPT,
        # When the process started, on this clock (see _STORE_REPORT).
        repr(received_at - report.uptime_seconds),
    ]
    for number, text in log_lines:
        args += [number, text]
    keys = [
        cursor_key(worker_id),
        snapshot_key(worker_id),
        log_key(worker_id),
        FRESHNESS_KEY,
        ACCEPTED_KEY,
        REJECTIONS_KEY,
    ]
    try:
        stored = r.evalsha(_STORE_REPORT_SHA, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:  # a restarted Redis forgot it: EVAL loads it again
        stored = r.eval(_STORE_REPORT, len(keys), *keys, *args)
    return bool(stored)


def count_rejection(r: redis.Redis, reason: str) -> None:
    """Count a refused report; never fails the request that is being refused."""
    if reason not in REJECTION_REASONS:
        raise ValueError(f"unknown rejection reason {reason!r}")
    try:
        r.hincrby(REJECTIONS_KEY, reason, 1)
    except redis.RedisError as exc:
        log.warning("could not count a rejected report: %s", type(exc).__name__)


def forget_worker(r: redis.Redis, worker_id: str, *, keep_log: bool = False) -> None:
    """Remove everything observability holds about a retired worker (call at teardown).

    `keep_log=True` keeps its log tail until the tail's own 24 h expiry, for a worker that
    died and whose last lines an operator may still want to read.
    """
    keys = [snapshot_key(worker_id), cursor_key(worker_id)]
    if not keep_log:
        keys.append(log_key(worker_id))
    pipe = r.pipeline(transaction=True)
    pipe.delete(*keys)
    pipe.hdel(FRESHNESS_KEY, worker_id)
    pipe.execute()


def last_reports(r: redis.Redis, worker_ids: list[str]) -> dict[str, datetime]:
    """When each worker's latest accepted report arrived: its heartbeat while reporting is on.

    The report endpoint records this in Redis only (no database write per report); the fleet
    reads it beside `workers.last_seen_at`, which claims, results and bare heartbeats update.
    A Redis failure reads as "no report", which only the database's heartbeat then covers.
    """
    if not worker_ids:
        return {}
    try:
        values = r.hmget(FRESHNESS_KEY, worker_ids)
    except redis.RedisError:
        return {}
    seen: dict[str, datetime] = {}
    for worker_id, raw in zip(worker_ids, values, strict=True):
        try:
            seen[worker_id] = datetime.fromtimestamp(float(cast(Any, raw)), UTC)
        except (TypeError, ValueError):
            continue
    return seen


def record_provision_attempt(r: redis.Redis, profile: str, outcome: str) -> None:
    """Count one provisioning attempt (for the fleet); outcome from PROVISION_OUTCOMES."""
    if outcome not in PROVISION_OUTCOMES:
        raise ValueError(f"unknown provisioning outcome {outcome!r}")
    if not PROFILE_NAME.fullmatch(profile):
        raise ValueError(f"not a profile name: {profile!r}")
    r.hincrby(PROVISION_ATTEMPTS_KEY, f"{profile}|{outcome}", 1)


def record_broker_user_recreated(r: redis.Redis, profile: str) -> None:
    """Count one worker's broker user re-created after the broker lost it (for the fleet)."""
    if not PROFILE_NAME.fullmatch(profile):
        raise ValueError(f"not a profile name: {profile!r}")
    r.hincrby(BROKER_USERS_RECREATED_KEY, profile, 1)


def _bucket(seconds: float) -> str:
    index = bisect.bisect_left(JOB_LATENCY_BUCKETS, seconds)
    return str(index)  # len(JOB_LATENCY_BUCKETS) is the +Inf bucket


def record_job_finished(r: redis.Redis, job: Job) -> None:
    """Observe a finished job's wait (created → started) and duration (created → finished).

    Call once per job, where its final state is stored; never raises.
    """
    if job.status not in FINISHED_STATES or job.finished_at is None:
        return
    profile = job.profile or ""
    created = job.created_at
    duration = max((job.finished_at - created).total_seconds(), 0.0)
    pipe = r.pipeline(transaction=False)
    prefix = f"duration|{profile}|{job.status}"
    pipe.hincrby(JOB_LATENCY_KEY, f"{prefix}|{_bucket(duration)}", 1)
    pipe.hincrbyfloat(JOB_LATENCY_KEY, f"{prefix}|sum", duration)
    if job.started_at is not None:
        wait = max((job.started_at - created).total_seconds(), 0.0)
        pipe.hincrby(JOB_LATENCY_KEY, f"wait|{profile}|{_bucket(wait)}", 1)
        pipe.hincrbyfloat(JOB_LATENCY_KEY, f"wait|{profile}|sum", wait)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not record job latency: %s", type(exc).__name__)


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSnapshot:
    """A worker's latest accepted report as stored (validated on the way in)."""

    received_at: float
    report: dict[str, Any]


@dataclass(frozen=True)
class SharedState:
    """Everything a scrape needs from Redis, read in one round trip."""

    snapshots: dict[str, WorkerSnapshot]
    last_report: dict[str, float]  # inventory workers that ever reported -> last receipt
    foreign_freshness: bool
    queue_messages: dict[str, int]
    accepted: int
    rejections: dict[str, int]
    provision_attempts: dict[tuple[str, str], int]
    # From the fleet's last published plan; None when no reconcile ran lately.
    planned_hourly_eur: float | None
    job_latency: dict[str, float]
    # When a reconcile last completed (unix s); None when none was ever recorded.
    last_reconciled: float | None = None
    broker_users_recreated: dict[str, int] = field(default_factory=dict)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _snapshot(raw: Any) -> WorkerSnapshot | None:
    if raw is None:
        return None
    try:
        data = pydantic_core.from_json(raw)  # ~2.5x json.loads: a scrape reads 1,000 of these
        return WorkerSnapshot(float(data["received_at"]), cast(dict[str, Any], data["report"]))
    except (ValueError, KeyError, TypeError):
        return None


def _planned_cost(raw: Any) -> float | None:
    """The planned hourly cost from the fleet's published plan (None: no plan lately)."""
    if raw is None:
        return None
    try:
        return float(json.loads(raw)["planned_hourly_eur"])
    except (ValueError, KeyError, TypeError):
        return None


def read_shared_state(
    r: redis.Redis, worker_ids: Sequence[str], queues: Sequence[str]
) -> SharedState:
    """Snapshots and freshness of `worker_ids` (the inventory), queue lengths and counters.

    One round trip in the steady state: a worker's snapshot carries its receipt time, so
    the freshness hash is read only for workers whose snapshot has expired.
    """
    pipe = r.pipeline(transaction=False)
    pipe.mget([snapshot_key(w) for w in worker_ids] or ["murmur:none"])
    pipe.hlen(FRESHNESS_KEY)
    for queue in queues:
        pipe.llen(queue)
    pipe.get(ACCEPTED_KEY)
    pipe.hgetall(REJECTIONS_KEY)
    pipe.hgetall(PROVISION_ATTEMPTS_KEY)
    pipe.get(PLAN_KEY)
    pipe.hgetall(JOB_LATENCY_KEY)
    pipe.get(RECONCILED_KEY)
    pipe.hgetall(BROKER_USERS_RECREATED_KEY)
    raw_snapshots, fresh_entries, *rest = pipe.execute()
    lengths, (accepted, rejections, attempts, plan, latency, reconciled, recreated) = (
        rest[: len(queues)],
        rest[len(queues) :],
    )
    snapshots: dict[str, WorkerSnapshot] = {}
    last_report: dict[str, float] = {}
    expired: list[str] = []
    for worker_id, raw in zip(worker_ids, raw_snapshots, strict=False):
        snapshot = _snapshot(raw)
        if snapshot is None:
            expired.append(worker_id)
        else:
            snapshots[worker_id] = snapshot
            last_report[worker_id] = snapshot.received_at
    if expired:
        for worker_id, value in zip(expired, r.hmget(FRESHNESS_KEY, expired), strict=True):
            if value is not None:
                last_report[worker_id] = float(value)
    provision: dict[tuple[str, str], int] = {}
    for entry, count in attempts.items():
        profile, _, outcome = _text(entry).partition("|")
        provision[(profile, outcome)] = int(count)
    return SharedState(
        snapshots=snapshots,
        last_report=last_report,
        # More freshness entries than inventory workers with one: some belong to workers
        # that left the inventory without `forget_worker`.
        foreign_freshness=int(fresh_entries) > len(last_report),
        queue_messages={q: int(n) for q, n in zip(queues, lengths, strict=True)},
        accepted=int(accepted or 0),
        rejections={_text(k): int(v) for k, v in rejections.items()},
        provision_attempts=provision,
        planned_hourly_eur=_planned_cost(plan),
        job_latency={_text(k): float(v) for k, v in latency.items()},
        last_reconciled=_unix_time(reconciled),
        broker_users_recreated={_text(k): int(v) for k, v in recreated.items()},
    )


def _unix_time(raw: Any) -> float | None:
    try:
        return None if raw is None else float(raw)
    except (TypeError, ValueError):
        return None


def prune_retired(
    r: redis.Redis, inventory: set[str], *, older_than: float, now: float
) -> list[str]:
    """Drop freshness, snapshots and cursors of workers gone from the inventory.

    The fleet calls `forget_worker` at teardown; this catches what it missed. Only entries
    older than `older_than` seconds go, so a worker created after the caller read the
    inventory cannot lose its fresh entry. Log tails expire on their own.
    """
    gone = [
        worker_id
        for worker_id, received in (
            (_text(k), float(v)) for k, v in r.hgetall(FRESHNESS_KEY).items()
        )
        if worker_id not in inventory and now - received > older_than
    ]
    if gone:
        pipe = r.pipeline(transaction=False)
        pipe.hdel(FRESHNESS_KEY, *gone)
        pipe.delete(*[snapshot_key(w) for w in gone], *[cursor_key(w) for w in gone])
        pipe.execute()
    return gone


def read_snapshot(r: redis.Redis, worker_id: str) -> WorkerSnapshot | None:
    return _snapshot(r.get(snapshot_key(worker_id)))


def read_last_report(r: redis.Redis, worker_id: str) -> float | None:
    value = r.hget(FRESHNESS_KEY, worker_id)
    return float(value) if value is not None else None


def read_log(r: redis.Redis, worker_id: str) -> list[str]:
    return [_text(line) for line in r.lrange(log_key(worker_id), 0, -1)]
