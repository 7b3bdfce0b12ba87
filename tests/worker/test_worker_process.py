"""The worker as a process: `python -m gpu_worker check | run` with Redis and a control plane."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from gpu_worker.protocol.broker import TRANSCRIBE_TASK

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
QUEUE = "transcribe.test-cpu"

IDENTITY = (
    "MURMUR_WORKER_ID",
    "MURMUR_INSTANCE_ID",
    "MURMUR_WORKER_TOKEN",
    "MURMUR_CONTROL_URL",
    "MURMUR_BROKER_URL",
    "MURMUR_PROFILE",
)


def clean_env(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MURMUR_")}
    env.update(settings)
    return env


def gpu_worker(*args: str, env: dict[str, str], timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker", *args],
        cwd=REPO,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_env(cpu_env):
    return {k: v for k, v in cpu_env.items() if k not in IDENTITY}


def test_check_exits_0_and_prints_the_runtime_for_a_good_cpu_env(cpu_env):
    result = gpu_worker("check", env=check_env(cpu_env))

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["problems"] == []
    assert report["model"] == "tiny.en"
    assert report["compute_type"] == "int8"
    assert report["backend"] == "faster-whisper"
    assert set(report["assets"]) == {"tiny.en", "faster-whisper-silero"}
    assert report["versions"]["faster_whisper"] == "1.2.1"


def test_check_exits_1_with_the_reason_for_float16_on_cpu(cpu_env):
    env = check_env(cpu_env) | {"MURMUR_COMPUTE_TYPE": "float16"}

    result = gpu_worker("check", env=env)

    assert result.returncode == 1
    reason = (
        "MURMUR_COMPUTE_TYPE: 'float16' is not supported on cpu; use one of float32, int8, "
        "int8_float32"
    )
    assert json.loads(result.stdout)["problems"] == [reason]
    assert reason in result.stderr


def test_check_exits_1_for_an_unknown_value(cpu_env):
    env = check_env(cpu_env) | {"MURMUR_VAD": "webrtc"}

    result = gpu_worker("check", env=env)

    assert result.returncode == 1
    assert "MURMUR_VAD: 'webrtc' is not one of silero, pyannote" in result.stderr


def test_check_never_prints_secrets(cpu_env):
    result = gpu_worker("check", env=cpu_env)

    assert result.returncode == 0
    assert cpu_env["MURMUR_WORKER_TOKEN"] not in result.stdout + result.stderr
    assert "brokerpass" not in result.stdout + result.stderr


def test_run_refuses_to_start_without_its_identity(cpu_env):
    result = gpu_worker("run", env=check_env(cpu_env))

    assert result.returncode == 1
    assert "MURMUR_WORKER_ID: not set" in result.stderr


def test_verify_assets_checks_the_named_assets():
    ok = gpu_worker("verify-assets", "tiny.en", "faster-whisper-silero", env={})
    absent = gpu_worker("verify-assets", "tiny.en", "wav2vec2-en", env={})

    assert ok.returncode == 0, ok.stdout
    assert ok.stdout.startswith("ok   tiny.en: 78090594 bytes under ")
    assert absent.returncode == 1
    assert "FAIL wav2vec2-en: not installed (/opt/murmur/assets/wav2vec2 does not exist" in (
        absent.stdout
    )


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield url
    process.terminate()
    process.wait(timeout=10)


class WorkerProcess:
    def __init__(self, cpu_env, control_plane, redis_url, log_path: Path, **extra: str) -> None:
        env = dict(cpu_env)
        env.update(
            MURMUR_CONTROL_URL=control_plane.url,
            MURMUR_BROKER_URL=redis_url,
            MURMUR_PROFILE="test-cpu",
            **extra,
        )
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker", "run"],
            cwd=REPO,
            env=clean_env(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_for(self, condition, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"worker did not {what}; log:\n{self.log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def start_worker(cpu_env, control_plane, redis_url, tmp_path):
    started: list[WorkerProcess] = []

    def start(**extra: str) -> WorkerProcess:
        worker = WorkerProcess(
            cpu_env, control_plane, redis_url, tmp_path / f"worker{len(started)}.log", **extra
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def enqueue(redis_url: str, job_id: str) -> None:
    producer = Celery("test-producer", broker=redis_url, set_as_current=False)
    producer.send_task(TRANSCRIBE_TASK, args=[job_id], queue=QUEUE)
    producer.close()


def queued_messages(redis_url: str) -> int:
    return int(redis.Redis.from_url(redis_url).llen(QUEUE))


def test_run_reports_ready_serves_a_job_and_stops_on_sigterm(
    start_worker, control_plane, redis_url, fixtures_dir, word_error_rate
):
    control_plane.add_job("job_1", (fixtures_dir / "speech-short.wav").read_bytes())
    # What the instance's unit passes after pulling the image (app/fleet/cloudinit.py).
    worker = start_worker(MURMUR_IMAGE_PULL_SECONDS="12.5")
    worker.wait_for(lambda: control_plane.ready_bodies, "report ready")

    enqueue(redis_url, "job_1")
    worker.wait_for(lambda: "job_1" in control_plane.results, "post the result")
    exit_code = worker.stop()

    runtime = control_plane.ready_bodies[0]["runtime"]
    assert {k: runtime[k] for k in ("profile", "model", "compute_type", "vad")} == {
        "profile": "test-cpu",
        "model": "tiny.en",
        "compute_type": "int8",
        "vad": "silero",
    }
    assert (runtime["alignment_device"], runtime["batch_size"]) == ("none", 1)
    assert runtime["model_load_seconds"] > 0
    assert runtime["image_pull_seconds"] == 12.5
    text = control_plane.results["job_1"]["transcript"]["text"]
    assert word_error_rate((fixtures_dir / "speech-short.txt").read_text(), text) <= 0.25
    assert exit_code == 0
    assert queued_messages(redis_url) == 0


def test_sigterm_during_a_job_finishes_it_before_exiting(
    start_worker, control_plane, redis_url, fixtures_dir
):
    control_plane.add_job("job_long", (fixtures_dir / "speech-90s.wav").read_bytes())
    control_plane.add_job("job_next", (fixtures_dir / "speech-short.wav").read_bytes())
    worker = start_worker()
    worker.wait_for(lambda: control_plane.ready_bodies, "report ready")

    enqueue(redis_url, "job_long")
    enqueue(redis_url, "job_next")
    worker.wait_for(control_plane.claimed.is_set, "claim the job")
    exit_code = worker.stop(signal.SIGTERM)

    assert exit_code == 0
    assert "job_long" in control_plane.results  # the running job finished
    assert "job_next" not in control_plane.results  # and no new one was taken
    assert queued_messages(redis_url) == 1


def test_a_drain_that_runs_out_of_time_hands_the_job_back(
    start_worker, control_plane, redis_url, fixtures_dir
):
    control_plane.add_job("job_long", (fixtures_dir / "speech-90s.wav").read_bytes())
    worker = start_worker(MURMUR_DRAIN_TIMEOUT="0.5")
    worker.wait_for(lambda: control_plane.ready_bodies, "report ready")

    enqueue(redis_url, "job_long")
    worker.wait_for(control_plane.claimed.is_set, "claim the job")
    started = time.monotonic()
    exit_code = worker.stop(signal.SIGTERM)

    assert time.monotonic() - started < 4.0  # not the ~4.5 s the job needs
    assert exit_code == 0
    assert control_plane.results == {} and control_plane.failures == {}
    assert queued_messages(redis_url) == 1  # back on the queue for another worker


def test_run_exits_3_when_the_control_plane_refuses_the_runtime(start_worker, control_plane):
    control_plane.ready_status = 409
    worker = start_worker()

    assert worker.process.wait(timeout=60) == 3
    assert "refused this runtime" in worker.log_path.read_text()
