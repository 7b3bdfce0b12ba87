"""Event streams: what 200 open streams cost one API process, and what streaming costs a worker.

Part 1 (API). The API runs under the production gunicorn command line (app/server.py) with ONE
process (8 general + api.sync_max_waiting + api.stream_max_open threads) on 127.0.0.1, SQLite
and Redis. /healthz and GET /v1/jobs/<id> are timed idle; then STREAMS event streams are opened
on JOBS queued jobs (GET /v1/jobs/<id>/events, each read by a client thread) while the jobs'
hot progress is written as workers write it (one report a second per job, each with a
segment), and the same requests are timed again. Prints p50/p99 of both phases, their ratio
(target <= 2), the events the streams received, the process's threads and RSS, and whether
every stream's lease was given back once the clients left.

Part 2 (worker). One loaded model (tiny.en int8, 2 threads) transcribes speech-90s with the
cancel checkpoint alone and with the progress reporter posting to that API (real HTTP, the
worker's own client, a worker row holding the job), runs alternating; prints the medians of
wall time and of the process's CPU time (every thread: the decoding's and the reporter's) and
their ratios (target: streaming costs <= 3 % of the processing time; the CPU ratio is the one
that other work on a shared 2-core machine does not drown).

    .venv/bin/python bench/streaming.py [--smoke]

Bounded: at most MEASURE requests per endpoint per phase, RUNS runs per path, DEADLINE seconds
for the streams to open; every socket is closed and gunicorn stopped.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import redis
import requests
from _stack import ROOT, TOKEN, bench_env, free_port, percentile, temp_dir

importlib.import_module("gpu_worker")  # first: pins the hub offline before faster-whisper

from app.config import load_settings  # noqa: E402
from app.jobs import progress  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.server import gunicorn_args  # noqa: E402

SMOKE = "--smoke" in sys.argv[1:]
STREAMS = 4 if SMOKE else 200
JOBS = 2 if SMOKE else 50
MEASURE = 20 if SMOKE else 400
RUNS = 1 if SMOKE else 5
DEADLINE = 60.0 if SMOKE else 180.0
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
AUDIO = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()
SPEECH = ROOT / "tests" / "fixtures" / ("speech-short.wav" if SMOKE else "speech-90s.wav")


def latencies(session: requests.Session, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        response = session.get(url, headers=HEADERS, timeout=30)
        out.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return out


class Reader(threading.Thread):
    """One client of an event stream on a raw socket: counts the events it reads until the
    bench shuts the socket (a requests stream cannot be closed from another thread at once)."""

    def __init__(self, port: int, path: str) -> None:
        super().__init__(daemon=True)
        self.events = 0
        self.opened = threading.Event()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        self.sock.sendall(head.encode())

    def run(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.events += chunk.count(b"\nevent: ")
                if self.events:
                    self.opened.set()
        except OSError:
            pass  # shut by the bench

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def report_progress(client: redis.Redis, jobs: list[str], stop: threading.Event) -> int:
    """Each job's hot progress as a worker writes it: a report a second with one segment."""
    seq = 0
    while not stop.is_set():
        seq += 1
        for job in jobs:
            segment = {"id": seq - 1, "start": seq - 1.0, "end": float(seq), "text": " words"}
            progress.report(
                client,
                job,
                attempt=1,
                seq=seq,
                done_seconds=float(seq),
                total_seconds=3600.0,
                segments=[segment],
            )
        stop.wait(1.0)
    return seq


def wait_answering(base: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(f"{base}/healthz", timeout=1).ok:
                return
        except requests.RequestException:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not start")


def api_part(base: str, env: dict[str, str], api: psutil.Process) -> tuple[list[str], bool]:
    session = requests.Session()
    jobs = [
        session.post(
            f"{base}/v1/jobs", headers=HEADERS, files={"file": ("a.wav", AUDIO)}, timeout=30
        ).json()["id"]
        for _ in range(JOBS)
    ]
    latencies(session, f"{base}/healthz", 5 if SMOKE else 50)  # warm the code paths
    idle = {
        "/healthz": latencies(session, f"{base}/healthz", MEASURE),
        "GET /v1/jobs/<id>": latencies(session, f"{base}/v1/jobs/{jobs[0]}", MEASURE),
    }
    threads_idle = api.num_threads()
    port = int(base.rsplit(":", 1)[1])
    readers = [Reader(port, f"/v1/jobs/{jobs[i % JOBS]}/events") for i in range(STREAMS)]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + DEADLINE
    for reader in readers:
        if not reader.opened.wait(max(0.1, deadline - time.monotonic())):
            raise RuntimeError("not every stream opened before the deadline")
    broker = redis.Redis.from_url(env["MURMUR_REDIS_URL"])
    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(broker, jobs, stop), daemon=True)
    reporter.start()
    time.sleep(1.0)
    before = sum(r.events for r in readers)
    started = time.monotonic()
    loaded = {
        "/healthz": latencies(session, f"{base}/healthz", MEASURE),
        "GET /v1/jobs/<id>": latencies(session, f"{base}/v1/jobs/{jobs[0]}", MEASURE),
    }
    window = time.monotonic() - started
    received = sum(r.events for r in readers) - before
    stop.set()
    reporter.join(10)
    rss = api.memory_info().rss / 2**20
    threads_loaded = api.num_threads()
    for reader in readers:
        reader.close()
    released = False
    for _ in range(100):  # the leases lapse once each stream sees its client gone
        if not sum(int(broker.zcard(k)) for k in broker.scan_iter("murmur:streams:*")):
            released = True
            break
        time.sleep(0.2)
    print(f"gunicorn: 1 process, {STREAMS} event streams over {JOBS} queued jobs")
    print(
        f"events received by the streams while measuring: {received} in {window:.1f} s "
        f"({received / window:.0f}/s); process threads {threads_idle} idle, {threads_loaded} "
        f"with the streams; RSS {rss:.0f} MiB"
    )
    worst = 0.0
    for name in idle:
        i50, i99 = percentile(idle[name], 50), percentile(idle[name], 99)
        l50, l99 = percentile(loaded[name], 50), percentile(loaded[name], 99)
        worst = max(worst, l99 / i99)
        print(
            f"{name:<18} idle p50 {i50:6.2f} ms p99 {i99:6.2f} ms | {STREAMS} streams p50 "
            f"{l50:6.2f} ms p99 {l99:6.2f} ms | p99 ratio {l99 / i99:.2f}"
        )
    print(f"worst p99 ratio {worst:.2f} (target <= 2.0); leases all released: {released}")
    return jobs, released


def worker_part(base: str, env: dict[str, str], job_id: str) -> float:
    from ingest import add_workers
    from sqlalchemy import update

    from app.db import Database
    from app.models import Job, JobStatus, utcnow
    from gpu_worker.audio import decode_bounded
    from gpu_worker.client import ControlPlaneClient
    from gpu_worker.manifest import load_manifest, verify_asset
    from gpu_worker.progress import ProgressWatch
    from gpu_worker.protocol.claim import DEFAULT_MAX_AUDIO_SECONDS
    from gpu_worker.transcriber import FasterWhisperTranscriber

    ((worker_id, instance_id, token),) = add_workers(env["MURMUR_DATABASE_URL"], 1)
    db = Database(env["MURMUR_DATABASE_URL"])
    with db.session() as s:  # the job is this worker's, as after its claim
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status=JobStatus.RUNNING.value, worker_id=worker_id, attempts=1)
            .values(started_at=utcnow())
        )
    db.dispose()
    from pydantic import SecretStr

    client = ControlPlaneClient(base, worker_id, instance_id, SecretStr(token))
    model = verify_asset(load_manifest().asset("tiny.en")).root
    transcriber = FasterWhisperTranscriber(model, compute_type="int8", cpu_threads=2, batch_size=8)
    samples = decode_bounded(str(SPEECH), DEFAULT_MAX_AUDIO_SECONDS)
    reports: list[int] = []

    def run(streaming: bool) -> tuple[float, float]:
        watch: Any = lambda: None  # noqa: E731 - the cancel check's place
        if streaming:
            watch = ProgressWatch(watch, client, job_id, samples.shape[0] / 16000)
        started, cpu = time.perf_counter(), time.process_time()
        transcriber.transcribe(samples, language="en", prompt=None, word_timestamps=True,
                               checkpoint=watch)  # fmt: skip
        if streaming:
            watch.flush(final=True)  # as the worker does before it posts the result
            reports.append(watch.sent)
        return time.perf_counter() - started, time.process_time() - cpu

    run(False), run(True)  # warm-up
    plain, streamed = [], []
    for _ in range(RUNS):
        plain.append(run(False))
        streamed.append(run(True))
    print(f"worker: {SPEECH.name}, tiny.en int8, 2 threads, batch 8, {RUNS} runs each")
    ratios = []
    for index, name in ((0, "wall"), (1, "CPU (all the process's threads)")):
        base = statistics.median(r[index] for r in plain)
        with_reports = statistics.median(r[index] for r in streamed)
        ratios.append(with_reports / base)
        print(
            f"  {name}: checkpoint only median {base:.3f} s, with progress "
            f"({reports[-1]} reports a run) {with_reports:.3f} s, ratio {ratios[-1]:.3f}"
        )
    print(f"  streaming cost: CPU ratio {ratios[1]:.3f}, wall {ratios[0]:.3f} (target <= 1.03)")
    return ratios[1]


def main() -> int:
    tmp = temp_dir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = bench_env(tmp, port)
    env.update(
        {
            "MURMUR_HOST": "127.0.0.1",
            "MURMUR_STREAMS_PER_TOKEN": str(STREAMS + 8),
            "MURMUR_STREAM_HEARTBEAT_SECONDS": "5",
        }
    )
    settings = load_settings(env=env)
    upgrade(settings.database_url)
    redis.Redis.from_url(env["MURMUR_REDIS_URL"]).flushdb()
    args = gunicorn_args(settings, workers=1, threads=8, access_log=False)
    log = (tmp / "api.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *args], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    try:
        wait_answering(base, proc, time.monotonic() + 60)
        (api,) = psutil.Process(proc.pid).children()
        jobs, released = api_part(base, env, api)
        worker_part(base, env, jobs[-1])
        return 0 if released else 1
    finally:
        proc.terminate()
        try:
            proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
