"""Warm end-to-end overhead: submit -> transcript available, minus the worker's own transcription.

Run: .venv/bin/python bench/e2e_overhead.py [--smoke]

Runs the API under gunicorn and one real worker process (warm: model loaded, a first job done),
then sends speech-short.wav N times through the synchronous endpoint, which answers as soon as
the transcript is stored. Overhead = client wall time - the job's `processing_seconds` (the
worker's decode + transcription time). Prints p50/p99 against the targets (50 ms / 200 ms) and,
as the floor under it, a bare Celery round trip measured in the same run.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import redis
import requests
from _stack import ROOT, TOKEN, bench_env, free_port, gunicorn, percentile, temp_dir

# `--smoke` (CI, tests/test_benches.py): the same path, a few iterations, no verdict on speed.
SMOKE = "--smoke" in sys.argv[1:]
RUNS = 3 if SMOKE else 40


def celery_round_trip_ms(broker_url: str, n: int = 200) -> float:
    """Median ms of LPUSH + BRPOP through Redis: the transport floor of one dispatch."""
    r = redis.Redis.from_url(broker_url)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        r.lpush("bench.floor", b"x" * 1200)
        r.brpop(["bench.floor"], timeout=1)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from app.config import load_settings
    from app.db import Database
    from app.fleet.cloudinit import worker_environment
    from app.migrate import upgrade
    from app.models import Worker, WorkerState

    tmp = temp_dir()
    port = free_port()
    env = bench_env(tmp, port)
    redis.Redis.from_url(env["MURMUR_REDIS_URL"]).flushdb()
    upgrade(env["MURMUR_DATABASE_URL"])
    settings = load_settings(env=env)
    db = Database(settings.database_url)
    worker = Worker(
        profile="local-cpu",
        provider="local",
        instance_id="bench-instance",
        state=WorkerState.BOOTING.value,
    )
    with db.session() as s:
        s.add(worker)
    api = gunicorn("app:create_app()", env, port, workers=2, threads=8)
    worker_env = {
        **env,
        **worker_environment(settings, settings.profile("local-cpu"), worker.id, "bench-instance"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_worker", "run"],
        env=worker_env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    audio = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()
    overheads, walls = [], []
    try:
        deadline = time.monotonic() + 120
        while True:
            with db.session() as s:
                row = s.get(Worker, worker.id)
                if row is not None and row.state == WorkerState.READY.value:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the worker did not become ready")
            time.sleep(0.2)
        session = requests.Session()
        for i in range(RUNS + 2):
            start = time.perf_counter()
            response = session.post(
                f"{url}/v1/audio/transcriptions",
                headers=headers,
                files={"file": ("a.wav", audio)},
                data={"model": "whisper-1"},
                timeout=60,
            )
            wall = time.perf_counter() - start
            response.raise_for_status()
            job = session.get(
                f"{url}/v1/jobs/{response.headers['X-Murmur-Job-Id']}", headers=headers, timeout=10
            ).json()
            if i < 2:
                continue  # warm-up: first claims, connection pools
            walls.append(wall * 1000)
            overheads.append((wall - job["processing_seconds"]) * 1000)
        floor = celery_round_trip_ms(env["MURMUR_REDIS_URL"], 20 if SMOKE else 200)
    finally:
        proc.terminate()
        proc.wait(30)
        api.terminate()
    print(f"runs: {RUNS} sequential sync transcriptions of speech-short.wav (6.6 s), warm worker")
    print(f"wall      p50 {percentile(walls, 50):7.1f} ms   p99 {percentile(walls, 99):7.1f} ms")
    print(
        f"overhead  p50 {percentile(overheads, 50):7.1f} ms   p99 "
        f"{percentile(overheads, 99):7.1f} ms   (targets 50 / 200 ms)"
    )
    print(
        f"floor: one Redis push+pop {floor:.2f} ms; overhead/floor ratio "
        f"{percentile(overheads, 50) / floor:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
