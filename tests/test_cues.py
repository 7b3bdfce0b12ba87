"""Subtitle cues built from word times (app/jobs/cues.py): limits, order, words, speakers.

Property tests over random word timings (hypothesis, bounded): every cue holds at most
`max_line_count` lines of at most `max_line_width` characters (and `max_words_per_line`
words), lasts at most MAX_CUE_SECONDS, starts no earlier than the one before ends, shows for
MIN_CUE_SECONDS where the next cue leaves room, holds one speaker's words, and the cues
together carry exactly the transcript's words in order. Then the breaks a reader expects, the
fallback without word times, and the download's query options.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import srt
import webvtt
from hypothesis import given, settings
from hypothesis import strategies as st

from app.db import Database
from app.jobs.cues import MAX_CUE_SECONDS, MIN_CUE_SECONDS, Cue, CueOptions, build_cues
from app.jobs.formats import render
from tests.conftest import add_worker, auth
from tests.test_api_input import upload
from tests.test_hostile_input import post_raw
from tests.test_worker_endpoints import call

EPSILON = 1e-9
VOCABULARY = [
    "the", "a", "an", "cat", "sat", "on", "mat", "and", "but", "because", "of", "in",
    "morning", "budget", "committee", "we", "should", "start", "with", "numbers",
    "extraordinarily", "internationalisation", "I", "it's", "don't", "New", "York",
]  # fmt: skip
PUNCTUATION = ["", "", "", "", ",", ".", "?", "!", ";", ":", '."', "\u2026"]


@st.composite
def timed_words(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, str | None]]]:
    """A transcript of segments with words at random times, some diarized, some with a word
    longer than a line; and its words in order with their speakers."""
    diarized = draw(st.booleans())
    now = draw(st.floats(0, 10_000, allow_nan=False))
    segments, words = [], []
    for _ in range(draw(st.integers(0, 4))):
        seg_words = []
        for _ in range(draw(st.integers(1, 40))):
            text = draw(st.sampled_from(VOCABULARY)) + draw(st.sampled_from(PUNCTUATION))
            if draw(st.integers(0, 30)) == 0:
                text = "x" * draw(st.integers(43, 130))  # longer than any default line
            start = now + draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0, 2.5]))
            end = start + draw(st.floats(0, 1.5, allow_nan=False))
            word: dict[str, Any] = {"word": " " + text, "start": start, "end": end}
            if diarized:
                word["speaker"] = draw(st.sampled_from(["SPEAKER_00", "SPEAKER_01"]))
            seg_words.append(word)
            words.append((text, word.get("speaker")))
            now = end
        text = "".join(w["word"] for w in seg_words)
        start, end = seg_words[0]["start"], seg_words[-1]["end"]
        segments.append({"start": start, "end": end, "text": text, "words": seg_words})
    transcript = {"text": "", "duration": now + 1.0, "segments": segments}
    return transcript, words


options_strategy = st.builds(
    CueOptions,
    max_line_width=st.integers(10, 60),
    max_line_count=st.integers(1, 4),
    max_words_per_line=st.one_of(st.none(), st.integers(1, 8)),
)


def _pieces(cue: Cue) -> list[str]:
    return " ".join(cue.lines).split(" ")


def _check_limits_and_times(cues: list[Cue], options: CueOptions, duration: float) -> None:
    previous_end = 0.0
    for index, cue in enumerate(cues):
        assert 1 <= len(cue.lines) <= options.max_line_count
        for line in cue.lines:
            assert line and line == line.strip() and "  " not in line
            assert len(line) <= options.max_line_width, (line, options)
            if options.max_words_per_line:
                assert len(line.split(" ")) <= options.max_words_per_line
        assert previous_end <= cue.start <= cue.end <= cue.start + MAX_CUE_SECONDS + EPSILON
        room = cues[index + 1].start if index + 1 < len(cues) else duration
        # Long enough to see, where the next cue (or the end of the audio) leaves room.
        assert cue.end - cue.start >= min(MIN_CUE_SECONDS, room - cue.start) - EPSILON
        previous_end = cue.end


@settings(max_examples=200, deadline=None, database=None)
@given(case=timed_words(), options=options_strategy)
def test_cues_keep_the_limits_and_carry_exactly_the_words_one_speaker_each(
    case: tuple[dict[str, Any], list[tuple[str, str | None]]], options: CueOptions
) -> None:
    transcript, words = case
    cues = build_cues(transcript, options)
    _check_limits_and_times(cues, options, transcript["duration"])
    # The words, in order, none lost or doubled; a word longer than a line is cut into
    # line-wide pieces that join again without a space.
    assert "".join("".join(_pieces(c)) for c in cues) == "".join(w for w, _ in words)
    if all(len(w) <= options.max_line_width for w, _ in words):
        assert [p for c in cues for p in _pieces(c)] == [w for w, _ in words]
        # Speakers never mixed: each cue's words are all its speaker's.
        position = 0
        for cue in cues:
            count = len(_pieces(cue))
            assert {s for _, s in words[position : position + count]} == {cue.speaker}
            position += count


@settings(max_examples=100, deadline=None, database=None)
@given(
    times=st.lists(
        st.tuples(st.floats(-5, 50, allow_nan=False), st.floats(-5, 50, allow_nan=False)),
        min_size=1,
        max_size=60,
    )
)
def test_word_times_out_of_order_still_give_ordered_cues(times: list[tuple[float, float]]) -> None:
    words = [{"word": f" w{i}", "start": s, "end": e} for i, (s, e) in enumerate(times)]
    transcript = {"segments": [{"start": 0, "end": 50, "text": "", "words": words}]}
    cues = build_cues(transcript, CueOptions())
    _check_limits_and_times(cues, CueOptions(), 0.0)
    assert [p for c in cues for p in _pieces(c)] == [f"w{i}" for i in range(len(times))]


SPEECH = (
    "Good morning everyone, and welcome to the meeting. Today we will talk about the budget "
    "for the next year, which has been a topic of great debate in the committee. I think we "
    "should start with the numbers. The total spending is up by ten percent, but the income "
    "has not grown at the same rate. So we need to find savings."
)


def _spoken(text: str, sentence_pause: float = 0.6) -> dict[str, Any]:
    """`text` as one segment whose words take time by their length, a pause after sentences."""
    now, words = 0.0, []
    for word in text.split(" "):
        length = 0.08 * len(word) + 0.1
        words.append({"word": " " + word, "start": round(now, 3), "end": round(now + length, 3)})
        now += length + (sentence_pause if word.endswith(".") else 0.05)
    segment = {"start": 0.0, "end": now, "text": " " + text, "words": words}
    return {"text": text, "duration": now, "segments": [segment]}


def test_cues_end_at_sentences_then_clauses_and_lines_break_where_a_reader_expects() -> None:
    cues = build_cues(_spoken(SPEECH), CueOptions())
    texts = [" ".join(c.lines) for c in cues]
    assert " ".join(texts) == SPEECH
    # Every sentence end is a cue end (a pause follows each), and no cue ends mid-clause.
    sentences = [s.strip() for s in SPEECH.replace(". ", ".|").split("|")]
    assert all(any(t.endswith(s.split(" ")[-1]) for t in texts) for s in sentences)
    assert all(t[-1] in ".,?" for t in texts), texts
    for cue in cues:
        for line in cue.lines[:-1]:
            assert line.split(" ")[-1].lower() not in {"a", "an", "the"}, cue.lines
    assert ("Good morning everyone,", "and welcome to the meeting.") in [c.lines for c in cues]


def test_a_transcript_without_word_times_is_cut_by_character_count_within_the_limits() -> None:
    """The issue's case: one 30 s segment of about 70 words, no word times."""
    text = " ".join([SPEECH] * 2)
    transcript = {"segments": [{"start": 1.0, "end": 29.5, "text": " " + text}], "duration": 30}
    cues = build_cues(transcript, CueOptions())
    _check_limits_and_times(cues, CueOptions(), 30.0)
    assert len(cues) >= 5
    assert " ".join(" ".join(c.lines) for c in cues) == text
    assert cues[0].start == 1.0 and cues[-1].end <= 30.0
    # No cue holds the end of one sentence and the start of the next on one line.
    assert not any(". " in line for c in cues for line in c.lines), cues


def test_words_without_spaces_join_without_spaces() -> None:
    words = [
        {"word": ch, "start": i * 0.2, "end": i * 0.2 + 0.2}
        for i, ch in enumerate("今日は良い天気です。")
    ]
    transcript = {
        "segments": [{"start": 0, "end": 2, "text": "今日は良い天気です。", "words": words}]
    }
    cues = build_cues(transcript, CueOptions())
    assert [c.lines for c in cues] == [("今日は良い天気です。",)]


def test_unspaced_text_breaks_cues_at_its_sentence_ends() -> None:
    text = "今日は良い天気です。明日は雨が降るでしょう。"
    words = [{"word": ch, "start": i * 0.3, "end": i * 0.3 + 0.3} for i, ch in enumerate(text)]
    transcript = {"segments": [{"start": 0, "end": 7, "text": text, "words": words}]}
    cues = build_cues(transcript, CueOptions(max_line_width=12, max_line_count=1))
    assert [c.lines for c in cues] == [("今日は良い天気です。",), ("明日は雨が降るでしょう。",)]


def test_words_without_a_leading_space_take_their_spacing_from_the_segment_text() -> None:
    """WhisperX's words carry no leading space; faster-whisper's do."""
    for words, text in [(["Hello,", "world."], " Hello, world."), (["今日", "は"], "今日は")]:
        timed = [{"word": w, "start": i, "end": i + 0.5} for i, w in enumerate(words)]
        transcript = {"segments": [{"start": 0, "end": 2, "text": text, "words": timed}]}
        assert [c.lines for c in build_cues(transcript, CueOptions())] == [(text.strip(),)]


def test_a_speaker_change_starts_a_new_cue() -> None:
    words = [
        {"word": " Hello", "start": 0.0, "end": 0.4, "speaker": "SPEAKER_00"},
        {"word": " there", "start": 0.4, "end": 0.8, "speaker": "SPEAKER_00"},
        {"word": " hi", "start": 0.8, "end": 1.0, "speaker": "SPEAKER_01"},
    ]
    transcript = {"segments": [{"start": 0, "end": 1, "text": " Hello there hi", "words": words}]}
    cues = build_cues(transcript, CueOptions())
    assert [(c.lines, c.speaker) for c in cues] == [
        (("Hello there",), "SPEAKER_00"),
        (("hi",), "SPEAKER_01"),
    ]
    assert cues[0].end <= cues[1].start == 0.8
    body, _ = render({**transcript, "speakers": ["SPEAKER_00", "SPEAKER_01"]}, "vtt")
    assert "<v SPEAKER_00>Hello there\n" in body and "<v SPEAKER_01>hi\n" in body


def _finished_job(client: Any, db: Database) -> str:
    worker = add_worker(db)
    job_id = str(upload(client).get_json()["id"])
    assert call(client, worker, f"/jobs/{job_id}/claim").status_code == 200
    result = {"transcript": _spoken(SPEECH), "processing_seconds": 1}
    stored = post_raw(client, worker, f"/jobs/{job_id}/result", json.dumps(result))
    assert stored.status_code == 200, stored.get_data(as_text=True)
    return job_id


def test_the_download_lays_cues_out_by_its_query_options(client: Any, db: Database) -> None:
    job_id = _finished_job(client, db)
    url = f"/v1/jobs/{job_id}/transcript?format=srt"

    default = list(srt.parse(client.get(url, headers=auth()).get_data(as_text=True)))
    lines = [line for c in default for line in c.content.split("\n")]
    assert max(len(line) for line in lines) <= 42 and max(len(line) > 30 for line in lines)
    assert all(c.content.count("\n") <= 1 for c in default)

    query = "&max_line_width=20&max_line_count=1&max_words_per_line=3"
    narrow = client.get(url + query, headers=auth())
    assert narrow.status_code == 200
    cues = list(srt.parse(narrow.get_data(as_text=True)))
    assert all("\n" not in c.content and len(c.content) <= 20 for c in cues)
    assert all(len(c.content.split(" ")) <= 3 for c in cues)
    assert " ".join(c.content for c in cues) == SPEECH

    tsv = client.get(f"/v1/jobs/{job_id}/transcript?format=tsv", headers=auth())
    assert tsv.status_code == 200 and tsv.mimetype == "text/tab-separated-values"
    assert tsv.get_data(as_text=True).startswith("start\tend\ttext\n0\t")


@pytest.mark.parametrize(
    "query",
    [
        "max_line_width=9",
        "max_line_width=201",
        "max_line_width=abc",
        "max_line_width=",
        "max_line_count=0",
        "max_line_count=1.5",
        "max_words_per_line=0",
        "max_words_per_line=-3",
    ],
)
def test_a_bad_cue_option_is_refused(client: Any, query: str) -> None:
    # The query is checked before the job is looked up.
    response = client.get(f"/v1/jobs/job_none/transcript?format=vtt&{query}", headers=auth())
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "invalid_parameter" and query.split("=")[0] in error["message"]


def test_a_short_cue_is_held_to_be_seen_and_read_where_the_next_leaves_room() -> None:
    words = [
        {"word": " Yes.", "start": 0.0, "end": 0.2},
        {"word": " Absolutely, that is exactly what we wanted.", "start": 3.0, "end": 3.5},
        {"word": " Next.", "start": 6.0, "end": 6.05},
        {"word": " Go.", "start": 6.5, "end": 6.6},  # after a pause: its own cue
    ]
    transcript = {"segments": [{"start": 0, "end": 6.6, "text": "", "words": words}]}
    cues = build_cues(transcript, CueOptions())
    assert [c.lines for c in cues][1] == ("Absolutely, that is", "exactly what we wanted.")
    # 5/6 s to be seen; 42 characters at 20 a second; up to the next cue; the last as said
    # (the audio's end is not known here).
    expected = [0.0, MIN_CUE_SECONDS, 3.0, 3.0 + 42 / 20, 6.0, 6.5, 6.5, 6.6]
    assert [t for c in cues for t in (c.start, c.end)] == pytest.approx(expected)


def test_a_diarized_cue_of_two_lines_parses_with_its_voice_and_prefix() -> None:
    text = " Good morning everyone, and welcome to the weekly operations review."
    words = [
        {"word": " " + w, "start": i * 0.3, "end": i * 0.3 + 0.25, "speaker": "SPEAKER_01"}
        for i, w in enumerate(text.split())
    ]
    segment = {"start": 0, "end": 4, "text": text, "words": words, "speaker": "SPEAKER_01"}
    transcript = {"segments": [segment], "speakers": ["SPEAKER_01"], "duration": 4}
    cue = srt.parse(render(transcript, "srt")[0]).__next__()
    lines = ["Good morning everyone, and welcome", "to the weekly operations review."]
    assert cue.content == "SPEAKER_01: " + "\n".join(lines)
    vtt = webvtt.from_buffer(io.StringIO(render(transcript, "vtt")[0]), strict=True)
    assert [c.voice for c in vtt.captions] == ["SPEAKER_01"]
    assert vtt.captions[0].text.split("\n") == lines
