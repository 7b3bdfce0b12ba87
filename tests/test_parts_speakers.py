"""A diarized long job's parts (issue 34, point 3): cut like any job, with one more part, of kind
`speakers`, that diarizes the whole file while the others transcribe their spans without
speakers; the stitch assigns the joined words to its turns, so a voice keeps one label across
every seam. Through the workers' side door, with the worker's part played by the test (the real
stage runs in tests/whisperx/test_whisperx_diarize_parts.py)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis

from app.config import Settings
from app.db import Database
from app.jobs import parts
from app.jobs.stitch import with_speakers
from app.models import JobPart, WorkerState
from gpu_worker import parts as worker_parts
from gpu_worker.protocol.claim import PARTS, SPEAKER_PARTS
from gpu_worker.speakers import SpeakerTurn
from tests.conftest import REDIS_URL, add_worker, auth, make_settings
from tests.test_openai_diarized import PROFILES
from tests.test_parts import SPEECH, call, words_of

QUEUE = "transcribe.speakers"
# Who speaks when in the test's transcript: one voice until HALF, the other after it.
HALF = 45.0


@pytest.fixture()
def settings(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Settings:
    config = tmp_path / "profiles.toml"
    config.write_text(PROFILES)  # "plain", and "speakers" that diarizes
    return make_settings(
        database_url, REDIS_URL, tmp_path, MURMUR_CONFIG=str(config), MURMUR_PART_SECONDS="30"
    )


def ready(db: Database, features: list[str]) -> Any:
    worker = add_worker(db, "speakers", state=WorkerState.READY)
    with db.session() as s:
        row = s.get(type(worker), worker.id)
        assert row is not None
        row.runtime = {"features": features}
    return worker


def submit(client: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/jobs",
        data={
            "file": (io.BytesIO(SPEECH), "meeting.wav"),
            "diarize": "true",
            "word_timestamps": "true",
        },
        headers=auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202, response.get_json()
    return dict(response.get_json())


def sent(r: redis.Redis) -> list[str]:
    """The ids on the profile's queue, in the order workers take them (kombu pushes left,
    workers pop right)."""
    raw = reversed(r.lrange(QUEUE, 0, -1))
    return [json.loads(base64.b64decode(json.loads(m)["body"]))[0][0] for m in raw]


def test_a_diarized_long_job_is_cut_with_a_speakers_part_sent_first(
    client: Any, db: Database, clean_redis: redis.Redis
) -> None:
    ready(db, [PARTS, SPEAKER_PARTS])
    job = submit(client)
    shown = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert shown["parts"] == {"count": 4, "done": 0, "running": 0}
    with db.reader() as s:
        rows = s.query(JobPart).filter(JobPart.job_id == job["id"]).order_by(JobPart.index).all()
        kinds = [(p.index, p.kind, p.start_seconds, p.end_seconds) for p in rows]
    assert [k[1] for k in kinds] == ["transcribe"] * 3 + ["speakers"]
    assert kinds[3][2:] == (0.0, job["duration_seconds"])  # the whole file
    # The speakers part first: the longest, it would end last if it started last.
    assert sent(clean_redis) == [parts.part_id(job["id"], i) for i in (3, 0, 1, 2)]


def test_only_a_worker_that_runs_speakers_parts_gets_one_and_it_diarizes_the_whole_file(
    client: Any, db: Database
) -> None:
    older = ready(db, [PARTS])
    newer = ready(db, [PARTS, SPEAKER_PARTS])
    job = submit(client)
    speakers = parts.part_id(job["id"], 3)
    refused = call(client, older, f"/jobs/{speakers}/claim")
    assert refused.status_code == 409
    # The older worker still transcribes a span, without speakers.
    span = call(client, older, f"/jobs/{parts.part_id(job['id'], 0)}/claim").get_json()["job"]
    assert span["diarize"] is False and span["part"]["kind"] == "transcribe"
    claimed = call(client, newer, f"/jobs/{speakers}/claim").get_json()["job"]
    assert claimed["diarize"] is True and claimed["part"]["kind"] == "speakers"
    assert claimed["part"]["offset_seconds"] == 0.0
    assert claimed["part"]["until_seconds"] == job["duration_seconds"]
    assert claimed["min_speakers"] is None and claimed["prompt"] is None


def speakers_result(duration: float) -> dict[str, Any]:
    turns = [
        {"start": 0.0, "end": HALF, "speaker": "SPEAKER_00"},
        {"start": HALF, "end": duration, "speaker": "SPEAKER_01"},
    ]
    transcript = {"text": "", "duration": duration, "segments": [], "turns": turns}
    return {"transcript": transcript, "processing_seconds": 2.0}


def shown(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    return dict(client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json())


@pytest.mark.parametrize("speakers_first", [True, False])
def test_the_joined_words_get_the_speakers_parts_labels_across_every_seam(
    client: Any, db: Database, clean_redis: redis.Redis, speakers_first: bool
) -> None:
    worker = ready(db, [PARTS, SPEAKER_PARTS])
    job = submit(client)
    ids = [parts.part_id(job["id"], i) for i in range(4)]

    def speakers() -> None:
        call(client, worker, f"/jobs/{ids[3]}/claim")
        body = speakers_result(job["duration_seconds"])
        assert call(client, worker, f"/jobs/{ids[3]}/result", body).get_json() == {"stored": True}

    if speakers_first:
        speakers()
        waiting = shown(client, job)
        assert waiting["status"] == "running" and waiting["parts"]["done"] == 1
        assert not waiting.get("progress")  # its audio is the transcription parts'
    for n in range(3):
        claimed = call(client, worker, f"/jobs/{ids[n]}/claim").get_json()["job"]
        span = (claimed["part"]["offset_seconds"], claimed["part"]["until_seconds"])
        body = {"transcript": words_of(span, span[1], "w"), "processing_seconds": 1.0}
        assert call(client, worker, f"/jobs/{ids[n]}/result", body).get_json() == {"stored": True}
    if not speakers_first:  # every word is in; the job waits for its speakers
        waiting = shown(client, job)
        assert waiting["status"] == "running"
        assert waiting["parts"] == {"count": 4, "done": 3, "running": 0}
        speakers()

    done = client.get(f"/v1/jobs/{job['id']}", headers=auth()).get_json()
    assert done["status"] == "succeeded", done
    body = client.get(
        f"/v1/jobs/{job['id']}/transcript?format=verbose_json", headers=auth()
    ).get_json()
    assert body["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
    words = body["words"]
    assert len(words) >= int(job["duration_seconds"]) - 2  # a word a second, none lost
    for segment in body["segments"]:  # no segment mixes two voices
        inside = [w for w in words if segment["start"] <= w["start"] < segment["end"]]
        assert inside and {w["speaker"] for w in inside} == {segment["speaker"]}
    for word in words:
        assert word["speaker"] == ("SPEAKER_00" if word["end"] <= HALF else "SPEAKER_01"), word
    # The seams (30 s and 60 s) are inside one voice's turn: the words either side agree.
    seam_words = [w for w in words if 25 < w["start"] < 35]
    assert {w["speaker"] for w in seam_words} == {"SPEAKER_00"}
    texts = [w["word"] for w in words]
    assert len(texts) == len(set(texts))  # the overlaps heard twice are kept once
    vtt = client.get(f"/v1/jobs/{job['id']}/transcript?format=vtt", headers=auth()).text
    voices = [line.split(">")[0] for line in vtt.splitlines() if line.startswith("<v ")]
    assert voices[0] == "<v SPEAKER_00" and voices[-1] == "<v SPEAKER_01"
    assert voices == sorted(voices)  # one change of voice, at HALF


def test_a_speakers_parts_turns_are_shifted_and_numbered_by_first_appearance() -> None:
    found = [
        SpeakerTurn(4.0, 6.0, "SPEAKER_07"),
        SpeakerTurn(0.5, 3.0, "SPEAKER_03"),
        SpeakerTurn(7.0, 9.0, "SPEAKER_03"),
    ]
    turns = worker_parts.labelled_turns(found, 10.0)
    assert [(t.start, t.end, t.speaker) for t in turns] == [
        (10.5, 13.0, "SPEAKER_00"),
        (14.0, 16.0, "SPEAKER_01"),
        (17.0, 19.0, "SPEAKER_00"),
    ]


def test_a_stitched_transcript_with_no_turns_has_no_speakers_as_a_whole_job() -> None:
    stitched = words_of((0.0, 5.0), 5.0, "w")
    labelled = with_speakers(stitched, [])
    assert labelled["speakers"] == [] and labelled["text"] == stitched["text"]
    assert all("speaker" not in s for s in labelled["segments"])
