"""Subtitles cannot be forged from transcript text (issue 21 §4).

Whatever a segment's text holds (blank lines, a timing line, a WebVTT `NOTE`, terminal
escapes, lone CR, U+2028, bidi overrides), `srt` and `vtt` parse, with maintained parsers
from PyPI (`srt`, `webvtt-py`), into exactly one cue per segment at the segment's times, and
`txt` is one line; `json` and `verbose_json` carry the text as stored.
"""

from __future__ import annotations

import io
import json
import re
from datetime import timedelta
from typing import Any

import srt
import webvtt
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.db import Database
from app.jobs.formats import EMPTY_CUE, cue_text, one_line, render, vtt_escape
from gpu_worker.protocol.bounds import MAX_SECONDS
from tests.conftest import add_worker, auth
from tests.test_api_input import upload
from tests.test_hostile_input import post_raw
from tests.test_worker_endpoints import call

# The forgery of the issue: a blank line, then a cue of its own, then a WebVTT comment block.
FORGED = "hello\n\n00:00:00,000 --> 99:59:59,999\nforged cue\n\nNOTE\nforged note"
HOSTILE = [
    FORGED,
    "\r\n\r\nSTYLE\n::cue { color: red }",
    "\nREGION\nid:x",
    "ok\x1b[2J\x1b]0;title\x07 cleared",
    "lone\rcarriage",
    "line\u2028separator\u2029paragraph",
    "tab\there\x0bvertical\x0cfeed\x85nel\x1cfs",
    "\u202eevil\u202c \u2066iso\u2069 \u200fmark\u200e",
    "<b>bold</b> &amp; <v Mallory>voice</v> <00:00:01.000>",
    "--> ---> ----->",
    "- -> -\u202e->",
    "",
    "   ",
    "\n\n",
    "\u202e",
    "\ud800 lone surrogate",
    "12\n00:00:01,000 --> 00:00:02,000",
]
# What must never reach a cue's text line.
FORBIDDEN = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]|-->")


def _transcript(texts: list[str], times: list[tuple[float, float]]) -> dict[str, Any]:
    segments = [
        {"id": i, "start": start, "end": end, "text": text}
        for i, (text, (start, end)) in enumerate(zip(texts, times, strict=True))
    ]
    return {"text": "".join(texts), "language": "en", "duration": 1.0, "segments": segments}


def _millis(seconds: float) -> int:
    """A time as the formats write it: to the millisecond, within the stored bounds."""
    return round(min(max(seconds, 0.0), MAX_SECONDS) * 1000)


def _check_parses_one_cue_per_segment(transcript: dict[str, Any]) -> None:
    segments = transcript["segments"]

    body, _ = render(transcript, "srt")
    cues = list(srt.parse(body, ignore_errors=False))
    assert len(cues) == len(segments), body
    for cue, seg in zip(cues, segments, strict=True):
        assert cue.start == timedelta(milliseconds=_millis(seg["start"]))
        assert cue.end == timedelta(milliseconds=_millis(seg["end"]))
        assert cue.content == cue_text(seg["text"])
        assert cue.content and not FORBIDDEN.search(cue.content)

    body, _ = render(transcript, "vtt")
    vtt = webvtt.from_buffer(io.StringIO(body), strict=True)
    assert len(vtt.captions) == len(segments), body
    assert not vtt.styles and not vtt.header_comments and not vtt.footer_comments
    for caption, seg in zip(vtt.captions, segments, strict=True):
        assert caption.start_time.in_milliseconds() == _millis(seg["start"])
        assert caption.end_time.in_milliseconds() == _millis(seg["end"])
        assert caption.raw_text == vtt_escape(cue_text(seg["text"]))
        assert caption.identifier is None
        assert not FORBIDDEN.search(caption.raw_text) and "<" not in caption.raw_text
    # Every cue is one timing line and one text line: nothing else in the file.
    assert body.count("-->") == len(segments)

    body, _ = render(transcript, "txt")
    assert body.endswith("\n") and "\n" not in body[:-1]
    assert not FORBIDDEN.search(body[:-1])

    # The JSON formats carry the stored text, unchanged.
    body, _ = render(transcript, "json")
    assert json.loads(body)["text"] == transcript["text"]
    body, _ = render(transcript, "verbose_json")
    stored = [seg["text"] for seg in segments]
    assert [seg["text"] for seg in json.loads(body)["segments"]] == stored


@st.composite
def timed_texts(draw: st.DrawFn) -> dict[str, Any]:
    texts = draw(
        st.lists(
            st.one_of(
                st.text(st.characters(codec=None), max_size=40),
                st.sampled_from(HOSTILE),
                st.lists(st.sampled_from(HOSTILE), max_size=3).map("".join),
            ),
            max_size=8,
        )
    )
    times: list[tuple[float, float]] = []
    now = draw(st.floats(0, 400_000, allow_nan=False))
    for _ in texts:
        start = now + draw(st.floats(0, 30, allow_nan=False))
        end = start + draw(st.floats(0, 30, allow_nan=False))
        times.append((start, end))
        now = end
    return _transcript(texts, times)


@settings(max_examples=300, deadline=None, database=None)
@given(transcript=timed_texts())
@example(transcript=_transcript(HOSTILE, [(i, i + 0.5) for i in range(len(HOSTILE))]))
@example(transcript=_transcript([FORGED, "second"], [(0.0, 1.0), (1.0, 2.5)]))
def test_any_stored_transcript_parses_into_one_cue_per_segment(
    transcript: dict[str, Any],
) -> None:
    _check_parses_one_cue_per_segment(transcript)


def test_cue_text_is_one_line_of_the_words() -> None:
    assert cue_text(FORGED) == "hello 00:00:00,000 -> 99:59:59,999 forged cue NOTE forged note"
    assert cue_text("ok\x1b[2J done") == "ok [2J done"
    assert cue_text("\u202eevil\u202c") == "evil"
    assert cue_text("tab\there") == "tab here"
    assert cue_text("a --- > b ---> c") == "a --- > b -> c"
    # Nothing left to show: a visible placeholder, never an empty line that ends the cue.
    assert cue_text(" \n\u202e ") == EMPTY_CUE
    assert one_line(" \n ") == ""
    assert vtt_escape("a <b> & c-->") == "a &lt;b&gt; &amp; c--&gt;"


def test_a_forged_transcript_from_a_worker_downloads_as_one_cue_per_segment(
    client: Any, db: Database
) -> None:
    """The issue's attack end to end: a worker's result holds the forgery; the downloads
    through the API hold two cues and no NOTE block."""
    worker = add_worker(db)
    job_id = upload(client).get_json()["id"]
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    segments = [
        {"start": 0.0, "end": 1.0, "text": FORGED},
        {"start": 1.0, "end": 2.0, "text": " second\u2028line \u202ereversed"},
    ]
    result = {"transcript": {"text": "x", "segments": segments}, "processing_seconds": 1}
    stored = post_raw(client, worker, f"/jobs/{job_id}/result", json.dumps(result))
    assert stored.status_code == 200, stored.get_data(as_text=True)

    def download(fmt: str) -> str:
        response = client.get(f"/v1/jobs/{job_id}/transcript?format={fmt}", headers=auth())
        assert response.status_code == 200
        return str(response.get_data(as_text=True))

    subrip = download("srt")
    assert [c.content for c in srt.parse(subrip)] == [cue_text(FORGED), "second line reversed"]
    assert subrip.count("-->") == 2
    vtt = download("vtt")
    captions = webvtt.from_buffer(io.StringIO(vtt), strict=True).captions
    assert [(c.start, c.end) for c in captions] == [
        ("00:00:00.000", "00:00:01.000"),
        ("00:00:01.000", "00:00:02.000"),
    ]
    assert vtt.count("-->") == 2 and "\nNOTE" not in vtt
    verbose = json.loads(download("verbose_json"))
    assert [s["text"] for s in verbose["segments"]] == [s["text"] for s in segments]
