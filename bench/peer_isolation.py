"""Peer isolation drill: an upload on an empty fleet while URL fetches and webhooks wait on
tarpits, against the same upload on an idle stack (issue 21, §1).

    .venv/bin/python bench/peer_isolation.py [--postgres] [--smoke] [--keep]

Starts, on 127.0.0.1 only: its own `redis-server`, the API (the production gunicorn command
line), a control worker (`-Q control`, the reconcile), an I/O worker (`-Q io`, threads, as
`make up` and docker/compose.yaml run it), beat (reconcile every second), and a slow peer
(tests/slow_peers.py) that answers a URL fetch with a status line and then one header byte
every 10 s, and a webhook with one byte of its status line every 10 s.

1. Baseline: one upload (speech-short.wav) on the idle, empty fleet; seconds to `succeeded`
   (the reconcile starts a CPU worker through the `local` provider); then the idle worker is
   deleted (idle timeout 5 s) and the drill waits for an empty fleet again. The full run
   makes one unmeasured upload before it, so that both measured ones start a worker warm.
2. Load: WEBHOOKS URL jobs at a path that answers 404 at once, each with a webhook to the
   dripping receiver, then TARPITS URL jobs at the tarpit, spread over four hostile API tokens.
3. The same upload, from another token, on the empty fleet; seconds to `succeeded`.

`/readyz` is read every second from the start of the load to the end. Passes (exit 0) when
the loaded upload is done within SLACK seconds of the baseline and every `/readyz` was 200;
`--smoke` runs 5 tarpits and 10 webhooks, in about a minute, with a looser slack (a loaded CI
machine), and still fails on a stalled upload. URL jobs and webhooks reach only the peer this
script started (`api.allow_private_urls` is on for it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import requests
from _stack import ROOT, TOKEN, bench_env, free_port, temp_dir
from reliability_drill import Stack, production_api, throwaway_postgres

from app.db import Database
from app.migrate import upgrade
from tests.slow_peers import SlowPeer, slow_peer

SPEECH = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()
HOSTILE = [f"bench-hostile-{n}-" + "h" * 32 for n in range(4)]
OTHER = "bench-other-" + "o" * 32
DRIP_SECONDS = 10.0
IO_THREADS = 20
# Both measured uploads start at least this long after the fleet was last seen empty: a
# deleted worker's process may still be exiting (and using a CPU) when its row says deleted.
SETTLE_SECONDS = 10.0


@dataclass(frozen=True)
class Size:
    tarpits: int
    webhooks: int
    slack_seconds: float  # the loaded upload may take this much longer than the baseline
    upload_deadline: float  # seconds after which an upload counts as stalled
    warm_up: bool  # one unmeasured upload first, so the baseline is not a cold start


FULL = Size(tarpits=50, webhooks=200, slack_seconds=10.0, upload_deadline=240.0, warm_up=True)
SMOKE = Size(tarpits=5, webhooks=10, slack_seconds=30.0, upload_deadline=60.0, warm_up=False)


@dataclass
class Outcome:
    baseline: float = 0.0
    loaded: float | None = None
    readyz: list[int] = field(default_factory=list)
    max_tarpits: int = 0
    max_hooks: int = 0
    hooks_seen: int = 0


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def celery(stack: Stack, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", *args],
        env=stack.env,
        cwd=ROOT,
        stdout=(stack.tmp / f"{name}.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start(database_url: str | None, one_queue: bool = False) -> Stack:
    tmp = temp_dir()
    port, redis_port = free_port(), free_port()
    config = tmp / "drill.toml"
    config.write_text(
        "[fleet]\nreconcile_interval_seconds = 1.0\nidle_timeout_seconds = 5.0\n"
        "[api]\nallow_private_urls = true\n"  # the peer is this script's, on 127.0.0.1
    )
    env = {
        **bench_env(tmp, port),
        "MURMUR_CONFIG": str(config),
        "MURMUR_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "MURMUR_LOCAL_STATE_DIR": str(tmp / "instances"),
        "MURMUR_API_TOKEN": ",".join([TOKEN, OTHER, *HOSTILE]),
        "MURMUR_WEBHOOK_SECRET": "bench-webhook-secret-" + "w" * 32,
    }
    if database_url is not None:
        env["MURMUR_DATABASE_URL"] = database_url
    stack = Stack(tmp, env, f"http://127.0.0.1:{port}", redis_port)
    stack.start_redis()
    upgrade(env["MURMUR_DATABASE_URL"])
    stack.procs["api"] = production_api(env, port, tmp / "api.log")
    tag = uuid.uuid4().hex[:6]
    queues = "control,io" if one_queue else "control"  # --one-queue: the layout before issue 21
    stack.procs["control"] = celery(
        stack,
        "control",
        ["worker", "-Q", queues, "--concurrency", "2", "-l", "INFO", "-n", f"control-{tag}@%h"],
    )
    if one_queue:
        stack.procs["beat"] = celery(
            stack, "beat", ["beat", "--schedule", str(stack.tmp / "celerybeat-schedule")]
        )
        return stack
    stack.procs["io"] = celery(
        stack,
        "io",
        [
            "worker",
            "-Q",
            "io",
            "--pool",
            "threads",
            "--concurrency",
            str(IO_THREADS),
            "-l",
            "INFO",
            "-n",
            f"io-{tag}@%h",
        ],
    )
    stack.procs["beat"] = celery(
        stack, "beat", ["beat", "--schedule", str(stack.tmp / "celerybeat-schedule")]
    )
    return stack


def stop(stack: Stack) -> None:
    # Warm shutdown would wait for the tarpitted fetches (their deadline is 300 s).
    for name in ("beat", "io", "control"):
        proc = stack.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    stack.stop()


def live_workers(db: Database) -> int:
    from sqlalchemy import func, select

    from app.models import LIVE_WORKER_STATES, Worker

    with db.reader() as s:
        return int(
            s.execute(
                select(func.count()).select_from(Worker).where(Worker.state.in_(LIVE_WORKER_STATES))
            ).scalar_one()
        )


def wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def timed_upload(stack: Stack, token: str, deadline: float) -> float | None:
    """Seconds from the upload to `succeeded`, or None if it had not succeeded by `deadline`."""
    started = time.monotonic()
    response = requests.post(
        f"{stack.url}/v1/jobs",
        files={"file": ("speech.wav", SPEECH)},
        headers=auth(token),
        timeout=60,
    )
    response.raise_for_status()
    job_id = response.json()["id"]
    while time.monotonic() - started < deadline:
        job = requests.get(f"{stack.url}/v1/jobs/{job_id}", headers=auth(token), timeout=30).json()
        if job["status"] == "succeeded":
            return time.monotonic() - started
        if job["status"] in ("failed", "cancelled"):
            raise RuntimeError(f"the upload ended {job['status']}: {job.get('error')}")
        time.sleep(0.2)
    return None


def submit(stack: Stack, token: str, body: dict[str, str]) -> None:
    response = requests.post(f"{stack.url}/v1/jobs", json=body, headers=auth(token), timeout=60)
    if response.status_code != 202:
        raise RuntimeError(f"a URL job was refused: {response.status_code} {response.text}")


def drill(stack: Stack, peer: SlowPeer, size: Size) -> Outcome:
    out = Outcome()
    db = Database(stack.env["MURMUR_DATABASE_URL"])
    try:
        wait(
            lambda: requests.get(f"{stack.url}/readyz", timeout=5).status_code == 200, 90, "/readyz"
        )
        if size.warm_up:  # the first worker start reads the model and imports from a cold cache
            if timed_upload(stack, TOKEN, size.upload_deadline) is None:
                raise RuntimeError("the warm-up upload did not finish: the stack is broken")
            wait(lambda: live_workers(db) == 0, 120, "the idle worker to be deleted")
            time.sleep(SETTLE_SECONDS)
        baseline = timed_upload(stack, TOKEN, size.upload_deadline)
        if baseline is None:
            raise RuntimeError("the baseline upload did not finish: the stack is broken")
        out.baseline = baseline
        print(f"  idle stack: upload done in {baseline:.1f} s", flush=True)
        wait(lambda: live_workers(db) == 0, 120, "the idle worker to be deleted")
        empty_at = time.monotonic()

        stop_watch = threading.Event()

        def watch() -> None:
            while not stop_watch.wait(1.0):
                try:
                    code = requests.get(f"{stack.url}/readyz", timeout=10).status_code
                except requests.RequestException:
                    code = 0
                out.readyz.append(code)
                out.max_tarpits = max(out.max_tarpits, peer.open_tarpits)
                out.max_hooks = max(out.max_hooks, peer.open_hooks)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for n in range(size.webhooks):
                submit(
                    stack,
                    HOSTILE[n % len(HOSTILE)],
                    {"url": f"{peer.url}/missing{n}.wav", "webhook_url": f"{peer.url}/hook{n}"},
                )
            wait(lambda: peer.open_hooks >= 1, 60, "a webhook to wait on the receiver")
            for n in range(size.tarpits):
                submit(stack, HOSTILE[n % len(HOSTILE)], {"url": f"{peer.url}/tarpit{n}.wav"})
            wait(lambda: peer.open_tarpits >= 1, 60, "a fetch to wait on the tarpit")
            time.sleep(max(0.0, empty_at + SETTLE_SECONDS - time.monotonic()))
            print(
                f"  load in place: {peer.open_tarpits} fetches and {peer.open_hooks} webhooks "
                "waiting on the peer",
                flush=True,
            )
            out.loaded = timed_upload(stack, OTHER, size.upload_deadline)
        finally:
            stop_watch.set()
            watcher.join(15)
        out.hooks_seen = peer.hooks_seen
    finally:
        db.dispose()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", action="store_true", help="a throw-away PostgreSQL database")
    parser.add_argument("--smoke", action="store_true", help="5 tarpits and 10 webhooks, ~1 min")
    parser.add_argument("--keep", action="store_true", help="keep the logs and files afterwards")
    parser.add_argument(
        "--one-queue",
        action="store_true",
        help="for comparison: the control worker also runs the io queue (the layout before)",
    )
    args = parser.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    with contextlib.ExitStack() as resources:
        database_url = resources.enter_context(throwaway_postgres()) if args.postgres else None
        peer = resources.enter_context(slow_peer(DRIP_SECONDS))
        kind = "PostgreSQL" if args.postgres else "SQLite"
        print(f"peer isolation drill ({kind}, {size.tarpits} tarpits, {size.webhooks} webhooks)")
        stack = start(database_url, one_queue=args.one_queue)
        try:
            outcome = drill(stack, peer, size)
        finally:
            peer.close()  # the held fetches and webhooks end at the next drip
            stop(stack)
            if args.keep:
                print(f"logs and files kept in {stack.tmp}", flush=True)
            else:
                shutil.rmtree(stack.tmp, ignore_errors=True)
    return report(outcome, size, kind)


def report(out: Outcome, size: Size, kind: str) -> int:
    not_ready = sum(1 for code in out.readyz if code != 200)
    loaded = f"{out.loaded:.1f}" if out.loaded is not None else f"> {size.upload_deadline:.0f}"
    extra = f"{out.loaded - out.baseline:+.1f}" if out.loaded is not None else "stalled"
    print()
    print(
        "| database | tarpit URL jobs | webhooks | upload, idle (s) | upload, under load (s) "
        "| difference (s) | /readyz not 200 | fetches held at once (max) "
        "| webhooks held at once (max) | webhook attempts seen |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {kind} | {size.tarpits} | {size.webhooks} | {out.baseline:.1f} | {loaded} | {extra} "
        f"| {not_ready} of {len(out.readyz)} | {out.max_tarpits} | {out.max_hooks} "
        f"| {out.hooks_seen} |"
    )
    problems = []
    if out.loaded is None:
        problems.append(f"the upload under load did not finish within {size.upload_deadline:.0f} s")
    elif out.loaded - out.baseline > size.slack_seconds:
        problems.append(
            f"the upload under load took {out.loaded - out.baseline:.1f} s longer than idle "
            f"(bound {size.slack_seconds:.0f} s)"
        )
    if not_ready:
        problems.append(f"/readyz was not 200 {not_ready} times")
    if not out.max_tarpits:
        problems.append("no fetch was ever held by the tarpit: the drill proved nothing")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
