"""`make up` / `make demo` run on a Redis of their own, never on one they did not start unless
the operator names it (scripts/with-redis.sh, scripts/stack.py); their start-up failures are
one line.

A redis-server this test starts on a free port stands in for "the Redis on 6379" that another
application uses: the scripts are told it is the machine's shared one
(MURMUR_STACK_SHARED_REDIS), it holds a foreign key, and after the stack has run and reconciled
it holds that key alone.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.conftest import API_TOKEN, ROOT, SIGNING_KEY, free_port

WITH_REDIS = str(ROOT / "scripts" / "with-redis.sh")


@dataclass
class StandIn:
    url: str
    client: redis.Redis
    foreign: str  # the other application's key


@pytest.fixture
def shared_redis(tmp_path: Path) -> Iterator[StandIn]:
    """A redis-server of this test's own, holding another application's key."""
    port = free_port()
    workdir = tmp_path / "shared-redis"
    workdir.mkdir()
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
        + ["--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=5)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the stand-in redis-server did not start"
                time.sleep(0.05)
        foreign = f"other-app:{uuid.uuid4().hex}"
        client.set(foreign, "theirs")
        yield StandIn(f"redis://127.0.0.1:{port}/0", client, foreign)
    finally:
        proc.terminate()
        proc.wait(10)


def stack_env(tmp_path: Path, shared: StandIn, **extra: str) -> dict[str, str]:
    """A user's environment for the scripts, every file under tmp_path, no Redis named."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MURMUR_")}
    env.update(
        {
            "PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT),
            "MURMUR_STACK_VAR": str(tmp_path / "var"),
            "MURMUR_STACK_SHARED_REDIS": shared.url,
            "MURMUR_DATABASE_URL": f"sqlite:///{tmp_path / 'murmur.db'}",
            "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
            "MURMUR_LOCAL_STATE_DIR": str(tmp_path / "instances"),
            "MURMUR_API_TOKEN": API_TOKEN,
            "MURMUR_SIGNING_KEY": SIGNING_KEY,
            "MURMUR_PORT": str(free_port()),
            **extra,
        }
    )
    return env


_PROBE = (
    "import os, redis; url = os.environ['MURMUR_REDIS_URL']; print('url', url); "
    "redis.Redis.from_url(url).set('murmur:probe', '1')"
)


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.ConnectionError:
        return False


@pytest.mark.slow
def test_without_a_named_redis_the_command_gets_a_private_one(
    tmp_path: Path, shared_redis: StandIn
) -> None:
    env = stack_env(tmp_path, shared_redis)
    # Also what the tools beside the stack read (make flower, murmur fleet) while it runs.
    show_env = "; print('env', open(os.environ['MURMUR_STACK_VAR'] + '/stack.env').read())"
    run = subprocess.run(
        [WITH_REDIS, sys.executable, "-c", _PROBE + show_env],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    started = re.search(r"started a private Redis on 127\.0\.0\.1:(\d+)", run.stdout)
    assert started, run.stdout
    private = f"redis://127.0.0.1:{started[1]}/0"
    assert private != shared_redis.url
    assert f"url {private}" in run.stdout
    assert f"env MURMUR_REDIS_URL={private}\n" in run.stdout
    assert not (tmp_path / "var" / "stack.env").exists()
    assert f"the Redis at {shared_redis.url.split('//')[1].split('/')[0]} is left alone" in (
        run.stdout
    )
    # Stopped with the command, its files where the stack keeps its own.
    assert not answers(private)
    assert (tmp_path / "var" / "redis").is_dir()
    assert not list((tmp_path / "var" / "redis").glob("*.pid"))
    assert shared_redis.client.keys("*") == [shared_redis.foreign.encode()]


@pytest.mark.slow
def test_a_named_redis_is_used_as_it_is(tmp_path: Path, shared_redis: StandIn) -> None:
    env = stack_env(tmp_path, shared_redis, MURMUR_REDIS_URL=shared_redis.url)
    run = subprocess.run(
        [WITH_REDIS, sys.executable, "-c", _PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "using the Redis you named (MURMUR_REDIS_URL)" in run.stdout
    assert f"url {shared_redis.url}" in run.stdout
    assert "private" not in run.stdout
    assert sorted(shared_redis.client.keys("*")) == sorted(
        [shared_redis.foreign.encode(), b"murmur:probe"]
    )
    assert answers(shared_redis.url)  # not stopped: the scripts did not start it


@pytest.mark.slow
def test_the_stack_runs_and_reconciles_on_its_own_redis(
    tmp_path: Path, shared_redis: StandIn
) -> None:
    """`make up` as far as a reconcile (beat, control worker, API), then Ctrl-C's TERM."""
    env = stack_env(tmp_path, shared_redis)
    proc = subprocess.Popen(
        [WITH_REDIS, sys.executable, "-m", "scripts.stack", "up"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    private = None
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("Murmur is up") for line in lines):
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        started = re.search(r"started a private Redis on 127\.0\.0\.1:(\d+)", "".join(lines))
        assert started, "".join(lines)
        private = redis.Redis(port=int(started[1]), socket_timeout=5)
        # The beat's reconcile ran to its end (it publishes its plan), on the private Redis.
        while private.exists("murmur:fleet:reconciled-at", "murmur:fleet:plan") < 2:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(90) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    reader.join(10)
    output = "".join(lines)
    assert "Traceback" not in output, output
    assert private is not None
    with pytest.raises(redis.ConnectionError):
        private.ping()
    assert shared_redis.client.keys("*") == [shared_redis.foreign.encode()]


@pytest.mark.slow
def test_start_up_refusals_are_one_line(tmp_path: Path, shared_redis: StandIn) -> None:
    def stack_up(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "scripts.stack", "up"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # Run without with-redis.sh and no Redis named: the embedded default (the machine's
    # shared 6379) is refused, not used.
    unnamed = stack_up(stack_env(tmp_path, shared_redis))
    assert unnamed.returncode == 1
    assert unnamed.stderr.strip().startswith("no Redis named: run the stack as `make up`")
    assert len(unnamed.stderr.strip().splitlines()) == 1

    # The API's port is taken: one line, at once, nothing started.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = stack_env(
            tmp_path, shared_redis, MURMUR_REDIS_URL=shared_redis.url, MURMUR_PORT=str(port)
        )
        taken = stack_up(env)
    assert taken.returncode == 1
    assert taken.stderr.strip() == (
        f"cannot serve the API on 127.0.0.1:{port}: Address already in use (another "
        "`make up`, or another service; MURMUR_PORT=<port> picks another)"
    )
    assert "Traceback" not in taken.stdout + taken.stderr
    assert shared_redis.client.keys("*") == [shared_redis.foreign.encode()]
