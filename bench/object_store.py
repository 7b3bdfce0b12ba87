"""The s3 audio store: a two-host drill, and what it saves the API on a large upload.

    .venv/bin/python bench/object_store.py [--smoke] [--mb 100] [--jobs 10] [--keep]

Starts its own S3-compatible server (moto's, tests/s3_server.py) and two API processes under
gunicorn, "host A" and "host B": each has its own storage directory (as two hosts have two
disks), both share the database (a SQLite file) and Redis (MURMUR_BENCH_REDIS_URL).

1. Drill, once with the local store and once with the s3 store: jobs are uploaded to A;
   workers talk to B only (claim, fetch the audio from the URL the claim hands them, post a
   result); every job is then purged through B. Expected: with s3 every job succeeds exactly
   once and every object is gone after the purge; with the local store every fetch is refused
   `audio_not_found` (the audio is on A's disk) -- why the s3 store exists.
2. Large upload, local vs s3, one host: one upload of `--mb` MB (api.max_upload_bytes is raised
   to fit it), claimed and fetched by a worker. Figures: bytes the API served to the worker,
   the job's latency (submit -> result stored), and the API workers' peak RSS while it ran.

The workers are the real worker client (gpu_worker/client.py: claim, download, result) and
the real bounded decoder on the fetched bytes; transcription is skipped (it is the same for
both stores and would hide what the store changes). `--smoke`: 3 drill jobs and a 12 MB upload
(still a multipart upload: parts are 8 MiB). Exits non-zero if any expectation fails. Only
127.0.0.1 is ever contacted; every loop is bounded.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import threading
import time
import uuid
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import requests
from _stack import ROOT, TOKEN, bench_env, free_port, gunicorn, temp_dir
from pydantic import SecretStr

from app.credentials import InstanceCredential
from app.db import Database
from app.migrate import upgrade
from app.models import Job, JobStatus, Worker, WorkerState, utcnow
from gpu_worker.audio import decode_bounded
from gpu_worker.client import ControlPlaneClient
from gpu_worker.protocol.transcript import Transcript
from tests.s3_server import S3Server, start_s3_server

SPEECH = (ROOT / "tests" / "fixtures" / "speech-short.wav").read_bytes()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def wav_of(megabytes: int) -> bytes:
    """A valid 16 kHz mono WAV of about `megabytes` MB (speech repeated, then silence)."""
    frames = megabytes * 1_000_000 // 2
    out = io.BytesIO()
    with wave.open(io.BytesIO(SPEECH)) as src:
        speech = src.readframes(src.getnframes())
        rate = src.getframerate()
    with wave.open(out, "wb") as dst:
        dst.setnchannels(1)
        dst.setsampwidth(2)
        dst.setframerate(rate)
        body = (speech * (frames * 2 // len(speech) + 1))[: frames * 2]
        dst.writeframes(body)
    return out.getvalue()


@dataclass
class Host:
    name: str
    url: str
    proc: Any
    storage: Path


@dataclass
class Stack:
    tmp: Path
    env: dict[str, str]
    db: Database
    hosts: list[Host]

    def stop(self) -> None:
        for host in self.hosts:
            if host.proc.poll() is None:
                host.proc.terminate()
                host.proc.wait(20)
        self.db.dispose()


def start_stack(tmp: Path, s3: S3Server | None, bucket: str, hosts: int, max_mb: int) -> Stack:
    db_url = f"sqlite:///{tmp}/murmur.db"
    upgrade(db_url)
    base = bench_env(tmp, 0)
    base["MURMUR_DATABASE_URL"] = db_url
    base["MURMUR_MAX_UPLOAD_BYTES"] = str(max_mb * 1_000_000 + 1_000_000)
    if s3 is not None:
        base.update(s3.env(bucket))
    started = []
    for name in ("A", "B")[:hosts]:
        port = free_port()
        env = {
            **base,
            "MURMUR_STORAGE_PATH": str(tmp / f"host-{name}" / "audio"),
            "MURMUR_PORT": str(port),
            "MURMUR_PUBLIC_URL": f"http://127.0.0.1:{port}",
        }
        proc = gunicorn(
            "app:create_app()", env, port, workers=1, threads=4, log=tmp / f"{name}.log"
        )
        started.append(Host(name, f"http://127.0.0.1:{port}", proc, tmp / f"host-{name}" / "audio"))
    return Stack(tmp, base, Database(db_url), started)


def add_worker(db: Database) -> Worker:
    worker = Worker(
        profile="local-cpu",
        provider="local",
        instance_id=f"inst-{uuid.uuid4().hex[:12]}",
        state=WorkerState.READY.value,
        requested_at=utcnow(),
        created_at=utcnow(),
    )
    with db.session() as s:
        s.add(worker)
    return worker


def worker_client(stack: Stack, host: Host) -> ControlPlaneClient:
    worker = add_worker(stack.db)
    key = stack.env["MURMUR_SIGNING_KEY"]
    cred = InstanceCredential.derive(key, worker.id, worker.instance_id or "")
    return ControlPlaneClient(
        host.url, worker.id, worker.instance_id or "", SecretStr(cred.token), attempts=1
    )


@dataclass
class Run:
    """What one worker run of one job did."""

    fetched_from: str = ""
    bytes: int = 0
    outcome: str = ""


def run_job(client: ControlPlaneClient, api: Host, job_id: str) -> Run:
    """Claim, fetch, decode, report: the worker's path with the transcription left out."""
    run = Run()
    claim = client.claim(job_id)
    if claim is None:
        run.outcome = "not claimable"
        return run
    url = claim.audio_url
    run.fetched_from = "API" if url.startswith(api.url) else urlsplit(url).netloc
    try:
        audio = client.download_audio(url, max_bytes=400_000_000)
    except Exception as exc:  # the worker reports the same: audio_download_failed
        client.post_failure(job_id, "audio_download_failed", str(exc))
        run.outcome = f"failed: {exc}"
        return run
    with audio:
        run.bytes = len(audio.read())
        audio.seek(0)
        samples = decode_bounded(audio, claim.max_audio_seconds or 14400.0)
    transcript = Transcript(text="", duration=len(samples) / 16000, segments=[])
    stored = client.post_result(job_id, transcript, processing_seconds=0.0)
    run.outcome = "succeeded" if stored else "result refused"
    return run


def upload(host: Host, body: bytes) -> str:
    response = requests.post(
        f"{host.url}/v1/jobs", files={"file": ("a.wav", body)}, headers=AUTH, timeout=300
    )
    if response.status_code != 202:
        raise RuntimeError(f"upload to {host.name}: {response.status_code} {response.text[:200]}")
    return str(response.json()["id"])


def jobs_by_status(db: Database, ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    with db.session() as s:
        for job_id in ids:
            job = s.get(Job, job_id)
            status = job.status if job is not None else "purged"
            counts[status] = counts.get(status, 0) + 1
    return counts


def drill(tmp: Path, s3: S3Server | None, jobs: int) -> tuple[list[str], bool]:
    """Jobs to A, workers and purges through B; the table row and whether it went as expected."""
    store = "s3" if s3 is not None else "local"
    bucket = f"drill-{uuid.uuid4().hex[:12]}"
    if s3 is not None:
        s3.make_bucket(bucket)
    stack = start_stack(tmp / f"drill-{store}", s3, bucket, hosts=2, max_mb=1)
    a, b = stack.hosts
    try:
        # Workers first: an upload is dispatched at once only to a profile with a free worker.
        clients = [worker_client(stack, b) for _ in range(jobs + 1)]
        ids = [upload(a, SPEECH) for _ in range(jobs)]
        dispatch_queued(stack, ids)
        runs = [run_job(client, b, job_id) for client, job_id in zip(clients, ids, strict=False)]
        # A redelivered task (a second worker, same job) must not store a second result.
        again = run_job(clients[-1], b, ids[0])
        ended = jobs_by_status(stack.db, ids)
        succeeded = sum(r.outcome == "succeeded" for r in runs)
        not_found = sum("404" in r.outcome for r in runs)
        purged = [
            requests.delete(f"{b.url}/v1/jobs/{i}?purge=true", headers=AUTH, timeout=30)
            for i in ids
        ]
        purge_ok = sum(p.status_code in (200, 204) for p in purged)
        objects = len(s3.keys(bucket)) if s3 is not None else 0
        files = {h.name: sum(1 for p in h.storage.glob("*.audio")) for h in stack.hosts}
        refusal = ""
        if store == "local" and ids:
            # What host B answers the worker's fetch, as the client sees it.
            refusal = _refusal_code(stack, b, ids)
        row = [
            store,
            str(jobs),
            str(succeeded),
            str(ended.get(JobStatus.FAILED.value, 0)),
            str(not_found),
            again.outcome,
            str(purge_ok),
            str(objects),
            f"A {files['A']} / B {files['B']}",
            refusal or "-",
        ]
        if s3 is not None:
            ok = succeeded == jobs and again.outcome == "not claimable" and purge_ok == jobs
            ok = ok and objects == 0 and sum(files.values()) == 0
        else:
            ok = succeeded == 0 and not_found == jobs and refusal == "audio_not_found"
        return row, ok
    finally:
        stack.stop()


def dispatch_queued(stack: Stack, ids: list[str]) -> None:
    """What the reconcile does for the uploads submission left queued (one token's jobs wait
    their fair turn there, docs/fleet.md): dispatch them to the workers' profile."""
    from celery import Celery

    from app.jobs.dispatch import dispatch_job
    from app.models import utcnow

    celery = Celery(broker=stack.env["MURMUR_REDIS_URL"])
    for job_id in ids:
        dispatch_job(stack.db, celery, job_id, "local-cpu", now=utcnow())  # False: dispatched


def _refusal_code(stack: Stack, b: Host, ids: list[str]) -> str:
    """Upload one more job to A, claim it through B and GET its audio URL by hand."""
    client = worker_client(stack, b)
    job_id = upload(stack.hosts[0], SPEECH)
    claim = client.claim(job_id)
    if claim is None:
        return "not claimable"
    response = requests.get(claim.audio_url, timeout=30)
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError):
        return f"HTTP {response.status_code}"


class PeakRss:
    """The largest summed RSS of a gunicorn master's workers, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.master = psutil.Process(pid)
        self.idle = sum(c.memory_info().rss for c in self.master.children())
        self.peak = self.idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            try:
                rss = sum(c.memory_info().rss for c in self.master.children())
            except psutil.Error:
                continue
            self.peak = max(self.peak, rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def large_upload(tmp: Path, s3: S3Server | None, body: bytes) -> tuple[list[str], float, bool]:
    store = "s3" if s3 is not None else "local"
    bucket = f"big-{uuid.uuid4().hex[:12]}"
    if s3 is not None:
        s3.make_bucket(bucket)
    mb = len(body) // 1_000_000
    stack = start_stack(tmp / f"big-{store}", s3, bucket, hosts=1, max_mb=mb)
    (host,) = stack.hosts
    try:
        client = worker_client(stack, host)
        with PeakRss(host.proc.pid) as rss:
            started = time.monotonic()
            job_id = upload(host, body)
            uploaded = time.monotonic() - started
            run = run_job(client, host, job_id)
            latency = time.monotonic() - started
        served = run.bytes if run.fetched_from == "API" else 0
        row = [
            store,
            f"{len(body) / 1e6:.0f} MB",
            f"{served / 1e6:.1f} MB",
            run.fetched_from,
            f"{uploaded:.2f} s",
            f"{latency:.2f} s",
            f"{rss.idle / 2**20:.0f} -> {rss.peak / 2**20:.0f} MiB",
            run.outcome,
        ]
        return row, latency, run.outcome == "succeeded" and run.bytes == len(body)
    finally:
        stack.stop()


def bare_server(tmp: Path, s3: S3Server, body: bytes) -> tuple[float, float]:
    """What the S3 server itself takes to store and serve `body`: the baseline of the s3 row."""
    from boto3.s3.transfer import TransferConfig

    bucket = f"bare-{uuid.uuid4().hex[:12]}"
    s3.make_bucket(bucket)
    path = tmp / "bare.wav"
    path.write_bytes(body)
    client = s3.client()
    chunk = 8 * 1024 * 1024
    config = TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk, max_concurrency=4)
    started = time.monotonic()
    client.upload_file(str(path), bucket, "bare.wav", Config=config)
    put = time.monotonic() - started
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "bare.wav"}, ExpiresIn=60
    )
    started = time.monotonic()
    with requests.get(url, stream=True, timeout=120) as response:
        got = sum(len(c) for c in response.iter_content(256 * 1024))
    get = time.monotonic() - started
    if got != len(body):
        raise RuntimeError(f"the S3 server returned {got} of {len(body)} bytes")
    return put, get


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="3 drill jobs, a 12 MB upload")
    parser.add_argument("--mb", type=int, default=100, help="size of the large upload")
    parser.add_argument("--jobs", type=int, default=10, help="jobs in each drill")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    jobs, mb = (3, 12) if args.smoke else (min(args.jobs, 50), min(args.mb, 400))
    tmp = temp_dir()
    s3 = start_s3_server(tmp / "s3.log")
    ok = True
    try:
        rows = []
        for store in (None, s3):
            row, good = drill(tmp, store, jobs)
            rows.append(row)
            ok &= good
        print("Two-host drill: jobs uploaded to API A; workers and purges through API B\n")
        print(
            table(
                [
                    "store",
                    "jobs",
                    "succeeded",
                    "failed",
                    "fetch 404",
                    "second claim",
                    "purged",
                    "objects left",
                    "files left",
                    "B answers a fetch",
                ],
                rows,
            )
        )
        body = wav_of(mb)
        rows, latencies = [], []
        for store in (None, s3):
            row, latency, good = large_upload(tmp, store, body)
            rows.append(row)
            latencies.append(latency)
            ok &= good
        print(f"\nOne {mb} MB upload, one host: submit -> result stored\n")
        print(
            table(
                [
                    "store",
                    "upload",
                    "API bytes served",
                    "audio fetched from",
                    "upload answered",
                    "job latency",
                    "API RSS idle -> peak",
                    "outcome",
                ],
                rows,
            )
        )
        print(f"\nlatency s3 / local: {latencies[1] / latencies[0]:.2f}")
        put, get = bare_server(tmp, s3, body)
        print(
            f"the S3 server alone, same {mb} MB through boto3 (8 MiB parts, 4 at a time): "
            f"PUT {put:.2f} s, presigned GET {get:.2f} s"
        )
    finally:
        s3.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nOK" if ok else "\nFAILED: an expectation did not hold (see the tables)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
