"""A long file cut into parts on real workers (issue 34): two one-thread faster-whisper workers run
its parts at once and the stitched transcript reads like the whole file transcribed by one; a
part's worker killed mid-way costs that part alone; a cancel frees every part's worker.

Real API over HTTP, real Redis and database, real `python -m gpu_worker run` processes with
Whisper tiny.en on the CPU (the parts' mechanism is the same for every model).
"""

from __future__ import annotations

import os
import signal
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy.orm import undefer

from app.celery_config import make_celery
from app.config import load_settings
from app.fleet.apply import resend_parts_of
from app.fleet.cloudinit import worker_environment
from app.models import JobPart, Worker, WorkerState
from app.services import Services, build_services
from app.transitions import move_worker
from gpu_worker.audio import decode_bounded
from gpu_worker.preflight import run_preflight
from gpu_worker.transcriber import load_transcriber
from tests.conftest import FIXTURES, LiveApi, api_get, auth, wait_for
from tests.test_pipeline import wer

# `serial`: two workers and a whole-file transcription take both cores.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    # PostgreSQL, as in production: parts finish at once on several API threads.
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
]

PART_SECONDS = 120
PROFILE = f"""
[jobs]
part_seconds = {PART_SECONDS}

[[profiles]]
name = "local-cpu"
provider = "local"
zone = "local"
server_type = "local-cpu"
model = "tiny.en"
compute_type = "int8"
vad = "silero"
alignment_device = "none"
batch_size = 8
cpu_threads = 1
max_workers = 2
hourly_cost_eur = 0.0
"""
# speech-90s eight times over: 12 min of speech, 23 MB (under the upload cap), 6 parts.
REPEATS = 8


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "parts.toml"
    config.write_text(PROFILE)
    return {"MURMUR_CONFIG": str(config)}


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parts") / "long.wav"
    with wave.open(str(FIXTURES / "speech-90s.wav")) as src:
        params, frames = src.getparams(), src.readframes(src.getnframes())
    with wave.open(str(path), "wb") as out:
        out.setparams(params)
        for _ in range(REPEATS):
            out.writeframes(frames)
    return path


@pytest.fixture(scope="module")
def whole_text(long_file: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The file transcribed whole, as one worker of the same profile does it (in this process,
    before any worker starts: the model is freed once the text is known)."""
    config = tmp_path_factory.mktemp("whole") / "parts.toml"
    config.write_text(PROFILE)
    settings = load_settings(env={"MURMUR_CONFIG": str(config)})
    env = {**os.environ, **worker_environment(settings, settings.profile("local-cpu"), "w", "i")}
    preflight = run_preflight(env, require_identity=False)
    transcriber = load_transcriber(preflight.profile, preflight.model)
    samples = decode_bounded(long_file, 3600)
    transcript = transcriber.transcribe(
        samples, language=None, prompt=None, word_timestamps=True, task="transcribe"
    )
    return transcript.text


def reference() -> str:
    return " ".join([(FIXTURES / "speech-90s.txt").read_text().strip()] * REPEATS)


def upload(live: LiveApi, path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        response = requests.post(
            f"{live.url}/v1/jobs", headers=auth(), files={"file": (path.name, fh)}, timeout=120
        )
    assert response.status_code == 202, response.text
    return dict(response.json())


def finished(
    live: LiveApi, job_id: str, timeout: float = 900, seen: list[float] | None = None
) -> dict[str, Any]:
    """The job once it ended; `seen` gets the progress it showed while running."""

    def done() -> dict[str, Any] | None:
        job = api_get(live, f"/v1/jobs/{job_id}").json()
        if seen is not None and job["status"] == "running":
            seen.append(float(job["progress"]))
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    return dict(wait_for(done, timeout, f"job {job_id} to finish", step=0.5))


def part_rows(live: LiveApi, job_id: str) -> list[JobPart]:
    with live.db.reader() as s:
        query = s.query(JobPart).filter(JobPart.job_id == job_id).order_by(JobPart.index)
        return list(query.options(undefer(JobPart.transcript)))


def two_workers(start_worker: Any) -> Iterator[Any]:
    for _ in range(2):
        yield start_worker()


def test_a_long_file_runs_on_two_workers_at_once_and_reads_like_one(
    live_api: LiveApi, start_worker: Any, long_file: Path, whole_text: str
) -> None:
    workers = list(two_workers(start_worker))
    job = upload(live_api, long_file)
    assert job["status"] == "dispatched"
    seen: list[float] = []
    done = finished(live_api, job["id"], seen=seen)
    assert done["status"] == "succeeded", done
    # Progress counts the parts' audio as they run: it rose through values between 0 and 1.
    assert seen == sorted(seen) and len({p for p in seen if 0 < p < 1}) >= 2, seen
    rows = part_rows(live_api, job["id"])
    assert len(rows) >= 4 and done["parts"] == {"count": len(rows), "done": len(rows), "running": 0}
    assert all(r.attempts == 1 for r in rows)
    # Two parts ran at once, on the two workers.
    assert {r.worker_id for r in rows} == {w.id for w, _ in workers}
    overlapping = [
        (a.index, b.index)
        for a in rows
        for b in rows
        if a.worker_id != b.worker_id
        and a.started_at is not None
        and b.finished_at is not None
        and a.started_at < b.finished_at
        and b.started_at is not None
        and b.started_at < (a.finished_at or b.started_at)
    ]
    assert overlapping, [(r.index, r.worker_id, r.started_at, r.finished_at) for r in rows]

    text = done["text"]
    truth = reference()
    print(
        f"parts: WER {wer(truth, text):.4f} ({len(text.split())} words) against whole: "
        f"{wer(truth, whole_text):.4f} ({len(whole_text.split())} words)"
    )
    assert abs(wer(truth, text) - wer(truth, whole_text)) <= 0.01
    assert abs(len(text.split()) - len(whole_text.split())) <= 0.01 * len(whole_text.split())
    verbose = api_get(live_api, f"/v1/jobs/{job['id']}/transcript?format=verbose_json").json()
    starts = [s["start"] for s in verbose["segments"]]
    assert starts == sorted(starts) and verbose["duration"] == pytest.approx(
        job["duration_seconds"]
    )
    assert [s["id"] for s in verbose["segments"]] == list(range(len(starts)))
    srt = api_get(live_api, f"/v1/jobs/{job['id']}/transcript?format=srt").text
    assert srt.startswith("1\n00:00:0")


def test_a_parts_worker_killed_mid_way_costs_that_part_alone(
    live_api: LiveApi, start_worker: Any, long_file: Path, whole_text: str
) -> None:
    (victim, victim_proc), (survivor, _) = two_workers(start_worker)
    job = upload(live_api, long_file)

    def victim_part() -> JobPart | None:
        running = [r for r in part_rows(live_api, job["id"]) if r.status == "running"]
        return next((r for r in running if r.worker_id == victim.id), None)

    held = wait_for(victim_part, 120, "the victim to start a part", step=0.2)
    os.kill(victim_proc.popen.pid, signal.SIGKILL)
    victim_proc.popen.wait(30)
    # The fleet declares it dead (no heartbeat) and applies that: its parts are sent again.
    svc: Services = live_api_services(live_api)
    with live_api.db.session() as s:
        move_worker(s, victim.id, [WorkerState.READY], WorkerState.DELETING)
    resend_parts_of(svc, victim.id)

    done = finished(live_api, job["id"])
    assert done["status"] == "succeeded", done
    rows = part_rows(live_api, job["id"])
    retried = next(r for r in rows if r.id == held.id)
    assert retried.attempts == 2 and retried.worker_id == survivor.id
    assert all(r.attempts == 1 for r in rows if r.id != held.id)
    text = done["text"]
    assert abs(len(text.split()) - len(whole_text.split())) <= 0.01 * len(whole_text.split())
    assert abs(wer(reference(), text) - wer(reference(), whole_text)) <= 0.01


def live_api_services(live: LiveApi) -> Services:
    return build_services(live.settings, make_celery(live.settings), db=live.db)


def test_cancel_during_parts_frees_every_parts_worker(
    live_api: LiveApi, start_worker: Any, long_file: Path
) -> None:
    workers = list(two_workers(start_worker))
    job = upload(live_api, long_file)

    def both_running() -> bool:
        running = {r.worker_id for r in part_rows(live_api, job["id"]) if r.status == "running"}
        return running == {w.id for w, _ in workers}

    wait_for(both_running, 120, "both workers to run a part", step=0.2)
    time.sleep(2.0)  # under way: past the claim, into the audio
    answer = requests.delete(f"{live_api.url}/v1/jobs/{job['id']}", headers=auth(), timeout=10)
    assert answer.status_code == 200 and answer.json()["status"] == "cancelled"

    def all_free() -> bool:
        with live_api.db.reader() as s:
            rows = [s.get(Worker, w.id) for w, _ in workers]
        return all(r is not None and r.current_job_id is None for r in rows)

    wait_for(all_free, 60, "every part's worker to stop", step=0.2)
    for _, proc in workers:
        # Stopped at its next status check; or, on a machine slow enough that it was still
        # downloading, refused the audio (410: its claim no longer holds the part).
        assert "stopped without a result" in proc.output() or "answered 410" in proc.output()
    rows = part_rows(live_api, job["id"])
    assert {r.status for r in rows} == {"cancelled"}
    assert all(r.transcript is None for r in rows)
    # The parts' messages left on the queue are taken and dropped: nothing runs again.
    shown = api_get(live_api, f"/v1/jobs/{job['id']}").json()
    assert shown["status"] == "cancelled" and shown["parts"]["running"] == 0
