"""Reliability drill: a local stack on 127.0.0.1, hostile inputs and faults, one table of outcomes.

    .venv/bin/python bench/reliability_drill.py [--postgres] [--keep] [--smoke]

Starts its own Redis (a throw-away `redis-server` on a free port, so it can be restarted), the
API under gunicorn, a control worker with beat (reconcile), an I/O worker (retention), and
lets the reconcile start a real CPU worker through the `local` provider. It then sends, in
order: good uploads, each hostile input a few times, and two faults (SIGKILL the GPU worker
mid-job; stop Redis, which loses its data, and start it again while clients keep
submitting). Clients behave like real ones: every submission carries an Idempotency-Key
and is retried (at most 3 times) on a connection error or a 5xx.

One row per input or fault:
- submitted: logical submissions (retries not counted); 202: accepted (last answer);
- 4xx JSON: refused with {"error": {"code", "message"}}; other 4xx: refused in any other shape;
- 5xx: 5xx answers seen, retries included;
- succeeded / failed: accepted jobs that ended so before the row's deadline;
- lost: accepted jobs still not ended at the deadline (or missing);
- duplicated: job rows beyond one per logical submission;
- files left: audio files (stored or staged) that no job row names, added by this row.

The database is a SQLite file in a temporary directory, or with --postgres a throw-away
database on MURMUR_BENCH_POSTGRES_URL's server (default postgresql://postgres@127.0.0.1:5432/
postgres). The API's, control worker's and GPU worker's output go to that directory, which
is removed at the end unless --keep is given.

Every loop is bounded in count and time. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from _stack import ROOT, TOKEN, answering, bench_env, free_port, temp_dir

from app.config import load_settings
from app.db import Database
from app.migrate import upgrade
from app.server import gunicorn_args

FIXTURES = ROOT / "tests" / "fixtures"
SPEECH = (FIXTURES / "speech-short.wav").read_bytes()
SPEECH_90S = (FIXTURES / "speech-90s.wav").read_bytes()
SILENCE = (FIXTURES / "silence-5s.wav").read_bytes()
MAX_UPLOAD = 8 * 1024 * 1024
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
ENDED = ("succeeded", "failed", "cancelled")
HOSTILE_REPEATS = 3
JOB_DEADLINE = 300.0  # seconds a row waits for its accepted jobs to end


# -- inputs ------------------------------------------------------------------------------------


def _lying_wav() -> bytes:
    """A WAV whose header says 10 hours of 16 kHz audio and which holds one second."""
    with wave.open(str(FIXTURES / "speech-short.wav")) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(rate)
    claimed = rate * width * channels * 36000
    header = (
        b"RIFF"
        + (36 + claimed).to_bytes(4, "little")
        + b"WAVEfmt "
        + (16).to_bytes(4, "little")
        + (1).to_bytes(2, "little")
        + channels.to_bytes(2, "little")
        + rate.to_bytes(4, "little")
        + (rate * width * channels).to_bytes(4, "little")
        + (width * channels).to_bytes(2, "little")
        + (8 * width).to_bytes(2, "little")
        + b"data"
        + claimed.to_bytes(4, "little")
    )
    return header + frames


Request = Callable[[str, str], requests.Response]  # (base url, idempotency key) -> response


def upload(
    data: bytes,
    name: str = "a.wav",
    fields: dict[str, str] | None = None,
    content_type: str = "application/octet-stream",
) -> Request:
    def send(url: str, key: str) -> requests.Response:
        return requests.post(
            f"{url}/v1/jobs",
            headers={**HEADERS, "Idempotency-Key": key},
            files={"file": (name, data, content_type)},
            data=fields or {},
            timeout=60,
        )

    return send


def repeated_parts(files: list[tuple[str, bytes]], fields: list[tuple[str, str]]) -> Request:
    """An upload whose form repeats a part: several `file` parts, or one text field many times."""

    def send(url: str, key: str) -> requests.Response:
        return requests.post(
            f"{url}/v1/jobs",
            headers={**HEADERS, "Idempotency-Key": key},
            files=[("file", (name, data, "application/octet-stream")) for name, data in files],
            data=fields,
            timeout=60,
        )

    return send


def raw_json(body: bytes) -> Request:
    def send(url: str, key: str) -> requests.Response:
        return requests.post(
            f"{url}/v1/jobs",
            headers={**HEADERS, "Idempotency-Key": key, "Content-Type": "application/json"},
            data=body,
            timeout=60,
        )

    return send


def get(path: str, **headers: str) -> Request:
    def send(url: str, key: str) -> requests.Response:
        return requests.get(f"{url}{path}", headers={**HEADERS, **headers}, timeout=30)

    return send


def reused_key() -> Request:
    """The second of two different uploads under one Idempotency-Key (the first is sent here)."""

    def send(url: str, key: str) -> requests.Response:
        first = upload(SPEECH)(url, key)
        first.raise_for_status()
        return upload(SILENCE, "other.wav")(url, key)

    return send


HOSTILE: dict[str, Request] = {
    "empty file": upload(b""),
    "non-audio named .wav": upload(b"this is not audio\n" * 200),
    "lying WAV header (says 10 h, holds 1 s)": upload(_lying_wav()),
    "lying Content-Type (text sent as audio/wav)": upload(
        b"plain text, not audio " * 100, "a.wav", content_type="audio/wav"
    ),
    "oversize (limit + 1 MiB)": upload(SPEECH[:44] + os.urandom(MAX_UPLOAD + 1024 * 1024)),
    "deeply nested JSON": raw_json(b'{"url": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "lone surrogate in url": raw_json(b'{"url": "http://127.0.0.1/\\udc80.wav"}'),
    "NUL in prompt": upload(SPEECH, fields={"prompt": "hello\x00world"}),
    "NUL in filename": upload(SPEECH, name="a\x00b.wav"),
    "NUL in job id": get("/v1/jobs/job_%00x"),
    "Idempotency-Key reused with another body": reused_key(),
    "huge header (64 KiB)": get("/v1/jobs", **{"X-Pad": "a" * 65536}),
    "second file part": repeated_parts([("a.wav", SPEECH), ("b.wav", SILENCE)], []),
    "900 language fields": repeated_parts([("a.wav", SPEECH)], [("language", "en")] * 900),
    "JSON key twice": raw_json(
        b'{"url": "http://127.0.0.1:9/a.wav", "url": "http://127.0.0.1:9/b"}'
    ),
}


# -- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    tmp: Path
    env: dict[str, str]
    url: str
    redis_port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def storage(self) -> Path:
        return Path(self.env["MURMUR_STORAGE_PATH"])

    def start_redis(self) -> None:
        self.procs["redis"] = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=(self.tmp / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["redis-cli", "-p", str(self.redis_port), "ping"],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        raise RuntimeError("redis-server did not start")

    def stop_redis(self) -> None:
        proc = self.procs.pop("redis")
        proc.terminate()
        proc.wait(10)

    def worker_pids(self) -> list[int]:
        pids = []
        for record in (self.tmp / "instances").glob("local-*.json"):
            try:
                pids.append(int(json.loads(record.read_text())["pid"]))
            except (OSError, ValueError, KeyError):
                continue
        return pids

    def stop(self) -> None:
        for name in ("io", "control", "api"):
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        for pid in self.worker_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if "redis" in self.procs:
            self.stop_redis()


def production_api(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """The API as `murmur api` runs it (app/server.py: its worker class, threads, timeouts)."""
    env = {**env, "MURMUR_HOST": "127.0.0.1", "MURMUR_PORT": str(port)}
    args = gunicorn_args(load_settings(env=env), workers=2, threads=8)
    out = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *args],
        env=env,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    return answering(proc, port, f"the API (log: {log})")


def start_stack(database_url: str | None) -> Stack:
    tmp = temp_dir()
    port, redis_port = free_port(), free_port()
    config = tmp / "drill.toml"
    config.write_text(
        "[fleet]\nreconcile_interval_seconds = 1.0\nidle_timeout_seconds = 120.0\n"
        "[observability]\nreport_interval_seconds = 5.0\n"
    )
    env = {
        **bench_env(tmp, port),
        "MURMUR_CONFIG": str(config),
        "MURMUR_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "MURMUR_LOCAL_STATE_DIR": str(tmp / "instances"),
        "MURMUR_MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
    }
    if database_url is not None:
        env["MURMUR_DATABASE_URL"] = database_url
    stack = Stack(tmp, env, f"http://127.0.0.1:{port}", redis_port)
    stack.start_redis()
    upgrade(env["MURMUR_DATABASE_URL"])
    stack.procs["api"] = production_api(env, port, tmp / "api.log")
    stack.procs["control"] = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "-Q",
            "control",
            "-B",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp / "celerybeat-schedule"),
            "-n",
            f"drill-control-{uuid.uuid4().hex[:6]}@%h",
        ],
        env=env,
        cwd=ROOT,
        stdout=(tmp / "control.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    # URL fetches, webhooks and retention run on their own queue and worker, as in `make up`.
    stack.procs["io"] = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "-Q",
            "io",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--loglevel",
            "INFO",
            "-n",
            f"drill-io-{uuid.uuid4().hex[:6]}@%h",
        ],
        env=env,
        cwd=ROOT,
        stdout=(tmp / "io.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    return stack


# -- accounting --------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    submitted: int = 0
    accepted: int = 0
    refused_json: int = 0
    refused_other: int = 0
    server_errors: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    files_left: int = 0
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list)
    job_ids: set[str] = field(default_factory=set)
    notes: set[str] = field(default_factory=set)


def _is_json_error(response: requests.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and {"code", "message"} <= set(error)


def send(stack: Stack, row: Row, request: Request) -> None:
    """One logical submission, retried like a real client on connection errors and 5xx."""
    key = f"drill-{uuid.uuid4().hex}"
    row.submitted += 1
    row.keys.append(key)
    response: requests.Response | None = None
    for attempt in range(3):
        try:
            response = request(stack.url, key)
        except requests.RequestException as exc:
            row.notes.add(type(exc).__name__)
            time.sleep(1 + attempt)
            continue
        if response.status_code >= 500:
            row.server_errors += 1
            row.notes.add(f"{response.status_code}")
            time.sleep(1 + attempt)
            continue
        break
    if response is None:
        return
    if response.status_code == 202:
        row.accepted += 1
        row.job_ids.add(response.json()["id"])
    elif 400 <= response.status_code < 500:
        if _is_json_error(response):
            row.refused_json += 1
            row.notes.add(f"{response.status_code} {response.json()['error']['code']}")
        else:
            row.refused_other += 1
            row.notes.add(f"{response.status_code} not JSON")
    elif response.status_code < 300:
        row.notes.add(f"{response.status_code}")


def unreferenced_files(stack: Stack, db: Database) -> set[str]:
    with db.reader() as s:
        keys = {k for (k,) in s.execute(_audio_keys()) if k}
    on_disk = {p.name for p in stack.storage.glob("*") if p.is_file()}
    staged = {f".staging/{p.name}" for p in (stack.storage / ".staging").glob("*")}
    return (on_disk - keys) | staged


def _audio_keys() -> Any:
    from sqlalchemy import select

    from app.models import Job

    return select(Job.audio_key)


def settle(stack: Stack, db: Database, row: Row, before: set[str]) -> None:
    """Wait (bounded) for the row's jobs to end, then count outcomes and leftovers."""
    from sqlalchemy import func, select

    from app.models import Job

    deadline = time.monotonic() + JOB_DEADLINE
    statuses: dict[str, str] = {}
    while True:
        with db.reader() as s:
            if row.keys:
                found = s.execute(
                    select(Job.id, Job.status).where(Job.idempotency_key.in_(row.keys))
                ).all()
                statuses = {job_id: status for job_id, status in found}
        if all(statuses.get(j) in ENDED for j in row.job_ids) or time.monotonic() > deadline:
            break
        time.sleep(1)
    with db.reader() as s:
        if row.keys:
            per_key = s.execute(
                select(func.count())
                .select_from(Job)
                .where(Job.idempotency_key.in_(row.keys))
                .group_by(Job.idempotency_key)
            ).all()
            row.duplicated = sum(max(0, n - 1) for (n,) in per_key)
            errors = s.execute(
                select(Job.error_code).where(
                    Job.idempotency_key.in_(row.keys), Job.status == "failed"
                )
            ).all()
            row.notes.update(f"failed: {code}" for (code,) in errors)
    for job_id in row.job_ids:
        status = statuses.get(job_id)
        if status == "succeeded":
            row.succeeded += 1
        elif status in ("failed", "cancelled"):
            row.failed += 1
        else:
            row.lost += 1
    time.sleep(0.5)  # a refused upload's staged file is removed just after the answer
    row.files_left = len(unreferenced_files(stack, db) - before)


def wait_for_running(db: Database, job_ids: set[str], timeout: float) -> bool:
    from sqlalchemy import select

    from app.models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.reader() as s:
            running = s.execute(
                select(Job.id).where(Job.id.in_(job_ids), Job.status == "running")
            ).first()
        if running is not None:
            return True
        time.sleep(0.2)
    return False


# -- the drill ---------------------------------------------------------------------------------


def run(stack: Stack, *, smoke: bool = False) -> list[Row]:
    db = Database(stack.env["MURMUR_DATABASE_URL"])
    rows: list[Row] = []

    def scenario(name: str, body: Callable[[Row], None]) -> None:
        before = unreferenced_files(stack, db)
        row = Row(name)
        started = time.monotonic()
        body(row)
        settle(stack, db, row, before)
        row.seconds = time.monotonic() - started
        rows.append(row)
        print(f"  {name}: done in {row.seconds:.0f} s", flush=True)

    scenario(
        "good uploads (speech-short.wav)",
        lambda r: [send(stack, r, upload(SPEECH)) for _ in range(1 if smoke else 6)],
    )
    for name, request in list(HOSTILE.items())[: 2 if smoke else None]:
        repeats = 1 if smoke else HOSTILE_REPEATS
        scenario(name, lambda r, req=request, n=repeats: [send(stack, r, req) for _ in range(n)])
    if smoke:  # the faults restart processes: minutes, not for CI
        db.dispose()
        return rows

    def kill_worker(row: Row) -> None:
        for _ in range(3):
            send(stack, row, upload(SPEECH_90S, "long.wav"))
        if not wait_for_running(db, row.job_ids, 120):
            row.notes.add("no job was running to kill")
            return
        for pid in stack.worker_pids():
            try:
                os.killpg(pid, signal.SIGKILL)
                row.notes.add("worker killed")
            except ProcessLookupError:
                continue

    scenario("fault: SIGKILL the GPU worker mid-job", kill_worker)

    def restart_redis(row: Row) -> None:
        for _ in range(2):
            send(stack, row, upload(SPEECH))
        stack.stop_redis()
        for _ in range(2):
            send(stack, row, upload(SPEECH))
        stack.start_redis()  # empty: the broker lost every message
        for _ in range(2):
            send(stack, row, upload(SPEECH))

    scenario("fault: Redis stopped (data lost) and restarted", restart_redis)
    db.dispose()
    return rows


def table(rows: list[Row]) -> str:
    head = (
        "| input or fault | submitted | 202 | 4xx JSON | other 4xx | 5xx | succeeded | failed "
        "| lost | duplicated | files left | s to settle | answers seen |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r.name} | {r.submitted} | {r.accepted} | {r.refused_json} | {r.refused_other} "
        f"| {r.server_errors} | {r.succeeded} | {r.failed} | {r.lost} | {r.duplicated} "
        f"| {r.files_left} | {r.seconds:.0f} | {', '.join(sorted(r.notes))} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def throwaway_postgres() -> contextlib.AbstractContextManager[str]:
    """A database of its own on MURMUR_BENCH_POSTGRES_URL's server, dropped at the end."""
    from tests.conftest import throwaway_database

    server = os.environ.get(
        "MURMUR_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    return throwaway_database(server, "murmur_drill")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", action="store_true", help="a throw-away PostgreSQL database")
    parser.add_argument("--keep", action="store_true", help="keep the logs and files afterwards")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: one good upload, two hostile inputs, no faults"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as resources:
        database_url = resources.enter_context(throwaway_postgres()) if args.postgres else None
        return drill(database_url, keep=args.keep, smoke=args.smoke)


def drill(database_url: str | None, *, keep: bool, smoke: bool = False) -> int:
    print(
        f"starting a local stack on 127.0.0.1 ({database_url and 'PostgreSQL' or 'SQLite'}) …",
        flush=True,
    )
    stack = start_stack(database_url)
    try:
        deadline = time.monotonic() + 60
        while requests.get(f"{stack.url}/readyz", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the API did not become ready")
            time.sleep(0.5)
        print(f"stack up at {stack.url} (files in {stack.tmp})", flush=True)
        rows = run(stack, smoke=smoke)
    finally:
        stack.stop()
        if keep:
            print(f"logs and files kept in {stack.tmp}", flush=True)
        else:
            shutil.rmtree(stack.tmp, ignore_errors=True)
    print()
    print(table(rows))
    if smoke:  # the drill's own verdict: nothing lost, duplicated or left, the good job done
        broken = any(r.lost or r.duplicated or r.files_left or r.server_errors for r in rows)
        return 1 if broken or rows[0].succeeded != rows[0].accepted else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
