"""Submissions per second through gunicorn: Murmur's POST /v1/jobs vs a bare `delay()` endpoint.

Both apps run under the same gunicorn settings, receive the same multipart upload of
speech-short.wav from the same client threads, and send one Celery message per request to the
same Redis. Murmur additionally authenticates, probes the audio, stores it and commits a job
row before sending. Prints requests per second for each and the ratio (target >= 0.8).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import redis
import requests
from _stack import ROOT, TOKEN, bench_env, free_port, gunicorn, temp_dir

# `--smoke` (CI, tests/test_benches.py): the same path, a few iterations, no verdict on speed.
SMOKE = "--smoke" in sys.argv[1:]
REQUESTS = 10 if SMOKE else 300
CLIENT_THREADS = 8
ROUNDS = 1 if SMOKE else 3
AUDIO = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()


def load(url: str, headers: dict[str, str]) -> float:
    """Requests per second for REQUESTS uploads from CLIENT_THREADS threads."""
    counter = iter(range(REQUESTS))
    lock = threading.Lock()
    failures: list[int] = []

    def client() -> None:
        session = requests.Session()
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            response = session.post(
                url, headers=headers, files={"file": ("a.wav", AUDIO)}, timeout=30
            )
            if response.status_code != 202:
                failures.append(response.status_code)

    threads = [threading.Thread(target=client) for _ in range(CLIENT_THREADS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} requests failed: {set(failures)}")
    return REQUESTS / elapsed


def main() -> int:
    tmp = temp_dir()
    port_m, port_b = free_port(), free_port()
    env_m = bench_env(tmp, port_m)
    env_b = {**bench_env(tmp, port_b), "PYTHONPATH": str(Path(__file__).parent)}
    sys.path.insert(0, str(ROOT))
    from app.db import Database
    from app.migrate import upgrade
    from app.models import Worker, WorkerState

    upgrade(env_m["MURMUR_DATABASE_URL"])
    db = Database(env_m["MURMUR_DATABASE_URL"])
    # A live worker: the first submission is dispatched at once, the rest of one token's burst
    # wait queued for the reconcile's fair turns (docs/fleet.md; before issue 32 each was sent).
    with db.session() as s:
        s.add(
            Worker(
                profile="local-cpu",
                provider="local",
                instance_id="bench",
                state=WorkerState.READY.value,
            )
        )
    broker = redis.Redis.from_url(env_m["MURMUR_REDIS_URL"])
    murmur = gunicorn("app:create_app()", env_m, port_m)
    baseline = gunicorn("baseline_app:app", env_b, port_b)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    rates_m, rates_b = [], []
    try:
        for _ in range(ROUNDS):  # alternate so drift hits both alike
            broker.flushdb()
            rates_b.append(load(f"http://127.0.0.1:{port_b}/submit", headers))
            broker.flushdb()
            rates_m.append(load(f"http://127.0.0.1:{port_m}/v1/jobs", headers))
    finally:
        murmur.terminate()
        baseline.terminate()
        broker.flushdb()
    m, b = statistics.median(rates_m), statistics.median(rates_b)
    print(
        f"requests: {REQUESTS} x {ROUNDS} rounds, {CLIENT_THREADS} client threads, "
        "gunicorn 2 workers x 4 threads (gthread)"
    )
    print(f"baseline (bare delay()): {b:7.1f} req/s  rounds {[round(r, 1) for r in rates_b]}")
    print(f"murmur POST /v1/jobs:    {m:7.1f} req/s  rounds {[round(r, 1) for r in rates_m]}")
    print(f"ratio murmur/baseline: {m / b:.2f} (target >= 0.80)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
