"""Benchmark of the fleet planner: time per plan against waiting jobs, workers and profiles.

The planner takes jobs aggregated (a count per profile and status, plus bounded id lists), so
its time should follow profiles + workers and stay flat as the backlog grows. Target: a plan
for 10,000 waiting jobs, 6 profiles and 100 workers in at most 50 ms. The baseline is the
1,000-job case measured in the same run; ratios near 1.0 mean "does not grow with jobs".

A second table times the reader that feeds the planner (SQLite with N queued jobs, the same
queries read_snapshot runs), to show where the backlog does cost something: COUNT/MIN over an
index, not the planner.

Run: .venv/bin/python bench/reconcile.py            (add --no-read to skip the SQLite part,
--smoke for a few plans of the two smallest cases)
"""

from __future__ import annotations

import random
import statistics
import sys
import time
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

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_connect_timeout=2)
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
    return 0 if target <= TARGET_MS or SMOKE else 1


if __name__ == "__main__":
    sys.exit(main())
