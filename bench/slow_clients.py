"""/healthz while more slow connections than the API has threads hold it, vs idle.

The API runs under the production gunicorn command line (app/server.py: 2 processes, 8
general + api.sync_max_waiting = 32 threads each, 80 threads in all) on 127.0.0.1. The
client measures /healthz idle, then opens SLOW_HEADS connections that send a request head one
byte a second and SLOW_BODIES that send a POST head and then its body one byte a second (160
connections for 80 threads), and measures how long the first /healthz waits, the /healthz
latencies while the slow connections are still open, and how the slow connections end (408
from the server's read deadline). Bounded: MEASURE requests per phase, DEADLINE seconds in
all; closes every socket and stops gunicorn.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time

import requests
from _stack import ROOT, TOKEN, bench_env, free_port, percentile, temp_dir

from app.config import load_settings
from app.migrate import upgrade
from app.server import gunicorn_args

# `--smoke` (CI, tests/test_benches.py): the same path, a few connections, no verdict on speed.
SMOKE = "--smoke" in sys.argv[1:]
SLOW_HEADS = 4 if SMOKE else 80
SLOW_BODIES = 4 if SMOKE else 80
MEASURE = 10 if SMOKE else 200
DEADLINE = 30.0 if SMOKE else 120.0
HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n"


def latencies(session: requests.Session, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        response = session.get(url, timeout=60)
        out.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}")
    return out


def trickle(sock: socket.socket, data: bytes, stop: threading.Event, ends: list[bytes]) -> None:
    """Send `data` one byte a second until the server answers or closes, or `stop` is set."""
    sock.settimeout(1.0)
    for byte in data:
        if stop.is_set():
            return
        try:
            sock.sendall(bytes([byte]))
            answer = sock.recv(4096)
        except TimeoutError:
            continue  # nothing answered within the second: send the next byte
        except OSError:
            ends.append(b"reset")
            return
        ends.append(answer.split(b"\r\n", 1)[0] if answer else b"closed")
        return


def main() -> int:
    tmp = temp_dir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = bench_env(tmp, port)
    env["MURMUR_HOST"] = "127.0.0.1"
    settings = load_settings(env=env)
    upgrade(settings.database_url)
    args = gunicorn_args(settings, workers=2, threads=8)
    log = (tmp / "api.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *args], env=env, cwd=ROOT, stdout=log, stderr=log
    )
    deadline = time.monotonic() + DEADLINE
    stop = threading.Event()
    socks: list[socket.socket] = []
    threads: list[threading.Thread] = []
    ends: list[bytes] = []
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
        latencies(session, f"{base}/healthz", 5 if SMOKE else 50)  # warm both processes' code paths
        idle = latencies(session, f"{base}/healthz", MEASURE)
        session.close()
        body_head = (
            "POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n"
        ).encode()
        for i in range(SLOW_HEADS + SLOW_BODIES):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i >= SLOW_HEADS:
                sock.sendall(body_head)
                data = b'{"url": "' + b"a" * 990 + b'"}'
            else:
                data = HEAD
            socks.append(sock)
            thread = threading.Thread(target=trickle, args=(sock, data, stop, ends), daemon=True)
            thread.start()
            threads.append(thread)
        time.sleep(1.0)  # every slow connection has sent its first bytes
        started = time.perf_counter()
        first = requests.get(f"{base}/healthz", timeout=60)
        first_wait = time.perf_counter() - started
        assert first.status_code == 200
        with requests.Session() as loaded_session:
            loaded = latencies(loaded_session, f"{base}/healthz", MEASURE)
        open_during = SLOW_HEADS + SLOW_BODIES - len(ends)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        statuses: dict[str, int] = {}
        for end in ends:
            key = end.decode("latin-1")
            statuses[key] = statuses.get(key, 0) + 1
        print(
            f"gunicorn: 2 workers x (8 + {settings.api.sync_max_waiting}) threads; "
            f"{SLOW_HEADS} slow heads + {SLOW_BODIES} slow bodies at 1 byte/s"
        )
        print(f"first /healthz answered after {first_wait:.2f} s")
        print(f"slow connections still open after the loaded measurement: {open_during}")
        print(f"how the slow connections ended: {statuses}")
        i50, i99 = percentile(idle, 50), percentile(idle, 99)
        l50, l99 = percentile(loaded, 50), percentile(loaded, 99)
        print(
            f"/healthz idle p50 {i50:6.2f} ms p99 {i99:6.2f} ms | after the first answer "
            f"p50 {l50:6.2f} ms p99 {l99:6.2f} ms | p99 ratio {l99 / i99:.2f}"
        )
        return 0
    finally:
        stop.set()
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
