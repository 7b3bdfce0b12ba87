"""The reporter against a real local HTTP server: what it sends, and how it survives failures."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest
from celery.signals import after_setup_logger
from pydantic import SecretStr

import gpu_worker  # noqa: F401  (offline model loading, before faster-whisper is imported)
from gpu_worker.jobs import JobContext, Outcome, process_job
from gpu_worker.protocol.claim import ClaimedJob
from gpu_worker.protocol.transcript import Transcript
from gpu_worker.protocol.usage import MAX_REPORT_BYTES, UsageReport
from gpu_worker.reporter import UsageReporter, start_usage_reporter
from gpu_worker.state import Phase, WorkerState
from gpu_worker.telemetry import (
    GpuTelemetry,
    HostReadings,
    LogTail,
    Reading,
)
from tests.conftest import FIXTURES, free_port, wait_for

TOKEN = "cd" * 32
WORKER_ID = "wrk_reporter"
INSTANCE_ID = "inst-reporter"


@dataclass
class ControlPlaneDouble:
    """A local HTTP server standing in for the control plane's report endpoint."""

    mode: str = "ok"  # ok | error | slow
    slow_seconds: float = 2.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with double.lock:
                    double.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    mode = double.mode
                if mode == "slow":
                    time.sleep(double.slow_seconds)
                if mode == "error":
                    payload, status = {"error": {"code": "internal_error", "message": "x"}}, 503
                else:
                    # The control plane's own schema: the two sides must agree.
                    UsageReport.model_validate_json(body)
                    payload, status = {"accepted": True}, 200
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

        return Handler

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)


@pytest.fixture()
def control_plane() -> Iterator[tuple[ControlPlaneDouble, str]]:
    double = ControlPlaneDouble()
    server = ThreadingHTTPServer(("127.0.0.1", 0), double.handler())
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield double, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class StaticHost:
    def sample(self) -> HostReadings:
        return HostReadings(Reading.of(0.5), Reading.of(1e9), Reading.of(4e9))


class NoGpu:
    def sample(self) -> GpuTelemetry:
        return GpuTelemetry((), "nvml_unavailable")


def make_reporter(url: str, state: WorkerState, **kw: Any) -> UsageReporter:
    return UsageReporter(
        control_url=url,
        worker_id=WORKER_ID,
        instance_id=INSTANCE_ID,
        token=SecretStr(TOKEN),
        state=state,
        interval_seconds=kw.pop("interval_seconds", 0.05),
        host=StaticHost(),
        gpus=NoGpu(),
        timeout=kw.pop("timeout", (1.0, 0.5)),
        **kw,
    )


def test_report_is_authenticated_valid_and_sequenced(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    state = WorkerState()
    reporter = make_reporter(url, state)
    assert reporter.send_once()
    state.set_phase(Phase.LOADING)
    state.model_loaded(1.25)
    assert reporter.send_once()
    first, second = double.bodies()
    assert (first["sequence"], second["sequence"]) == (1, 2)
    assert (first["state"], second["state"]) == ("starting", "loading")
    assert first["model_load_seconds"] is None and second["model_load_seconds"] == 1.25
    assert first["process_started_at"] == second["process_started_at"]
    assert first["gpu"] == {"devices": [], "reason": "nvml_unavailable"}
    request = double.requests[0]
    assert request["path"] == f"/internal/workers/{WORKER_ID}/{INSTANCE_ID}/report"
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"


def test_reports_carry_job_counters_but_no_job_ids(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    state = WorkerState()
    state.set_phase(Phase.READY)
    state.job_started("job_secret123")
    busy = make_reporter(url, state)
    assert busy.send_once()
    state.job_finished("succeeded", processing_seconds=2.0, audio_seconds=6.5)
    assert busy.send_once()
    during, after = double.bodies()
    assert during["state"] == "busy"
    assert after["state"] == "ready"
    assert after["transcriptions"] == {"succeeded": 1, "failed": 0}
    assert (after["processing_seconds"], after["audio_seconds"]) == (2.0, 6.5)
    assert all(b"job_secret123" not in r["body"] for r in double.requests)


@pytest.mark.parametrize("failure", ["5xx", "timeout", "refused"])
def test_a_failed_report_is_dropped_and_logged_without_secrets(
    control_plane: tuple[ControlPlaneDouble, str],
    failure: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    double, url = control_plane
    if failure == "5xx":
        double.mode = "error"
    elif failure == "timeout":
        double.mode, double.slow_seconds = "slow", 2.0
    else:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    reporter = make_reporter(url + "/?token=leak", WorkerState(), timeout=(1.0, 0.3))
    with caplog.at_level(logging.WARNING, logger="gpu_worker.reporter"):
        assert reporter.send_once() is False
    assert reporter.dropped == 1 and reporter.delivered == 0
    logged = caplog.text
    assert "usage report 1 dropped" in logged
    assert TOKEN not in logged
    assert "127.0.0.1" not in logged and "leak" not in logged


def test_the_reporter_keeps_going_after_failures(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    double.mode = "error"
    reporter = make_reporter(url, WorkerState())
    reporter.start()
    try:
        wait_for(lambda: reporter.dropped >= 3, 10, "three dropped reports")
        double.mode = "ok"
        wait_for(lambda: reporter.delivered >= 1, 10, "a delivered report after recovery")
        assert reporter.running
        sequences = [b["sequence"] for b in double.bodies()]
        assert sequences == sorted(set(sequences))  # no report is re-sent: no retry queue
    finally:
        reporter.stop()


@pytest.mark.parametrize("failure", ["timeout", "5xx", "refused"])
def test_a_job_still_succeeds_while_reports_fail(
    control_plane: tuple[ControlPlaneDouble, str], failure: str
) -> None:
    double, url = control_plane
    if failure == "timeout":
        double.mode, double.slow_seconds = "slow", 3.0
    elif failure == "5xx":
        double.mode = "error"
    else:
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    state = WorkerState()
    state.set_phase(Phase.READY)
    reporter = make_reporter(url, state, timeout=(1.0, 0.3))
    reporter.start()

    class Client:
        def __init__(self) -> None:
            self.results: list[str] = []

        def claim(self, job_id: str) -> ClaimedJob:
            return ClaimedJob(id=job_id, audio_url="http://127.0.0.1:1/audio")

        def download_audio(self, audio_url: str) -> IO[bytes]:
            return io.BytesIO((FIXTURES / "speech-short.wav").read_bytes())

        def post_result(self, job_id: str, transcript: Any, processing_seconds: float) -> bool:
            self.results.append(job_id)
            return True

        def post_failure(self, job_id: str, code: str, message: str) -> bool:
            raise AssertionError(f"the job failed: {code} {message}")

    class Transcriber:
        backend = "faster-whisper"

        def transcribe(self, audio: Any, **kw: Any) -> Transcript:
            time.sleep(0.5)  # long enough for reports to be attempted meanwhile
            return Transcript(text="hello", language="en", duration=6.6, segments=[])

        def release_memory(self) -> None:
            pass

    client = Client()
    try:
        wait_for(lambda: reporter.dropped >= 1, 10, "a failed report before the job")
        outcome = process_job("job_1", JobContext(client, Transcriber(), state))  # type: ignore[arg-type]
        assert outcome is Outcome.SUCCEEDED
        assert client.results == ["job_1"]
        assert state.snapshot().jobs_succeeded == 1
        wait_for(lambda: reporter.dropped >= 2, 10, "reports failing meanwhile")
        assert reporter.delivered == 0 and reporter.running
    finally:
        reporter.stop()


def test_reporting_stops_when_the_worker_stops(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    _, url = control_plane
    state = WorkerState()
    reporter = make_reporter(url, state)
    reporter.start()
    wait_for(lambda: reporter.delivered >= 1, 10, "a first report")
    state.set_phase(Phase.STOPPED)
    wait_for(lambda: not reporter.running, 10, "the reporter thread to end")
    assert reporter.build_report() is None


def test_no_report_is_sent_while_the_consumer_is_stalled(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    state = WorkerState()
    state.set_phase(Phase.READY)
    reporter = make_reporter(url, state)

    assert reporter.send_once() is True
    state.consumer_stalled()  # gpu_worker/liveness.py: the consumer takes no message
    assert [reporter.send_once() for _ in range(3)] == [False, False, False]
    assert double.count() == 1 and reporter.withheld == 3 and reporter.dropped == 0
    state.consumer_alive()
    assert reporter.send_once() is True
    bodies = double.bodies()
    assert [b["state"] for b in bodies] == ["ready", "ready"]
    assert [b["sequence"] for b in bodies] == [1, 2]  # withheld reports use no sequence number


def test_intervals_are_jittered_within_ten_percent() -> None:
    reporter = make_reporter("http://127.0.0.1:1", WorkerState(), interval_seconds=30.0)
    delays = [reporter.next_delay() for _ in range(500)]
    assert all(27.0 <= d <= 33.0 for d in delays)
    assert max(delays) - min(delays) > 3.0  # not a constant


@contextmanager
def tail_of(name: str) -> Iterator[tuple[LogTail, logging.Logger]]:
    """A LogTail on its own logger, removed afterwards."""
    tail = LogTail()
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(tail)
    try:
        yield tail, logger
    finally:
        logger.removeHandler(tail)


def test_log_lines_are_sent_until_a_report_carrying_them_is_accepted(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    with tail_of("test.observability.reporter") as (tail, logger):
        reporter = make_reporter(url, WorkerState(), log_tail=tail)
        logger.info("first")
        double.mode = "error"
        assert not reporter.send_once()
        logger.info("second")
        double.mode = "ok"
        assert reporter.send_once()
        assert reporter.send_once()
    failed, accepted, after = double.bodies()
    assert [line["number"] for line in failed["log"]] == [1]
    # The failed report's line is sent again with the next one; accepted lines are not.
    assert [line["number"] for line in accepted["log"]] == [1, 2]
    assert after["log"] == []
    assert accepted["log"][1]["text"].endswith("INFO test.observability.reporter: second")


def test_log_lines_that_would_pass_the_body_cap_wait_for_the_next_report(
    control_plane: tuple[ControlPlaneDouble, str],
) -> None:
    double, url = control_plane
    with tail_of("test.observability.reporter.wide") as (tail, logger):
        reporter = make_reporter(url, WorkerState(), log_tail=tail)
        for n in range(50):
            # Non-ASCII text (in the template: an argument that long would be masked), each
            # character a 6-byte escape in the JSON sent.
            logger.info(f"{n:02d} " + "é" * 380)  # noqa: G003, G004
        for _ in range(10):  # until a report has no line left to carry
            assert reporter.send_once()
            if not double.bodies()[-1]["log"]:
                break
    with double.lock:
        sizes = [len(r["body"]) for r in double.requests]
    assert all(size <= MAX_REPORT_BYTES for size in sizes), sizes
    numbers = [[line["number"] for line in body["log"]] for body in double.bodies()]
    assert numbers[-1] == [] and 0 < len(numbers[0]) < 50
    # Every line arrives once, in order, over the following reports.
    assert [n for batch in numbers for n in batch] == list(range(1, 51))


@dataclass(frozen=True)
class _Identity:
    worker_id: str = WORKER_ID
    instance_id: str = INSTANCE_ID
    token: SecretStr = SecretStr(TOKEN)
    control_url: str = "http://127.0.0.1:1"
    broker_url: SecretStr = SecretStr("redis://:pw@127.0.0.1:6379/0")


@dataclass(frozen=True)
class _Runtime:
    observability_enabled: bool
    report_interval_seconds: float = 30.0
    identity: _Identity | None = _Identity()


def test_start_usage_reporter_honours_the_opt_in(tmp_path: Path) -> None:
    assert start_usage_reporter(_Runtime(observability_enabled=False), WorkerState()) is None
    assert start_usage_reporter(_Runtime(True, identity=None), WorkerState()) is None
    root = logging.getLogger()
    before = list(root.handlers)
    reporter = start_usage_reporter(_Runtime(observability_enabled=True), WorkerState())
    try:
        assert reporter is not None and reporter.running
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 1 and isinstance(added[0], LogTail)
        # A Celery worker empties the root logger's handlers as it starts, then says so.
        root.removeHandler(added[0])
        after_setup_logger.send(sender=None, logger=root, loglevel=logging.INFO)
        assert added[0] in root.handlers
    finally:
        if reporter is not None:
            reporter.stop()
    # Stopping undoes the start: no handler left behind, none re-attached by Celery later.
    assert root.handlers == before
    after_setup_logger.send(sender=None, logger=root, loglevel=logging.INFO)
    assert root.handlers == before
