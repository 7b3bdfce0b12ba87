"""The stitch (app/jobs/stitch.py) on random transcripts cut at random places, parts simulated as
workers give them (times of the whole file, the overlap past each span heard twice, a word the
cut caught heard whole by one part and as a fragment by the next): no word is lost or doubled at
a seam, times never go backwards, one language; and cut at pauses, every download format of
the stitched transcript is the one of the transcript a single worker gave."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.jobs import formats
from app.jobs.cues import CueOptions
from app.jobs.cuts import OVERLAP_SECONDS, Span
from app.jobs.stitch import PartTranscript, stitch

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs"]


@st.composite
def whole_transcripts(draw: st.DrawFn) -> dict[str, Any]:
    """Words with gaps between them, grouped into segments: a worker's whole-file transcript."""
    count = draw(st.integers(1, 60))
    t = draw(st.floats(0.0, 2.0))
    segments: list[dict[str, Any]] = []
    words: list[dict[str, Any]] = []
    for _ in range(count):
        gap = draw(st.sampled_from([0.0, 0.05, 0.2, 0.8, 2.5]))
        length = draw(st.sampled_from([0.15, 0.3, 0.5]))
        start = round(t + gap, 3)
        end = round(start + length, 3)
        words.append(
            {"word": " " + draw(st.sampled_from(WORDS)), "start": start, "end": end,
             "probability": 0.9}
        )  # fmt: skip
        t = end
        if draw(st.booleans()) or len(words) >= 8:
            segments.append(_segment(words))
            words = []
    if words:
        segments.append(_segment(words))
    return {
        "text": "".join(s["text"] for s in segments).strip(),
        "language": "en",
        "duration": round(t + 1.0, 3),
        "segments": [{**s, "id": i} for i, s in enumerate(segments)],
    }


def _segment(words: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "start": words[0]["start"],
        "end": words[-1]["end"],
        "text": "".join(w["word"] for w in words),
        "avg_logprob": -0.2,
        "words": list(words),
    }


def _heard(whole: dict[str, Any], span: Span, last: bool, fragment: bool) -> dict[str, Any]:
    """What a worker gives for `span` (+ the overlap): the words that start in what it heard,
    grouped by the whole file's segments; a word the span's start cuts as a fragment."""
    until = span.end if last else span.end + OVERLAP_SECONDS
    segments = []
    for seg in whole["segments"]:
        words = []
        for w in seg["words"]:
            if span.start <= w["start"] < until:
                words.append(dict(w))
            elif fragment and w["start"] < span.start < w["end"] - 0.15:
                words.append({**w, "word": " " + w["word"].strip()[-2:] + "-",
                              "start": span.start})  # fmt: skip
        if words:
            segments.append(_segment(words))
    return {"text": "", "language": "en", "language_probability": 0.9, "segments": segments}


def _spans(duration: float, cuts: list[float]) -> tuple[Span, ...]:
    bounds = [0.0, *cuts, duration]
    return tuple(Span(i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1))


def _words(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for s in transcript["segments"] for w in s["words"]]


@given(whole_transcripts(), st.lists(st.floats(0.01, 0.99), min_size=1, max_size=5))
def test_no_word_is_lost_or_doubled_at_a_seam_wherever_the_cut_falls(
    whole: dict[str, Any], fractions: list[float]
) -> None:
    duration = whole["duration"]
    cuts = sorted({round(f * duration, 3) for f in fractions})
    spans = _spans(duration, cuts)
    parts = [
        PartTranscript(span, _heard(whole, span, n == len(spans) - 1, fragment=True))
        for n, span in enumerate(spans)
    ]
    stitched = stitch(parts, duration, None)
    assert [w["word"] for w in _words(stitched)] == [w["word"] for w in _words(whole)]
    assert [(w["start"], w["end"]) for w in _words(stitched)] == [
        (w["start"], w["end"]) for w in _words(whole)
    ]
    starts = [s["start"] for s in stitched["segments"]]
    assert starts == sorted(starts)
    assert [s["id"] for s in stitched["segments"]] == list(range(len(starts)))
    assert stitched["language"] == "en" and stitched["duration"] == duration
    assert stitched["text"].split() == whole["text"].split()


@given(whole_transcripts(), st.data())
def test_cut_at_pauses_every_format_is_the_single_workers(
    whole: dict[str, Any], data: st.DataObject
) -> None:
    segments = whole["segments"]
    boundaries = [
        round((a["end"] + b["start"]) / 2, 3)
        for a, b in zip(segments, segments[1:], strict=False)
        if b["start"] > a["end"]
    ]
    cuts = []
    if boundaries:
        cuts = sorted(set(data.draw(st.lists(st.sampled_from(boundaries), max_size=4))))
    spans = _spans(whole["duration"], cuts)
    parts = [
        PartTranscript(span, _heard(whole, span, n == len(spans) - 1, fragment=False))
        for n, span in enumerate(spans)
    ]
    stitched = stitch(parts, whole["duration"], "en")
    expected = {**whole, "language": "en"}
    assert stitched["segments"] == expected["segments"]
    for name in (*formats.FORMATS, "diarized_json"):
        assert _render(name, stitched) == _render(name, expected), name


def _render(name: str, transcript: dict[str, Any]) -> str:
    return formats.render(transcript, name, CueOptions())[0]


def test_one_language_for_the_job_voted_by_words() -> None:
    def part(index: int, language: str, words: int) -> PartTranscript:
        seg = _segment(
            [
                {"word": " a", "start": index * 10 + k, "end": index * 10 + k + 0.5}
                for k in range(words)
            ]
        )
        return PartTranscript(
            Span(index, index * 10.0, index * 10.0 + 10),
            {"text": "", "language": language, "language_probability": 0.5 + index / 10,
             "segments": [seg]},
        )  # fmt: skip

    parts = [part(0, "de", 2), part(1, "en", 5), part(2, "en", 1)]
    stitched = stitch(parts, 30.0, None)
    assert stitched["language"] == "en"
    assert abs(stitched["language_probability"] - (0.6 + 0.7) / 2) < 1e-9
    assert stitch(parts, 30.0, "de")["language"] == "de"
    silent = [PartTranscript(Span(0, 0.0, 10.0), {"text": "", "segments": []})]
    assert stitch(silent, 10.0, None) == {"text": "", "duration": 10.0, "segments": []}
