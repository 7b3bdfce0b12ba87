"""Shared set-up for the API benchmarks: a throw-away database, gunicorn, a live worker row."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token-" + "a" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_env(tmp: Path, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "MURMUR_DATABASE_URL": os.environ.get(
            "MURMUR_BENCH_DATABASE_URL", f"sqlite:///{tmp}/bench.db"
        ),
        "MURMUR_REDIS_URL": os.environ.get("MURMUR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"),
        "MURMUR_STORAGE_PATH": str(tmp / "audio"),
        "MURMUR_API_TOKEN": TOKEN,
        "MURMUR_SIGNING_KEY": "bench-signing-key-" + "b" * 32,
        "MURMUR_PORT": str(port),
        "MURMUR_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }


def gunicorn(
    app: str,
    env: dict[str, str],
    port: int,
    workers: int = 2,
    threads: int = 4,
    log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Serve `app`; its output goes to `log` when given (else to this process's)."""
    out = log.open("ab") if log is not None else None
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            app,
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "gthread",
            "--threads",
            str(threads),
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT if out is not None else None,
    )
    return answering(proc, port, f"gunicorn {app}")


def answering(proc: subprocess.Popen[bytes], port: int, what: str) -> subprocess.Popen[bytes]:
    """`proc` once /healthz answers on `port` (30 s at most; killed and refused after)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not start")


def temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="murmur-bench-"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
