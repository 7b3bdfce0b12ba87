"""A long job's parts through the workers' side door (app/jobs/parts.py, app/internal.py): cut at
upload, one message each, claimed by several workers at once, a part's failure retried alone,
results stored once and stitched when the last is in, cancel frees every part's holder, and a
worker that does not list the `parts` feature never gets one."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy.orm import undefer

from app.celery_config import make_celery
from app.config import Settings
from app.credentials import InstanceCredential
from app.db import Database
from app.jobs import fetch, parts, progress, service
from app.jobs.io_slots import IoSlots
from app.jobs.service import JobRequest
from app.models import Job, JobPart, Worker, WorkerState, utcnow
from app.services import build_services
from gpu_worker.protocol.claim import PARTS
from tests.conftest import FIXTURES, REDIS_URL, SIGNING_KEY, add_worker, auth, make_settings
from tests.serving import serving_audio

SPEECH = (FIXTURES / "speech-90s.wav").read_bytes()
QUEUE = "transcribe.local-cpu"


@pytest.fixture()
def settings(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Settings:
    # Private URLs: the URL job's audio is served on loopback.
    return make_settings(
        database_url, REDIS_URL, tmp_path, MURMUR_PART_SECONDS="30", MURMUR_ALLOW_PRIVATE_URLS="1"
    )


def ready_worker(db: Database, *, features: list[str] | None = None) -> Worker:
    worker = add_worker(db, state=WorkerState.READY)
    with db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None
        row.runtime = {"features": [PARTS] if features is None else features}
    return worker


def call(client: Any, worker: Worker, path: str, body: dict[str, Any] | None = None) -> Any:
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, worker.instance_id or "").token
    return client.post(
        f"/internal/workers/{worker.id}/{worker.instance_id}{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {token}"},
    )


def submit(client: Any, **fields: str) -> dict[str, Any]:
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO(SPEECH), "long.wav"), **fields},
        headers=auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.get_json()
    return dict(response.get_json())


def queued_ids(r: redis.Redis) -> list[str]:
    ids = []
    for raw in r.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        ids.append(json.loads(base64.b64decode(message["body"]))[0][0])
    return sorted(ids)


def words_of(span: tuple[float, float], until: float, text: str) -> dict[str, Any]:
    """A part's transcript as a worker gives it: the file's words (one a second, at k + 0.2 s)
    from the span's start to `until` (the overlap included), times of the whole file."""
    words: list[dict[str, Any]] = []
    k = int(span[0]) if span[0] <= int(span[0]) + 0.2 else int(span[0]) + 1
    while k + 0.7 < until:
        words.append({"word": f" {text}{k}", "start": k + 0.2, "end": k + 0.7})
        k += 1
    text = "".join(str(w["word"]) for w in words)
    segment = {"start": words[0]["start"], "end": words[-1]["end"], "text": text, "words": words}
    return {"text": text.strip(), "language": "en", "language_probability": 0.9,
            "duration": until - span[0], "segments": [segment]}  # fmt: skip


def test_a_long_upload_is_cut_into_parts_each_its_own_message(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    ready_worker(db)
    job = submit(client)
    assert job["status"] == "dispatched"
    shown = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert shown["parts"] == {"count": 3, "done": 0, "running": 0}
    with db.reader() as s:
        rows = s.query(JobPart).filter(JobPart.job_id == job["id"]).order_by(JobPart.index).all()
        spans = [(p.start_seconds, p.end_seconds) for p in rows]
    assert spans[0][0] == 0.0 and abs(spans[-1][1] - job["duration_seconds"]) < 1e-6
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert queued_ids(clean_redis) == [parts.part_id(job["id"], i) for i in range(3)]
    # A short upload is not cut.
    short = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO((FIXTURES / "speech-short.wav").read_bytes()), "s.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    ).get_json()
    assert "parts" not in client.get(f"/v1/jobs/{short['id']}", headers=auth()).get_json()


@pytest.mark.parametrize("diarize", [False, True])
def test_a_long_url_job_is_cut_once_its_audio_is_fetched(
    settings: Settings, db: Database, clean_redis: redis.Redis, diarize: bool
) -> None:
    """A URL job is cut like an upload, when its fetch has the file; a diarized one has its
    speakers part besides (tests/test_parts_speakers.py)."""
    svc = build_services(settings, make_celery(settings), db=db)
    try:
        with serving_audio(SPEECH, "long.wav") as url:
            req = JobRequest(owner="owner", source="url", source_url=url, diarize=diarize)
            job, _ = service.insert_job(db, req, now=utcnow())
            ready_worker(db)
            fetch.fetch_audio(svc, IoSlots(clean_redis, settings.io), job.id)
            fetch.fetch_audio(svc, IoSlots(clean_redis, settings.io), job.id)  # a redelivery
    finally:
        svc.celery.close()
    with db.reader() as s:
        stored = s.get(Job, job.id)
        assert stored is not None and stored.audio_key is not None
        cut = s.query(JobPart).filter(JobPart.job_id == job.id).order_by(JobPart.index).all()
    if diarize:  # this test's profile does not diarize: it waits, cut, for one that does
        assert [(p.index, p.kind) for p in cut][-2:] == [(2, "transcribe"), (3, "speakers")]
        assert stored.status == "queued" and queued_ids(clean_redis) == []
        return
    assert stored.status == "dispatched"
    assert [p.index for p in cut] == [0, 1, 2]
    assert cut[0].start_seconds == 0.0 and cut[-1].end_seconds == stored.duration_seconds
    assert queued_ids(clean_redis) == [parts.part_id(job.id, i) for i in range(3)]


def test_parts_run_on_several_workers_and_are_stitched_once_when_the_last_is_in(
    client: Any, db: Database
) -> None:
    first, second = ready_worker(db), ready_worker(db)
    job = submit(client, prompt="Glossary: Murmur.")
    ids = [parts.part_id(job["id"], i) for i in range(3)]
    a = call(client, first, f"/jobs/{ids[0]}/claim").get_json()["job"]
    b = call(client, second, f"/jobs/{ids[1]}/claim").get_json()["job"]
    # Both run at once; the job is running with no single worker of its own.
    shown = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert shown["status"] == "running" and shown["parts"]["running"] == 2
    assert a["prompt"] == "Glossary: Murmur." and b["prompt"] is None
    assert a["part"]["offset_seconds"] == 0.0 and a["part"]["count"] == 3
    assert b["part"]["offset_seconds"] == a["part"]["until_seconds"] - 2.0  # the overlap
    # One part runs on one worker at a time.
    assert call(client, first, f"/jobs/{ids[1]}/claim").status_code == 409
    assert call(client, second, f"/jobs/{ids[0]}/status").get_json() == {"held": False}
    assert call(client, first, f"/jobs/{ids[0]}/status").get_json() == {"held": True}

    def result(worker: Worker, claimed: dict[str, Any], n: int) -> Any:
        span = (claimed["part"]["offset_seconds"], claimed["part"]["until_seconds"])
        body = {"transcript": words_of(span, span[1], "w"), "processing_seconds": 1.0}
        return call(client, worker, f"/jobs/{ids[n]}/result", body).get_json()

    assert result(first, a, 0) == {"stored": True}
    assert result(first, a, 0) == {"stored": False}  # a redelivered result
    assert result(second, b, 1) == {"stored": True}
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()["status"] == "running"
    c = call(client, first, f"/jobs/{ids[2]}/claim").get_json()["job"]
    assert result(first, c, 2) == {"stored": True}
    done = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert done["status"] == "succeeded"
    assert done["parts"] == {"count": 3, "done": 3, "running": 0}
    words = done["text"].split()
    assert len(words) == len(set(words))  # the overlaps heard twice are kept once
    seconds = [int(w[1:]) for w in words]
    assert seconds == sorted(seconds) and seconds[0] == 0
    assert seconds[-1] >= int(job["duration_seconds"]) - 2
    transcript = client.get(
        f"/v1/jobs/{job['id']}/transcript?format=verbose_json", headers=auth()
    ).get_json()
    starts = [s["start"] for s in transcript["segments"]]
    assert starts == sorted(starts) and transcript["language"] == "en"
    with db.reader() as s:
        counted = s.get(Worker, first.id)
        assert counted is not None and counted.jobs_done == 2 and counted.current_job_id is None
        kept = (
            s.query(JobPart)
            .filter(JobPart.job_id == job["id"])
            .options(undefer(JobPart.transcript))
        )
        assert all(p.transcript is None for p in kept)  # stitched: not kept twice
    # Purging the job takes its parts with it.
    assert client.delete(f"/v1/jobs/{job['id']}?purge=true", headers=auth()).status_code == 204
    with db.reader() as s:
        assert s.query(JobPart).filter(JobPart.job_id == job["id"]).count() == 0


def test_a_parts_failure_retries_that_part_not_the_job(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    first, second = ready_worker(db), ready_worker(db)
    job = submit(client)
    pid = parts.part_id(job["id"], 1)
    clean_redis.delete(QUEUE)
    assert call(client, first, f"/jobs/{pid}/claim").status_code == 200
    failed = call(client, first, f"/jobs/{pid}/failure", {"code": "worker_error", "message": "x"})
    assert failed.get_json() == {"stored": True}
    assert queued_ids(clean_redis) == [pid]  # sent again, alone
    shown = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert shown["status"] == "running" and shown["error"] is None
    with db.reader() as s:
        assert s.get(Worker, first.id).current_job_id is None  # type: ignore[union-attr]
    # The next claims use up fleet.max_attempts (3); the third failure fails the job.
    for holder in (second, first):
        assert call(client, holder, f"/jobs/{pid}/claim").status_code == 200
        call(
            client, holder, f"/jobs/{pid}/failure", {"code": "transcription_failed", "message": "y"}
        )
    ended = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert ended["status"] == "failed"
    assert ended["error"]["code"] == "transcription_failed"
    assert ended["error"]["message"].startswith("part 1: ")
    other = parts.part_id(job["id"], 0)
    assert call(client, second, f"/jobs/{other}/claim").status_code == 409


def test_a_failure_caused_by_the_audio_fails_the_job_at_once(client: Any, db: Database) -> None:
    worker = ready_worker(db)
    job = submit(client)
    pid = parts.part_id(job["id"], 2)
    call(client, worker, f"/jobs/{pid}/claim")
    body = {"code": "audio_decode_failed", "message": "bad"}
    assert call(client, worker, f"/jobs/{pid}/failure", body).get_json() == {"stored": True}
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()["status"] == "failed"


def test_cancel_frees_every_parts_worker(client: Any, db: Database) -> None:
    first, second = ready_worker(db), ready_worker(db)
    job = submit(client)
    ids = [parts.part_id(job["id"], i) for i in range(3)]
    call(client, first, f"/jobs/{ids[0]}/claim")
    call(client, second, f"/jobs/{ids[1]}/claim")
    assert client.delete(f"/v1/jobs/{job['id']}", headers=auth()).status_code == 200
    for worker, pid in ((first, ids[0]), (second, ids[1])):
        assert call(client, worker, f"/jobs/{pid}/status").get_json() == {"held": False}
        stopped = {"code": "cancelled", "message": "stopped"}
        assert call(client, worker, f"/jobs/{pid}/failure", stopped).get_json() == {"stored": False}
    with db.reader() as s:
        for worker in (first, second):
            assert s.get(Worker, worker.id).current_job_id is None  # type: ignore[union-attr]
        statuses = {p.status for p in s.query(JobPart).filter(JobPart.job_id == job["id"])}
    assert statuses == {"cancelled"}
    assert call(client, first, f"/jobs/{ids[2]}/claim").status_code == 409


def test_a_worker_without_the_parts_feature_never_gets_a_part(client: Any, db: Database) -> None:
    ready_worker(db)
    old = ready_worker(db, features=[])
    job = submit(client)
    refused = call(client, old, f"/jobs/{parts.part_id(job['id'], 0)}/claim")
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "job_not_claimable"


def test_a_parts_audio_url_serves_only_its_claim(client: Any, db: Database) -> None:
    worker = ready_worker(db)
    job = submit(client)
    pid = parts.part_id(job["id"], 0)
    claimed = call(client, worker, f"/jobs/{pid}/claim").get_json()["job"]
    url = claimed["audio_url"].split("127.0.0.1:8000", 1)[-1]
    assert client.get(url).data == SPEECH
    call(client, worker, f"/jobs/{pid}/release")
    gone = client.get(url)
    assert gone.status_code == 410 and gone.get_json()["error"]["code"] == "audio_url_expired"


def test_a_dead_holders_parts_are_sent_again(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    dead, other = ready_worker(db), ready_worker(db)
    job = submit(client)
    pid = parts.part_id(job["id"], 1)
    call(client, dead, f"/jobs/{pid}/claim")
    assert parts.held_parts(db, dead.id, now=utcnow()) == [pid]
    assert call(client, other, f"/jobs/{pid}/claim").status_code == 200
    with db.reader() as s:
        part = s.get(JobPart, pid)
        assert part is not None and part.worker_id == other.id and part.attempts == 2
        assert s.get(Job, job["id"]).status == "running"  # type: ignore[union-attr]


def test_parts_progress_counts_every_parts_audio_towards_the_job(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    first, second, stranger = ready_worker(db), ready_worker(db), ready_worker(db)
    job = submit(client)
    total = job["duration_seconds"]
    ids = [parts.part_id(job["id"], i) for i in range(3)]
    a = call(client, first, f"/jobs/{ids[0]}/claim").get_json()["job"]
    call(client, second, f"/jobs/{ids[1]}/claim")

    def report(worker: Worker, n: int, seq: int, done: float) -> Any:
        body = {"seq": seq, "done_seconds": done, "total_seconds": 32.0, "segments": []}
        return call(client, worker, f"/jobs/{ids[n]}/progress", body).get_json()

    def shown() -> float:
        body = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
        return float(body["progress"])

    assert report(first, 0, 1, 10.0) == {"accepted": True}
    assert shown() == pytest.approx(10.0 / total, abs=1e-3)
    assert report(second, 1, 1, 5.0) == {"accepted": True}
    assert shown() == pytest.approx(15.0 / total, abs=1e-3)  # the parts running at once add up
    assert report(stranger, 0, 2, 30.0) == {"accepted": False}  # not its part
    assert report(first, 0, 1, 20.0) == {"accepted": True}  # a retried report counts once
    assert shown() == pytest.approx(15.0 / total, abs=1e-3)
    span = a["part"]["until_seconds"] - a["part"]["offset_seconds"]
    body = {"transcript": words_of((0.0, span), span, "w"), "processing_seconds": 1.0}
    assert call(client, first, f"/jobs/{ids[0]}/result", body).get_json() == {"stored": True}
    with db.reader() as s:
        part = s.get(JobPart, ids[0])
        assert part is not None
        whole = part.end_seconds - part.start_seconds
    # A finished part counts whole; a late report of it changes nothing.
    assert shown() == pytest.approx((whole + 5.0) / total, abs=1e-3)
    assert report(first, 0, 9, 1.0) == {"accepted": False}
    events = progress.events_after(clean_redis, job["id"])
    assert [e.type for e in events].count("attempt") == 1  # the parts are the job's one attempt
    values = [e.data["progress"] for e in events if e.type == "progress"]
    assert len(values) == 3 and values == sorted(values)  # each applied report, the end
    # A running part's segments are not streamed; the first part's are, once it is in.
    (streamed,) = progress.current_segments(events)
    assert streamed["id"] == 0 and streamed["text"].startswith(" w0")
    assert all(w["start"] < whole for w in streamed["words"])  # its overlap is the next's


def test_parts_segments_are_streamed_in_order_as_they_become_final(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    worker = ready_worker(db)
    job = submit(client)
    ids = [parts.part_id(job["id"], i) for i in range(3)]
    claims = [call(client, worker, f"/jobs/{pid}/claim").get_json()["job"] for pid in ids]

    def finish(n: int) -> list[str]:
        span = (claims[n]["part"]["offset_seconds"], claims[n]["part"]["until_seconds"])
        body = {"transcript": words_of(span, span[1], "w"), "processing_seconds": 1.0}
        assert call(client, worker, f"/jobs/{ids[n]}/result", body).get_json() == {"stored": True}
        events = progress.events_after(clean_redis, job["id"], count=100_000)
        return [s["text"] for s in progress.current_segments(events)]

    assert finish(1) == []  # the first part is not in: nothing is final yet
    after_first = finish(0)  # the first two are: both parts' segments, in order
    assert len(after_first) == 2
    assert finish(2)[:2] == after_first  # never revised, only extended
    final = client.get(
        f"/v1/jobs/{job['id']}/transcript?format=verbose_json", headers=auth()
    ).get_json()["segments"]
    events = progress.events_after(clean_redis, job["id"], count=100_000)
    live = progress.current_segments(events)
    assert [(s["id"], s["text"]) for s in live] == [(s["id"], s["text"]) for s in final]
    # A second publisher with fewer segments (a result answered twice) streams nothing twice.
    assert progress.publish_segments(clean_redis, job["id"], live[:1]) == len(live)
    again = progress.current_segments(progress.events_after(clean_redis, job["id"]))
    assert len(again) == len(live)


def test_a_redis_error_on_a_parts_progress_never_loses_its_result(
    client: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = ready_worker(db)
    job = submit(client)
    ids = [parts.part_id(job["id"], i) for i in range(3)]

    def broken(*_: Any, **__: Any) -> Any:
        raise redis.ConnectionError("redis went away")

    monkeypatch.setattr(progress, "report_part", broken)
    for pid in ids:  # the live view fails; the results, the stitch and the job do not
        claimed = call(client, worker, f"/jobs/{pid}/claim").get_json()["job"]
        span = (claimed["part"]["offset_seconds"], claimed["part"]["until_seconds"])
        body = {"transcript": words_of(span, span[1], "w"), "processing_seconds": 1.0}
        assert call(client, worker, f"/jobs/{pid}/result", body).get_json() == {"stored": True}
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()["status"] == "succeeded"
