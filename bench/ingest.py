"""Usage-report ingestion and /metrics render time, through gunicorn, against baselines.

1. Reports accepted per second: client processes post valid reports (each a new sequence
   number) for WORKERS live workers to POST /internal/workers/<w>/<i>/report, each report on
   a new connection, as a fleet sends them: a worker reports every 30 s, and gunicorn closes
   an idle connection after 2 s. (`--keep-alive` reuses 8 connections instead; gunicorn's
   processes then split them unevenly, often all to one process, and the rate follows the
   split rather than the code. Each round prints the busiest process's share of the CPU.)
   Baseline, same gunicorn settings and clients: a bare Flask endpoint that stores the body
   in Redis. Murmur's path: the credential check and a six-column read of the worker, strict
   validation, and one Redis script that orders the report, stores the snapshot and records
   its arrival (the heartbeat; no database write). Target: >= 2,000 reports/s.
2. /metrics with 1,000 live workers that all reported (and JOBS rows in the jobs table):
   scrape latency over HTTP through gunicorn, and the render in-process. Baseline:
   prometheus_client's generate_latest on the same collector. Target: <= 100 ms.

Run: .venv/bin/python bench/ingest.py [--database-url URL] [--jobs N] [--smoke]
Redis: MURMUR_BENCH_REDIS_URL (default redis://127.0.0.1:6379/10, flushed: keep it private).
The clients share the machine's cores with gunicorn; the figures say so.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis as redis_lib
from _stack import ROOT, bench_env, free_port, gunicorn, percentile, temp_dir

# `--smoke` (CI, tests/test_benches.py): the same path at a few dozen reports, no verdict on
# speed. Also in the environment, so the client processes size themselves alike.
SMOKE = "--smoke" in sys.argv[1:] or os.environ.get("MURMUR_BENCH_SMOKE") == "1"
WORKERS = 20 if SMOKE else 200
CLIENT_PROCESSES = 2
THREADS_PER_CLIENT = 4
REPORTS_PER_THREAD = 10 if SMOKE else 600
ROUNDS = 1 if SMOKE else 3
GUNICORN_WORKERS, GUNICORN_THREADS = 2, 4
SCRAPE_WORKERS = 40 if SMOKE else 1000
SCRAPES = 3 if SMOKE else 30
SCRAPE_TOKEN = "bench-scrape-token-" + "s" * 32
REDIS_URL = os.environ.get("MURMUR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")


# --- the apps gunicorn serves (imported by gunicorn from this file) ---------------------------


def observability_app() -> Any:
    """Murmur's app as `murmur api` serves it."""
    from app import create_app

    return create_app()


def baseline_app() -> Any:
    """The floor: accept the POST and keep the body in Redis, nothing else."""
    from flask import Flask, jsonify, request

    client = redis_lib.Redis.from_url(os.environ["MURMUR_REDIS_URL"])
    app = Flask("baseline")

    @app.post("/internal/workers/<worker_id>/<instance_id>/report")
    def report(worker_id: str, instance_id: str) -> Any:
        client.set(f"baseline:{worker_id}", request.get_data(), px=90_000)
        return jsonify({"accepted": True})

    @app.get("/healthz")
    def healthz() -> Any:
        return jsonify({"status": "ok"})

    return app


# --- set-up ----------------------------------------------------------------------------------


def report_body(sequence: int, seed: int = 0) -> bytes:
    """A valid report; `seed` varies the readings, as a fleet's workers would differ."""
    reading = lambda v: {"value": v, "reason": None}  # noqa: E731
    return json.dumps(
        {
            "version": 1,
            "process_started_at": 1_764_000_000.5,
            "sequence": sequence,
            "state": "busy",
            "uptime_seconds": 1200.0,
            "model_load_seconds": 3.2 + (seed % 50) / 10,
            "transcriptions": {"succeeded": 40 + seed, "failed": seed % 3},
            "processing_seconds": 600.0 + seed * 1.7,
            "audio_seconds": 7200.0 + seed * 13.3,
            "host": {
                "cpu_utilization_ratio": reading((seed % 97) / 97),
                "memory_used_bytes": reading(6.0e9 + seed * 4096.0),
                "memory_total_bytes": reading(3.2e10),
            },
            "gpu": {
                "devices": [
                    {
                        "index": 0,
                        "utilization_ratio": reading((seed % 89) / 89),
                        "memory_used_bytes": reading(1.2e10 + seed * 1_048_576.0),
                        "memory_total_bytes": reading(2.4e10),
                        "temperature_celsius": reading(40.0 + seed % 45),
                        "power_watts": reading(61.5 + seed * 0.37),
                    }
                ],
                "reason": None,
            },
            "log": [
                {"number": sequence * 2 - 1, "text": "INFO gpu_worker.jobs: job job_1: 9.1 s"},
                {"number": sequence * 2, "text": "INFO celery: Task succeeded in 9.2s"},
            ],
        },
        separators=(",", ":"),
    ).encode()


def write_config(tmp: Path, interval: float) -> Path:
    path = tmp / f"murmur-{interval}.toml"
    path.write_text(
        f"[observability]\nenabled = true\nreport_interval_seconds = {interval}\n\n"
        '[[profiles]]\nname = "local-cpu"\nprovider = "local"\nzone = "local"\n'
        'server_type = "local-cpu"\n'
    )
    return path


def add_workers(database_url: str, count: int) -> list[tuple[str, str, str]]:
    """`count` READY workers; (worker id, instance id, credential) for each."""
    from app.credentials import InstanceCredential
    from app.db import Database
    from app.models import Worker, WorkerState, utcnow

    key = bench_env(Path("."), 0)["MURMUR_SIGNING_KEY"]
    db = Database(database_url)
    rows = []
    with db.session() as s:
        for i in range(count):
            now = utcnow()
            worker = Worker(
                profile="local-cpu",
                provider="local",
                instance_id=f"bench-{i:05d}",
                state=WorkerState.READY.value,
                requested_at=now,
                created_at=now,
                booted_at=now,
                ready_at=now,
            )
            s.add(worker)
            rows.append(worker)
    db.dispose()
    return [
        (w.id, w.instance_id or "", InstanceCredential.derive(key, w.id, w.instance_id or "").token)
        for w in rows
    ]


def add_jobs(database_url: str, count: int) -> None:
    from app.db import Database
    from app.models import Job, utcnow

    db = Database(database_url)
    statuses = ["succeeded"] * 8 + ["failed", "queued"]
    with db.session() as s:
        s.add_all(
            Job(
                status=statuses[i % len(statuses)],
                profile="local-cpu",
                owner="o" * 64,
                source="upload",
                created_at=utcnow(),
            )
            for i in range(count)
        )
    db.dispose()


# --- load ------------------------------------------------------------------------------------


def _requests(port: int, mine: list[tuple[str, str, str]], first_sequence: int) -> list[bytes]:
    """REPORTS_PER_THREAD complete HTTP/1.1 requests, encoded before the clock starts."""
    out = []
    sequence = first_sequence
    for n in range(REPORTS_PER_THREAD):
        worker_id, instance_id, token = mine[n % len(mine)]
        if n % len(mine) == 0:
            sequence += 1
        body = report_body(sequence)
        head = (
            f"POST /internal/workers/{worker_id}/{instance_id}/report HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


def _exchange(sock: socket.socket, requests: list[bytes], tally: dict[int, int]) -> None:
    """Send each request on one connection and read its response (Content-Length)."""
    buffer = b""
    for request in requests:
        sock.sendall(request)
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = buffer[:end].lower()
                length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                if len(buffer) >= end + 4 + length:
                    status = int(head[9:12])
                    tally[status] = tally.get(status, 0) + 1
                    buffer = buffer[end + 4 + length :]
                    break
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed a keep-alive connection")
            buffer += chunk


def _client_process(
    port: int,
    workers: list[tuple[str, str, str]],
    first_sequence: int,
    start: Any,
    out: Any,
    keep_alive: bool,
) -> None:
    """THREADS_PER_CLIENT threads, each reporting for its share of workers, one at a time.

    Requests are encoded up front and sent over raw sockets: the clients share the cores
    with gunicorn, and an HTTP library's per-request work would be measured as the server's.
    """
    share = [workers[i::THREADS_PER_CLIENT] for i in range(THREADS_PER_CLIENT)]
    counts: list[dict[int, int]] = [{} for _ in share]
    prepared = [_requests(port, mine, first_sequence) for mine in share]

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.connect(("127.0.0.1", port))
        return sock

    def run(index: int) -> None:
        if keep_alive:
            with connect() as sock:
                start.wait()
                _exchange(sock, prepared[index], counts[index])
            return
        start.wait()
        for request in prepared[index]:
            with connect() as sock:
                _exchange(sock, [request], counts[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS_PER_CLIENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total: dict[int, int] = {}
    for tally in counts:
        for status, n in tally.items():
            total[status] = total.get(status, 0) + n
    out.put(total)


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _redis_server() -> list[psutil.Process]:
    """The local redis-server, when there is one, so its share of the CPU can be shown."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"]


@dataclass
class Round:
    rate: float  # accepted reports per second
    server_us: float  # gunicorn CPU (all processes) per report, microseconds
    redis_us: float
    busiest: float  # the busiest gunicorn worker process's share of gunicorn's CPU


def load(
    port: int,
    server: subprocess.Popen[bytes],
    workers: list[tuple[str, str, str]],
    first: int,
    keep_alive: bool = False,
) -> Round:
    """Accepted (200) reports per second from all client processes, and CPU per report."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    shares = [workers[i::CLIENT_PROCESSES] for i in range(CLIENT_PROCESSES)]
    procs = [
        ctx.Process(target=_client_process, args=(port, share, first, start, out, keep_alive))
        for share in shares
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # requests encoded, connections made, threads waiting
    children = psutil.Process(server.pid).children()
    gunicorn_procs = [psutil.Process(server.pid), *children]
    redis_procs = _redis_server()
    per_child = [_cpu_seconds([child]) for child in children]
    cpu_before = _cpu_seconds(gunicorn_procs), _cpu_seconds(redis_procs)
    started = time.perf_counter()
    start.set()
    totals: dict[int, int] = {}
    for _ in procs:
        for status, n in out.get(timeout=600).items():
            totals[status] = totals.get(status, 0) + n
    elapsed = time.perf_counter() - started
    cpu_after = _cpu_seconds(gunicorn_procs), _cpu_seconds(redis_procs)
    per_child = [
        _cpu_seconds([child]) - before for child, before in zip(children, per_child, strict=True)
    ]
    for p in procs:
        p.join()
    expected = CLIENT_PROCESSES * THREADS_PER_CLIENT * REPORTS_PER_THREAD
    if totals.get(200, 0) != expected:
        raise RuntimeError(f"not every report was accepted: {totals}")
    return Round(
        rate=expected / elapsed,
        server_us=(cpu_after[0] - cpu_before[0]) / expected * 1e6,
        redis_us=(cpu_after[1] - cpu_before[1]) / expected * 1e6,
        busiest=max(per_child) / max(sum(per_child), 1e-9),
    )


def scrape_times(port: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    for _ in range(SCRAPES + 1):
        started = time.perf_counter()
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
        response = conn.getresponse()
        body = response.read()
        times.append(time.perf_counter() - started)
        if response.status != 200 or b"murmur_gpu_power_watts" not in body:
            raise RuntimeError(f"bad scrape: {response.status}")
    conn.close()
    return times[1:]  # the first warms the process's connections


def in_process_render(env: dict[str, str]) -> tuple[list[float], list[float], int]:
    from prometheus_client import CollectorRegistry, generate_latest

    from app.config import load_settings
    from app.db import Database
    from app.observability.collector import MurmurCollector, render_metrics

    settings = load_settings(env=env)
    db = Database(settings.database_url)
    client = redis_lib.Redis.from_url(settings.redis_url)
    ours, library = [], []
    size = 0
    for _ in range(SCRAPES):
        started = time.perf_counter()
        size = len(render_metrics(settings, db, client))
        ours.append(time.perf_counter() - started)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(MurmurCollector(settings, db, client))
        started = time.perf_counter()
        generate_latest(registry)
        library.append(time.perf_counter() - started)
    db.dispose()
    return ours, library, size


def print_ingest(database_url: str, rounds: dict[str, list[Round]], keep_alive: bool) -> None:
    requests_per_round = CLIENT_PROCESSES * THREADS_PER_CLIENT * REPORTS_PER_THREAD
    connections = "keep-alive connections" if keep_alive else "threads, a connection per report"
    print(
        f"machine: {os.cpu_count()} cores shared by gunicorn ({GUNICORN_WORKERS} workers x "
        f"{GUNICORN_THREADS} threads, gthread), Redis, and {CLIENT_PROCESSES} client processes "
        f"x {THREADS_PER_CLIENT} {connections}; load average now {os.getloadavg()[0]:.2f}"
    )
    # The interpreter's build moves every figure: a CPython built without PGO/LTO (pyenv's
    # default) runs this code markedly slower than the python:3.11-slim image the API ships in.
    print(f"python: {platform.python_version()} at {sys.executable}")
    print(
        f"database: {database_url.split(':', 1)[0]}, {WORKERS} reporting workers, "
        f"{requests_per_round} reports x {len(rounds['steady'])} rounds"
    )
    rate = {name: statistics.median(r.rate for r in rs) for name, rs in rounds.items()}
    for label, name in (
        ("baseline (body -> Redis SET)", "baseline"),
        ("murmur POST .../report", "steady"),
    ):
        rs = rounds[name]
        server = statistics.median(r.server_us for r in rs)
        redis_cpu = statistics.median(r.redis_us for r in rs)
        busiest = max(r.busiest for r in rs)
        print(
            f"{label:30} {rate[name]:6.0f} reports/s  rounds {[round(r.rate) for r in rs]}; "
            f"CPU per report: gunicorn {server:4.0f} us, redis-server {redis_cpu:3.0f} us; "
            f"busiest process {busiest:.0%}"
        )
    print(f"ratio murmur/baseline: {rate['steady'] / rate['baseline']:.2f}")
    print(f"target >= 2000 reports/s: {'met' if rate['steady'] >= 2000 else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    parser.add_argument("--jobs", type=int, default=10_000, help="rows in the jobs table")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="ingestion rounds per app")
    parser.add_argument("--skip-metrics", action="store_true", help="ingestion only")
    parser.add_argument("--smoke", action="store_true", help="a few reports and scrapes (CI)")
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="reuse one connection per client thread instead of one per report",
    )
    args = parser.parse_args()
    if args.smoke:
        os.environ["MURMUR_BENCH_SMOKE"] = "1"
        args.jobs = min(args.jobs, 200)
    sys.path.insert(0, str(ROOT))
    from app.migrate import upgrade

    tmp = temp_dir()
    database_url = args.database_url or f"sqlite:///{tmp}/bench.db"
    upgrade(database_url)
    broker = redis_lib.Redis.from_url(REDIS_URL)
    broker.flushdb()

    def env_for(port: int, interval: float) -> dict[str, str]:
        return {
            **bench_env(tmp, port),
            "MURMUR_DATABASE_URL": database_url,
            "MURMUR_REDIS_URL": REDIS_URL,
            "MURMUR_CONFIG": str(write_config(tmp, interval)),
            "MURMUR_SCRAPE_TOKEN": SCRAPE_TOKEN,
            "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{ROOT}",
        }

    workers = add_workers(database_url, WORKERS)
    ports = {name: free_port() for name in ("baseline", "steady")}
    servers = {
        "baseline": gunicorn(
            "ingest:baseline_app()",
            env_for(ports["baseline"], 30.0),
            ports["baseline"],
            GUNICORN_WORKERS,
            GUNICORN_THREADS,
        ),
        "steady": gunicorn(
            "ingest:observability_app()",
            env_for(ports["steady"], 30.0),
            ports["steady"],
            GUNICORN_WORKERS,
            GUNICORN_THREADS,
        ),
    }
    rounds: dict[str, list[Round]] = {name: [] for name in servers}
    http_times: list[float] = []
    try:
        sequence = 0
        for _ in range(args.rounds):  # alternate, so load from elsewhere hits all alike
            for name in ("baseline", "steady"):
                rounds[name].append(
                    load(ports[name], servers[name], workers, sequence, args.keep_alive)
                )
                # Every round uses new sequence numbers: no report is a stale repeat.
                sequence += REPORTS_PER_THREAD * THREADS_PER_CLIENT * CLIENT_PROCESSES
        print_ingest(database_url, rounds, args.keep_alive)
        if args.skip_metrics:
            return 0
        # /metrics: 1,000 live workers that all reported, and a jobs table.
        scrape_workers = workers + add_workers(database_url, SCRAPE_WORKERS - WORKERS)
        add_jobs(database_url, args.jobs)
        from app.observability.store import store_report
        from gpu_worker.protocol.usage import UsageReport

        for seed, (worker_id, _, _) in enumerate(scrape_workers):
            report = UsageReport.model_validate_json(report_body(1, seed))
            store_report(
                broker, worker_id, report, [], received_at=time.time(), interval_seconds=3600
            )
        http_times = scrape_times(ports["steady"])
        render, library, size = in_process_render(env_for(ports["steady"], 30.0))
    finally:
        for server in servers.values():
            server.terminate()
        for server in servers.values():
            server.wait(30)
        broker.flushdb()

    def ms(values: list[float]) -> str:
        return (
            f"median {statistics.median(values) * 1000:6.1f} ms, "
            f"p95 {percentile(values, 95) * 1000:6.1f} ms, min {min(values) * 1000:6.1f} ms"
        )

    print(f"/metrics with {SCRAPE_WORKERS} live workers, {args.jobs} jobs, {size} bytes:")
    print(f"  over HTTP (gunicorn):         {ms(http_times)}")
    print(f"  in process, our encoder:      {ms(render)}")
    print(f"  in process, generate_latest:  {ms(library)}")
    met = "met" if statistics.median(http_times) <= 0.1 else "NOT met"
    ratio = statistics.median(render) / statistics.median(library)
    print(f"  ratio ours/library: {ratio:.2f}; target <= 100 ms over HTTP: {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
