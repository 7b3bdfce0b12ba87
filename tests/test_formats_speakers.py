"""A diarized transcript in every format: speaker labels around the text, OpenAI's diarized_json.

The transcripts are built by the worker's own code (gpu_worker/speakers.py) and stored as the
control plane stores them (`model_dump(exclude_none=True)`), then rendered by app/jobs/formats.py.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from app.jobs.formats import render, to_diarized_json
from gpu_worker.protocol.transcript import Segment, Transcript, Word
from gpu_worker.speakers import SpeakerTurn, assign_speakers

# OpenAI's CreateTranscriptionResponseDiarizedJson and the two schemas it references, copied
# from openai/openai-openapi, openapi.yaml at f85dbe223d40e1a31cba812ab2d755c7e98a92a3
# (2026-08-21); descriptions and examples dropped, nothing else changed.
DIARIZED_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "enum": ["transcribe"]},
        "duration": {"type": "number"},
        "text": {"type": "string"},
        "segments": {"type": "array", "items": {"$ref": "#/$defs/TranscriptionDiarizedSegment"}},
        "usage": {
            "type": "object",
            "oneOf": [
                {"$ref": "#/$defs/TranscriptTextUsageTokens"},
                {"$ref": "#/$defs/TranscriptTextUsageDuration"},
            ],
        },
    },
    "required": ["task", "duration", "text", "segments"],
    "$defs": {
        "TranscriptionDiarizedSegment": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["transcript.text.segment"]},
                "id": {"type": "string"},
                "start": {"type": "number"},
                "end": {"type": "number"},
                "text": {"type": "string"},
                "speaker": {"type": "string"},
            },
            "required": ["type", "id", "start", "end", "text", "speaker"],
        },
        "TranscriptTextUsageDuration": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["duration"]},
                "seconds": {"type": "number"},
            },
            "required": ["type", "seconds"],
        },
        "TranscriptTextUsageTokens": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["tokens"]},
                "input_tokens": {"type": "integer"},
                "output_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
            },
            "required": ["type", "input_tokens", "output_tokens", "total_tokens"],
        },
    },
}


def _stored(transcript: Transcript) -> dict[str, Any]:
    return transcript.model_dump(exclude_none=True)


@pytest.fixture
def diarized() -> dict[str, Any]:
    segments = [
        Segment(
            id=0,
            start=0.0,
            end=2.0,
            text=" Good morning.",
            words=[
                Word(word=" Good", start=0.0, end=0.8),
                Word(word=" morning.", start=0.9, end=2.0),
            ],
        ),
        Segment(id=1, start=2.5, end=4.0, text=" Can we talk?"),
        Segment(id=2, start=4.5, end=6.0, text=" Of course."),
    ]
    transcript = Transcript(
        text="Good morning. Can we talk? Of course.", duration=6.5, segments=segments
    )
    turns = [SpeakerTurn(0.0, 4.1, "b"), SpeakerTurn(4.4, 6.2, "a")]
    return _stored(assign_speakers(transcript, turns))


def test_vtt_wraps_each_cue_in_a_voice_span(diarized):
    body, _ = render(diarized, "vtt")
    assert body.startswith("WEBVTT\n")
    assert "00:00:00.000 --> 00:00:02.000\n<v SPEAKER_00>Good morning.\n" in body
    assert "00:00:04.500 --> 00:00:06.000\n<v SPEAKER_01>Of course.\n" in body


def test_srt_prefixes_each_cue_with_its_speaker(diarized):
    body, _ = render(diarized, "srt")
    assert "1\n00:00:00,000 --> 00:00:02,000\nSPEAKER_00: Good morning.\n" in body
    assert "3\n00:00:04,500 --> 00:00:06,000\nSPEAKER_01: Of course.\n" in body


@pytest.mark.parametrize("fmt", ["txt", "text"])
def test_txt_has_one_line_per_change_of_speaker(diarized, fmt):
    body, _ = render(diarized, fmt)
    assert body == "SPEAKER_00: Good morning. Can we talk?\nSPEAKER_01: Of course.\n"


def test_json_and_verbose_json_carry_the_speakers(diarized):
    body = json.loads(render(diarized, "json")[0])
    assert body["text"] == "Good morning. Can we talk? Of course."
    assert body["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
    assert [s["speaker"] for s in body["segments"]] == ["SPEAKER_00", "SPEAKER_00", "SPEAKER_01"]

    verbose = json.loads(render(diarized, "verbose_json")[0])
    assert verbose["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
    assert [s["speaker"] for s in verbose["segments"]] == [
        "SPEAKER_00",
        "SPEAKER_00",
        "SPEAKER_01",
    ]
    assert [w["speaker"] for w in verbose["words"]] == ["SPEAKER_00", "SPEAKER_00"]


def test_diarized_json_validates_against_openais_schema(diarized):
    body = to_diarized_json(diarized)
    jsonschema_rs.validate(DIARIZED_JSON_SCHEMA, body)
    assert body["task"] == "transcribe" and body["duration"] == 6.5
    assert body["text"] == diarized["text"]
    assert [(s["id"], s["speaker"], s["text"]) for s in body["segments"]] == [
        ("seg_000", "SPEAKER_00", " Good morning."),
        ("seg_001", "SPEAKER_00", " Can we talk?"),
        ("seg_002", "SPEAKER_01", " Of course."),
    ]
    assert body["usage"] == {"type": "duration", "seconds": 6}


def test_a_transcript_without_speakers_renders_as_before():
    plain = _stored(
        Transcript(text="Hello.", duration=1.0, segments=[Segment(start=0, end=1, text=" Hello.")])
    )
    assert render(plain, "json")[0] == '{"text": "Hello."}'
    assert render(plain, "txt")[0] == "Hello.\n"
    assert render(plain, "srt")[0] == "1\n00:00:00,000 --> 00:00:01,000\nHello.\n"
    assert render(plain, "vtt")[0] == "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\nHello.\n"
    verbose = json.loads(render(plain, "verbose_json")[0])
    assert "speakers" not in verbose and "speaker" not in verbose["segments"][0]


def test_a_stored_label_outside_the_protocol_is_not_rendered(diarized):
    # A row written by hand (or by a bug) cannot inject markup through the speaker field.
    diarized["segments"][0]["speaker"] = "</v><script>"
    for word in diarized["segments"][0]["words"]:
        word["speaker"] = "</v><script>"
    body, _ = render(diarized, "vtt")
    assert "<script>" not in body
    assert "00:00:00.000 --> 00:00:02.000\nGood morning.\n" in body
