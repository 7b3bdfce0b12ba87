"""A worker whose broker dies mid-job, with its data, must not become a live zombie.

Reproduces the Redis-restart row of docs/reliability.md for real: a `python -m gpu_worker
run` process consumes from a private redis-server (no persistence) on a free loopback port;
the server is killed with SIGKILL while a job runs, so acknowledging that job fails; it is
started again, empty, on the same port. Before the fix in gpu_worker/liveness.py the worker
then consumed nothing for good while its heartbeats and usage reports went on.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.worker.test_worker_process import WorkerProcess, enqueue

pytestmark = pytest.mark.slow


class RedisServer:
    """A redis-server without persistence on a fixed loopback port, killable and restartable."""

    def __init__(self, directory: Path) -> None:
        server = shutil.which("redis-server")
        if server is None:
            pytest.skip("redis-server is not installed")
        self._server = server
        self._dir = directory
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self._server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._dir),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        pytest.fail(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no shutdown save, every message is lost (the server runs without one)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def long_then_short(control_plane, fixtures_dir):
    control_plane.add_job("job_long", (fixtures_dir / "speech-90s.wav").read_bytes())
    control_plane.add_job("job_next", (fixtures_dir / "speech-short.wav").read_bytes())


def lose_the_ack(worker: WorkerProcess, broker: RedisServer, control_plane) -> None:
    """Start job_long, kill the broker under it, and wait until its acknowledgement failed."""
    worker.wait_for(lambda: control_plane.ready_bodies, "report ready")
    enqueue(broker.url, "job_long")
    worker.wait_for(control_plane.claimed.is_set, "claim the job")
    broker.kill()
    worker.wait_for(lambda: "job_long" in control_plane.results, "finish the job")
    worker.wait_for(lambda: "Couldn't ack" in worker.log_path.read_text(), "fail its ack")


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.usefixtures("long_then_short")
def test_a_worker_whose_ack_failed_consumes_again_once_the_broker_is_back(
    broker, cpu_env, control_plane, tmp_path
):
    worker = WorkerProcess(cpu_env, control_plane, broker.url, tmp_path / "worker.log")
    try:
        lose_the_ack(worker, broker, control_plane)
        broker.start()  # empty, on the same port
        enqueue(broker.url, "job_next")

        # Consumed again, or gone (so the fleet replaces it): never alive and idle for good.
        ended = wait_until(
            lambda: "job_next" in control_plane.results or worker.process.poll() is not None, 45
        )
        log = worker.log_path.read_text()
        assert ended, f"the worker neither consumed again nor exited; log:\n{log}"
        assert "job_next" in control_plane.results, f"the worker exited; log:\n{log}"
        assert worker.process.poll() is None
    finally:
        worker.kill()


@pytest.mark.usefixtures("long_then_short")
def test_a_stalled_worker_sends_no_usage_report_until_it_consumes_again(
    broker, cpu_env, control_plane, tmp_path
):
    worker = WorkerProcess(
        cpu_env,
        control_plane,
        broker.url,
        tmp_path / "worker.log",
        MURMUR_OBSERVABILITY_ENABLED="1",
        MURMUR_REPORT_INTERVAL="0.5",
    )
    try:
        lose_the_ack(worker, broker, control_plane)
        # The broker stays down: the worker cannot take a job, so it must not be heard. The
        # stall is confirmed within about two seconds (gpu_worker/liveness.py); then a window
        # of six report intervals.
        time.sleep(4)
        withheld_from = len(control_plane.reports)
        time.sleep(3)
        assert len(control_plane.reports) == withheld_from, (
            "usage reports went on while the worker could not consume; log:\n"
            + worker.log_path.read_text()
        )

        broker.start()
        enqueue(broker.url, "job_next")
        worker.wait_for(lambda: "job_next" in control_plane.results, "consume again", timeout=45)
        assert wait_until(lambda: len(control_plane.reports) > withheld_from, 10)
        states = {r["state"] for r in control_plane.reports[withheld_from:]}
        assert states <= {"ready", "busy"}, states
    finally:
        worker.kill()
