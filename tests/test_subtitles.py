"""Subtitles cannot be forged from transcript text (issue 21 §4).

Whatever a segment's text holds (blank lines, a timing line, a WebVTT `NOTE`, terminal
escapes, lone CR, U+2028, bidi overrides), `srt` and `vtt` parse, with maintained parsers
from PyPI (`srt`, `webvtt-py`), into cues (app/jobs/cues.py) that carry exactly the segments'
words made plain, in order, within the segments' times, none overlapping; no text line is
anything but words; `txt` is one line; `json` and `verbose_json` carry the stored text as
stored.
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
from app.jobs.cues import MAX_CUE_SECONDS
from app.jobs.formats import one_line, render, vtt_escape
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


def _letters(texts: list[str]) -> str:
    """The texts without their whitespace: what cues must carry, however they break lines."""
    return "".join("".join(text.split()) for text in texts)


def _unescaped(vtt_text: str) -> str:
    return vtt_text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _check_times(times: list[tuple[int, int]], transcript: dict[str, Any]) -> None:
    """Cues in order, none overlapping, none longer than MAX_CUE_SECONDS, all within the
    segments' span (to the millisecond)."""
    segments = transcript["segments"]
    first = min((_millis(s["start"]) for s in segments), default=0)
    last = max((max(_millis(s["end"]), _millis(s["start"])) for s in segments), default=0)
    previous_end = 0
    for start, end in times:
        assert previous_end <= start <= end <= start + MAX_CUE_SECONDS * 1000 + 1
        assert first <= start and end <= max(last, start + 1000)
        previous_end = end


def _check_parses_into_cues_of_the_words(transcript: dict[str, Any]) -> None:
    segments = transcript["segments"]
    words = _letters([one_line(seg["text"]) for seg in segments])

    body, _ = render(transcript, "srt")
    cues = list(srt.parse(body, ignore_errors=False))
    # Every cue is one timing line and its text lines: nothing else in the file.
    assert body.count("-->") == len(cues), body
    assert _letters([cue.content for cue in cues]) == words, body
    for cue in cues:
        assert all(line.strip() for line in cue.content.split("\n"))
        assert cue.content and not FORBIDDEN.search(cue.content.replace("\n", " "))
    _check_times([(_td(c.start), _td(c.end)) for c in cues], transcript)

    body, _ = render(transcript, "vtt")
    vtt = webvtt.from_buffer(io.StringIO(body), strict=True)
    assert body.count("-->") == len(vtt.captions), body
    assert not vtt.styles and not vtt.header_comments and not vtt.footer_comments
    assert _letters([_unescaped(c.raw_text) for c in vtt.captions]) == words, body
    for caption in vtt.captions:
        assert caption.identifier is None
        text = caption.raw_text.replace("\n", " ")
        assert not FORBIDDEN.search(text) and "<" not in text
    times = [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds()) for c in vtt.captions]
    _check_times(times, transcript)

    body, _ = render(transcript, "txt")
    assert body.endswith("\n") and "\n" not in body[:-1]
    assert not FORBIDDEN.search(body[:-1])

    body, _ = render(transcript, "tsv")
    rows = body.split("\n")
    assert rows[0] == "start\tend\ttext" and rows[-1] == "" and len(rows) == len(segments) + 2
    for row, seg in zip(rows[1:-1], segments, strict=True):
        start, end = str(_millis(seg["start"])), str(_millis(seg["end"]))
        assert row.split("\t") == [start, end, one_line(seg["text"])]
        assert not FORBIDDEN.search(row.replace("\t", " "))

    # The JSON formats carry the stored text, unchanged.
    body, _ = render(transcript, "json")
    assert json.loads(body)["text"] == transcript["text"]
    body, _ = render(transcript, "verbose_json")
    stored = [seg["text"] for seg in segments]
    assert [seg["text"] for seg in json.loads(body)["segments"]] == stored


def _td(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


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
# No-break and other Unicode spaces are spaces: never a cue line of their own.
@example(transcript=_transcript(["\xa0", "a \xa0 b\u3000\u2003c"], [(0.0, 0.0), (0.0, 9.0)]))
def test_any_stored_transcript_parses_into_cues_of_its_words(
    transcript: dict[str, Any],
) -> None:
    _check_parses_into_cues_of_the_words(transcript)


def test_one_line_is_the_words_made_plain() -> None:
    assert one_line(FORGED) == "hello 00:00:00,000 -> 99:59:59,999 forged cue NOTE forged note"
    assert one_line("ok\x1b[2J done") == "ok [2J done"
    assert one_line("\u202eevil\u202c") == "evil"
    assert one_line("tab\there") == "tab here"
    assert one_line("a --- > b ---> c") == "a --- > b -> c"
    assert one_line(" \n\u202e ") == ""
    assert one_line(" \n ") == ""
    assert vtt_escape("a <b> & c-->") == "a &lt;b&gt; &amp; c--&gt;"


def test_a_forged_transcript_from_a_worker_downloads_as_cues_of_its_words(
    client: Any, db: Database
) -> None:
    """The issue's attack end to end: a worker's result holds the forgery; the downloads
    through the API hold the words as cue text, no forged cue and no NOTE block."""
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

    words = one_line(FORGED) + " second line reversed"
    subrip = download("srt")
    cues = list(srt.parse(subrip))
    assert " ".join(c.content.replace("\n", " ") for c in cues) == words
    assert subrip.count("-->") == len(cues) and cues[0].start == timedelta(0)
    assert cues[-1].end <= timedelta(seconds=2)
    vtt = download("vtt")
    captions = webvtt.from_buffer(io.StringIO(vtt), strict=True).captions
    assert " ".join(_unescaped(c.raw_text).replace("\n", " ") for c in captions) == words
    assert captions[0].start == "00:00:00.000" and captions[-1].end <= "00:00:02.000"
    assert vtt.count("-->") == len(captions) and "\nNOTE" not in vtt
    verbose = json.loads(download("verbose_json"))
    assert [s["text"] for s in verbose["segments"]] == [s["text"] for s in segments]
