"""/healthz and GET /v1/jobs/<id> latency while 64 synchronous transcriptions wait, vs idle.

The API runs under the production gunicorn command line (app/server.py: 2 processes, 8
general threads and api.sync_max_waiting = 32 waiting threads each) on 127.0.0.1, with no
worker, so the jobs never finish. The same client measures both endpoints idle, then opens 64
synchronous requests on raw sockets (re-sending any that is answered 503 while the two
processes' slots fill unevenly), checks they all wait, and measures again. Prints p50/p99 of
each phase and the loaded/idle p99 ratio (target <= 2). Bounded: at most MEASURE requests per
endpoint per phase and DEADLINE seconds in all; closes every socket and stops gunicorn.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import requests
from _stack import ROOT, TOKEN, bench_env, free_port, percentile, temp_dir

from app.config import load_settings
from app.migrate import upgrade
from app.server import gunicorn_args

# `--smoke` (CI, tests/test_benches.py): the same path, a few connections, no verdict on speed.
SMOKE = "--smoke" in sys.argv[1:]
WAITERS = 4 if SMOKE else 64
MEASURE = 10 if SMOKE else 400
DEADLINE = 60.0 if SMOKE else 180.0
AUDIO = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def sync_request_bytes(url: str) -> bytes:
    prepared = requests.Request(
        "POST",
        f"{url}/v1/audio/transcriptions",
        headers=HEADERS,
        files={"file": ("speech.wav", AUDIO)},
        data={"model": "whisper-1"},
    ).prepare()
    head = f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: {url.removeprefix('http://')}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in prepared.headers.items())
    assert isinstance(prepared.body, bytes)
    return head.encode() + b"\r\n" + prepared.body


def answered(sock: socket.socket) -> bytes:
    """What the server has answered on this socket so far (b"" while it waits)."""
    sock.setblocking(False)
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


def latencies(session: requests.Session, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        response = session.get(url, headers=HEADERS, timeout=30)
        out.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return out


def measure(session: requests.Session, base: str, job_id: str) -> dict[str, list[float]]:
    return {
        "/healthz": latencies(session, f"{base}/healthz", MEASURE),
        "GET /v1/jobs/<id>": latencies(session, f"{base}/v1/jobs/{job_id}", MEASURE),
    }


def open_waiters(base: str, deadline: float) -> tuple[list[socket.socket], int]:
    """WAITERS sockets whose synchronous request waits; (sockets, 503 answers re-sent)."""
    payload = sync_request_bytes(base)
    port = int(base.rsplit(":", 1)[1])
    socks: list[socket.socket] = []
    refused = 0
    while len(socks) < WAITERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(socks)} of {WAITERS} requests wait after the deadline")
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(payload)
        socks.append(sock)
        if len(socks) < WAITERS:
            continue
        time.sleep(2.0)  # let each request reach its wait (or its refusal)
        still = []
        for s in socks:
            answer = answered(s)
            if answer:
                if b" 503 " not in answer.split(b"\r\n", 1)[0]:
                    raise RuntimeError(f"unexpected answer: {answer[:200]!r}")
                refused += 1
                s.close()
            else:
                still.append(s)
        socks = still
    return socks, refused


def main() -> int:
    tmp = temp_dir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = bench_env(tmp, port)
    env.update({"MURMUR_HOST": "127.0.0.1", "MURMUR_SYNC_TIMEOUT_SECONDS": "300"})
    settings = load_settings(env=env)
    upgrade(settings.database_url)
    args = gunicorn_args(settings, workers=2, threads=8)
    log = (tmp / "api.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *args], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    deadline = time.monotonic() + DEADLINE
    socks: list[socket.socket] = []
    try:
        session = requests.Session()
        while True:
            try:
                if session.get(f"{base}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.2)
        job = session.post(
            f"{base}/v1/jobs", headers=HEADERS, files={"file": ("a.wav", AUDIO)}, timeout=30
        ).json()
        latencies(session, f"{base}/healthz", 5 if SMOKE else 50)  # warm both processes' code paths
        idle = measure(session, base, job["id"])
        socks, refused = open_waiters(base, deadline)
        page = session.get(f"{base}/v1/jobs?limit=100", headers=HEADERS, timeout=30).json()
        queued = sum(1 for j in page["data"] if j["status"] == "queued")
        loaded = measure(session, base, job["id"])
        still_waiting = sum(1 for s in socks if not answered(s))
        threads = settings.api.sync_max_waiting
        print(f"gunicorn: 2 workers x (8 + {threads}) threads, {WAITERS} synchronous requests")
        print(
            f"waiting during the measurement: {still_waiting} "
            f"({refused} answered 503 while the slots filled and were re-sent); "
            f"{queued} jobs queued"
        )
        worst = 0.0
        for name in idle:
            i50, i99 = percentile(idle[name], 50), percentile(idle[name], 99)
            l50, l99 = percentile(loaded[name], 50), percentile(loaded[name], 99)
            ratio = l99 / i99
            worst = max(worst, ratio)
            print(
                f"{name:<18} idle p50 {i50:6.2f} ms p99 {i99:6.2f} ms | "
                f"{WAITERS} waiting p50 {l50:6.2f} ms p99 {l99:6.2f} ms | p99 ratio {ratio:.2f}"
            )
        print(f"worst p99 ratio {worst:.2f} (target <= 2.0)")
        return 0 if still_waiting == WAITERS else 1
    finally:
        for s in socks:
            s.close()
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
