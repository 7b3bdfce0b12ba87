"""Benchmark of the fleet planner: time per plan against waiting jobs, workers and profiles.

The planner takes jobs aggregated (a count per profile and status, plus bounded id lists), so
its time should follow profiles + workers and stay flat as the backlog grows. Target: a plan
for 10,000 waiting jobs, 6 profiles and 100 workers in at most 50 ms. The baseline is the
1,000-job case measured in the same run; ratios near 1.0 mean "does not grow with jobs".

A second table times the reader that feeds the planner (SQLite with N queued jobs, the same
queries read_snapshot runs), to show where the backlog does cost something: COUNT/MIN over an
index, not the planner.

A third table (issue 32, fair dispatch) times one reconcile's read and plan over a backlog of
100,000 queued jobs from 1,000 API tokens (a few `diarize=true` jobs among them), on SQLite
and on PostgreSQL: `read_snapshot` (the queue heads per token and kind of job among the oldest
queued jobs, and every token's oldest job) and `plan_fleet` on what it read, median of 5
runs, with the load average, as a share of the reconcile interval (5 s by default).

Run: .venv/bin/python bench/reconcile.py            (add --no-read to skip the database parts,
--smoke for a few plans of the two smallest cases and a 2,000-job fair-dispatch read on SQLite)
Redis: MURMUR_BENCH_REDIS_URL (default redis://127.0.0.1:6379/0). PostgreSQL:
MURMUR_BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres; a database
of its own is created and dropped; skipped when not reachable).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.fleet.planner import (  # noqa: E402
    ActiveJob,
    FleetRules,
    FleetState,
    InstanceSnapshot,
    JobCounts,
    ProfileSnapshot,
    WorkerSnapshot,
    plan_fleet,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RULES = FleetRules(
    idle_timeout=timedelta(seconds=60),
    boot_timeout=timedelta(seconds=900),
    create_timeout=timedelta(seconds=130),
    heartbeat_timeout=timedelta(seconds=90),
    max_hourly_eur=500.0,
)
TARGET_MS = 50.0
# `--smoke` (CI, tests/test_benches.py): the same path, a few iterations, no verdict on speed.
SMOKE = "--smoke" in sys.argv[1:]
REPEAT = 3 if SMOKE else 30
REDIS_URL = os.environ.get("MURMUR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "MURMUR_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def fleet_state(jobs: int, n_profiles: int, n_workers: int, seed: int = 1) -> FleetState:
    """A busy fleet: workers in every state, jobs running/dispatched, some orphans."""
    rng = random.Random(seed)
    profiles = tuple(
        ProfileSnapshot(
            name=f"p{i}",
            provider="scaleway",
            enabled=i % 5 != 4,
            max_workers=max(1, 2 * n_workers // n_profiles),
            hourly_cost_eur=0.75 + i * 0.1,
            backoff_until=NOW + timedelta(seconds=30) if i % 3 == 1 else None,
        )
        for i in range(n_profiles)
    )
    workers = []
    active = []
    for i in range(n_workers):
        profile = profiles[i % n_profiles].name
        state = rng.choice(["ready", "ready", "ready", "booting", "deleting"])
        busy = state == "ready" and rng.random() < 0.7
        workers.append(
            WorkerSnapshot(
                id=f"w{i}",
                profile=profile,
                provider="scaleway",
                state=state,
                requested_at=NOW - timedelta(seconds=rng.randint(60, 3000)),
                instance_id=f"i{i}",
                hourly_cost_eur=0.75,
                busy=busy,
                created_at=NOW - timedelta(seconds=50),
                booted_at=NOW - timedelta(seconds=40) if state != "booting" else None,
                ready_at=NOW - timedelta(seconds=30) if state == "ready" else None,
                idle_since=None if busy else NOW - timedelta(seconds=rng.randint(1, 120)),
                last_seen_at=NOW - timedelta(seconds=rng.randint(1, 100)),
            )
        )
        if busy:
            active.append(ActiveJob(f"r{i}", profile, "running", f"w{i}"))
    # Jobs waiting on queues: bounded sample as the snapshot reader would pass it.
    for i in range(min(jobs, 2 * n_workers)):
        active.append(ActiveJob(f"d{i}", profiles[i % n_profiles].name, "dispatched"))
    counts: dict[str, list[int]] = {p.name: [0, 0] for p in profiles}
    for a in active:
        counts[a.profile or ""][0 if a.status == "dispatched" else 1] += 1
    inventory = tuple(
        InstanceSnapshot("scaleway", w.instance_id or "", "running", w.id, w.profile)
        for w in workers
        if rng.random() > 0.02  # a few vanished
    ) + tuple(
        InstanceSnapshot("scaleway", f"orphan{i}", "running", f"wlost{i}", profiles[0].name)
        for i in range(5)
    )
    serving = sum(1 for w in workers if w.state in ("ready", "booting"))
    return FleetState(
        now=NOW,
        rules=RULES,
        profiles=profiles,
        workers=tuple(workers),
        inventory=inventory,
        inventory_known=frozenset({"scaleway"}),
        queued=jobs,
        oldest_queued_at=NOW - timedelta(seconds=600),
        # The reader fetches at most min(max_dispatch, serving workers) ids, whatever the backlog.
        dispatchable=tuple(f"q{i}" for i in range(min(jobs, RULES.max_dispatch, serving))),
        job_counts=tuple(JobCounts(n, d, r) for n, (d, r) in counts.items()),
        active_jobs=tuple(active),
    )


def time_plan(state: FleetState) -> float:
    """Median milliseconds per plan."""
    plan_fleet(state)  # warm up
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        plan_fleet(state)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def read_times(sizes: list[int]) -> None:
    """Milliseconds for read_snapshot over SQLite with N queued jobs (Redis read-only)."""
    import tempfile

    import redis

    from app.config import Settings
    from app.db import Base, Database
    from app.fleet.providers import ProviderRegistry
    from app.fleet.snapshot import read_snapshot
    from app.models import Job
    from app.services import build_services

    class NoInstances:
        name = "local"

        def list_by_tag(self, scopes: frozenset[str]) -> list[object]:
            return []

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        print("(Redis not reachable: reader timings skipped)")
        return
    print()
    print("snapshot reader (SQLite file, queued jobs with audio, median of 5 reads)")
    print(f"{'waiting jobs':>12} {'ms/read':>8}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings.model_validate(
                {"database_url": f"sqlite:///{tmp}/bench.db", "profiles": []}
            )
            db = Database(settings.database_url)
            Base.metadata.create_all(db.engine)
            with db.engine.begin() as conn:
                conn.execute(
                    Job.__table__.insert(),
                    [
                        {
                            "id": f"job_{i:08d}",
                            "status": "queued",
                            "owner": "bench",
                            "source": "upload",
                            "audio_key": "x",
                            "created_at": NOW + timedelta(microseconds=i),
                            "updated_at": NOW,
                            "attempts": 0,
                            "word_timestamps": False,
                        }
                        for i in range(n)
                    ],
                )
            svc = build_services(
                settings.model_copy(update={"storage_path": f"{tmp}/audio"}),
                None,  # type: ignore[arg-type]
                db=db,
                providers=ProviderRegistry(settings, {"local": NoInstances()}),  # type: ignore[dict-item]
            )
            samples = []
            for _ in range(5):
                start = time.perf_counter()
                snapshot = read_snapshot(svc, NOW)
                samples.append((time.perf_counter() - start) * 1000)
            assert snapshot.state.queued == n
            db.dispose()
        print(f"{n:>12,} {statistics.median(samples):>8.2f}")


@contextmanager
def _database(kind: str, tmp: str) -> Iterator[str]:
    """A migrated, empty database of `kind`; its URL. Removed afterwards."""
    from app.migrate import upgrade

    if kind == "sqlite":
        url = f"sqlite:///{tmp}/fair.db"
        upgrade(url)
        yield url
        return
    import psycopg

    name = f"murmur_bench_fair_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{POSTGRES_URL.rsplit('/', 1)[0]}/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _fair_fleet(state: FleetState, n_workers: int) -> FleetState:
    """The jobs read, on a fleet of two profiles: a plain one with `n_workers` ready workers
    (half idle) and a diarizing one held after an error."""
    profiles = (
        ProfileSnapshot("plain", "local", True, n_workers, 0.0),
        ProfileSnapshot("diarize", "local", True, 1, 0.0, retry_at=NOW + timedelta(seconds=600)),
    )
    workers = tuple(
        WorkerSnapshot(
            id=f"w{i}",
            profile="plain",
            provider="local",
            state="ready",
            requested_at=NOW - timedelta(seconds=600),
            instance_id=f"i{i}",
            hourly_cost_eur=0.0,
            busy=i % 2 == 0,
            created_at=NOW - timedelta(seconds=590),
            booted_at=NOW - timedelta(seconds=500),
            ready_at=NOW - timedelta(seconds=400),
            idle_since=None if i % 2 == 0 else NOW - timedelta(seconds=5),
            last_seen_at=NOW - timedelta(seconds=1),
        )
        for i in range(n_workers)
    )
    diarizing = frozenset({"diarize"})
    # The bench's diarize=true jobs are every 50th (job_00000000, job_00000050, ...).
    routes = {j: diarizing for j in state.dispatchable if int(j.rsplit("_", 1)[1]) % 50 == 0}
    return replace(state, profiles=profiles, workers=workers, routes=routes)


def fair_dispatch_times(n_jobs: int, n_tokens: int, kinds: list[str]) -> None:
    """Issue 32: a reconcile's read and plan over `n_jobs` queued jobs from `n_tokens` tokens."""
    import tempfile

    import redis

    from app.config import Settings
    from app.db import Database
    from app.fleet.providers import ProviderRegistry
    from app.fleet.snapshot import read_snapshot
    from app.models import Job
    from app.services import build_services

    class NoInstances:
        name = "local"

        def list_by_tag(self, scopes: frozenset[str]) -> list[object]:
            return []

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError:
        print("(Redis not reachable: fair-dispatch timings skipped)")
        return
    interval = 5.0  # fleet.reconcile_interval_seconds' default
    print()
    print(
        f"fair dispatch: {n_jobs:,} queued jobs from {n_tokens:,} tokens "
        f"(1 in 50 diarize=true), median of 5, ms"
    )
    print(f"{'database':>10} {'read':>8} {'plan':>8} {'offered':>8} {'of 5 s':>7} {'load':>5}")
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                context = _database(kind, tmp)
                url = context.__enter__()
            except Exception as exc:  # PostgreSQL not reachable here: say so, go on
                print(f"{kind:>10} skipped: {type(exc).__name__}")
                continue
            try:
                settings = Settings.model_validate({"database_url": url, "profiles": []})
                db = Database(url)
                rows = [
                    {
                        "id": f"job_{i:08d}",
                        "status": "queued",
                        "owner": f"token-{i % n_tokens:04d}",
                        "source": "upload",
                        "audio_key": "x",
                        "diarize": i % 50 == 0,
                        "created_at": NOW + timedelta(microseconds=i),
                        "updated_at": NOW,
                        "attempts": 0,
                        "word_timestamps": False,
                    }
                    for i in range(n_jobs)
                ]
                with db.engine.begin() as conn:
                    for start in range(0, n_jobs, 10_000):
                        conn.execute(Job.__table__.insert(), rows[start : start + 10_000])
                svc = build_services(
                    settings.model_copy(update={"storage_path": f"{tmp}/audio"}),
                    None,  # type: ignore[arg-type]
                    db=db,
                    providers=ProviderRegistry(settings, {"local": NoInstances()}),  # type: ignore[dict-item]
                )
                reads, plans = [], []
                for _ in range(5):
                    start = time.perf_counter()
                    snapshot = read_snapshot(svc, NOW)
                    reads.append((time.perf_counter() - start) * 1000)
                    state = _fair_fleet(snapshot.state, 100)
                    start = time.perf_counter()
                    plan_fleet(state)
                    plans.append((time.perf_counter() - start) * 1000)
                assert snapshot.state.queued == n_jobs
                db.dispose()
            finally:
                context.__exit__(None, None, None)
        read, plan = statistics.median(reads), statistics.median(plans)
        share = (read + plan) / (interval * 1000)
        offered = len(snapshot.state.dispatchable)
        load = os.getloadavg()[0]
        print(f"{kind:>10} {read:>8.1f} {plan:>8.1f} {offered:>8,} {share:>7.1%} {load:>5.1f}")


def main() -> int:
    print(f"fleet planner, median of {REPEAT} plans (Python {sys.version.split()[0]})")
    print(f"{'waiting jobs':>12} {'profiles':>8} {'workers':>7} {'ms/plan':>8} {'vs 1k':>6}")
    baseline = time_plan(fleet_state(1_000, 6, 100))
    results = {}
    cases = [(1_000, 6, 100), (10_000, 6, 100), (100_000, 6, 100), (10_000, 6, 1_000)]
    cases += [(10_000, 60, 100)]
    for jobs, n_profiles, n_workers in cases[:2] if SMOKE else cases:
        ms = time_plan(fleet_state(jobs, n_profiles, n_workers))
        results[(jobs, n_profiles, n_workers)] = ms
        print(f"{jobs:>12,} {n_profiles:>8} {n_workers:>7} {ms:>8.3f} {ms / baseline:>6.2f}x")
    target = results[(10_000, 6, 100)]
    verdict = "OK" if target <= TARGET_MS else "OVER TARGET"
    print(
        f"10,000 jobs / 6 profiles / 100 workers: {target:.3f} ms (target <= {TARGET_MS} ms): "
        f"{verdict}"
    )
    if "--no-read" not in sys.argv:
        read_times([1_000] if SMOKE else [1_000, 10_000, 100_000])
        if SMOKE:
            fair_dispatch_times(2_000, 20, ["sqlite"])
        else:
            fair_dispatch_times(100_000, 1_000, ["sqlite", "postgresql"])
    return 0 if target <= TARGET_MS or SMOKE else 1


if __name__ == "__main__":
    sys.exit(main())
