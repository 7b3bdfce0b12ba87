"""Joining the transcripts of a long job's parts into the one transcript a single worker would give.

Each part's transcript arrives with times of the whole file (gpu_worker/parts.py) and covers
its span plus up to `OVERLAP_SECONDS` past the span's end (app/jobs/cuts.py). A pure function
of the parts, in order, so it can run again on the same parts and give the same transcript.

Invariants (tests/test_stitch.py checks them on random transcripts cut at random pauses):
- A word belongs to the part whose span holds its start: a part keeps the words that start
  before its span's end (a word the cut caught is kept whole from the part that heard it
  whole), and the next part drops what it heard again: a word that starts before the end of
  the last word kept (less `TOUCH_SECONDS`), or the same word (by its letters) starting
  before that end. Within one part every word the worker gave is kept: a word said twice
  stays twice.
- A segment keeps its kept words, its times narrowed to them and its text rebuilt from them
  when any were dropped; a segment left with no word is dropped. A segment without words is
  kept when it starts within its part's span and after the last kept time.
- Segments are renumbered from 0; segment and word starts never go backwards.
- One `language` for the job: the one asked for, else the one most words were heard in
  (ties: the earliest part's), with the mean probability of the parts that found it.
- `text` is the segments' texts joined as the worker joins them (gpu_worker/transcript.py).
- A diarized job's speakers come last (`with_speakers`), from its speakers part's turns over
  the whole file, by the worker's own rules (gpu_worker/speakers.py): the joined transcript is
  labelled as one worker's would be, so no label changes meaning at a seam.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.jobs.cuts import Span
from gpu_worker.protocol.transcript import Transcript, Turn
from gpu_worker.speakers import SpeakerTurn, assign_speakers

# A word of the next part starting this little before the last kept word's end is still new
# (word times are estimates to a few hundredths).
TOUCH_SECONDS = 0.1

_NOT_A_LETTER = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class PartTranscript:
    """A finished part: its span of the file and its transcript (times of the whole file)."""

    span: Span
    transcript: dict[str, Any]


def _norm(word: str) -> str:
    return _NOT_A_LETTER.sub("", word.lower())


class _Seam:
    """What the stitch has kept so far: the end and text of its last word."""

    def __init__(self) -> None:
        self.end = 0.0
        self.last_word = ""
        self.floor = 0.0  # starts never go below this
        self.part = -1  # the part the last kept word came from

    def keeps(self, word: dict[str, Any], span: Span, last: bool) -> bool:
        start = float(word.get("start", 0.0))
        if not last and start >= span.end:
            return False  # the next part's: heard here only in the overlap
        if span.index == self.part:
            return True
        if start < self.end - TOUCH_SECONDS:
            return False  # heard whole by the previous part
        again = _norm(str(word.get("word", "")))
        return not (again and again == self.last_word and start < self.end)

    def kept(self, word: dict[str, Any], span: Span) -> dict[str, Any]:
        start = max(float(word.get("start", 0.0)), self.floor)
        end = max(float(word.get("end", start)), start)
        self.end, self.floor, self.part = max(self.end, end), start, span.index
        self.last_word = _norm(str(word.get("word", "")))
        return {**word, "start": start, "end": end}


def _segment(segment: dict[str, Any], seam: _Seam, span: Span, last: bool) -> dict[str, Any] | None:
    words = segment.get("words")
    start = float(segment.get("start", 0.0))
    if not isinstance(words, list):
        if (not last and start >= span.end) or start < seam.end - TOUCH_SECONDS:
            return None
        start = max(start, seam.floor)
        end = max(float(segment.get("end", start)), start)
        seam.end, seam.floor = max(seam.end, end), start
        return {**segment, "start": start, "end": end}
    floor = seam.floor
    kept = [seam.kept(w, span) for w in words if isinstance(w, dict) and seam.keeps(w, span, last)]
    if not kept:
        return None
    if len(kept) == len(words):
        return {
            **segment,
            "start": max(floor, min(start, kept[0]["start"])),
            "end": max(float(segment.get("end", 0.0)), kept[-1]["end"]),
            "words": kept,
        }
    return {
        **segment,
        "start": kept[0]["start"],
        "end": kept[-1]["end"],
        "text": "".join(str(w.get("word", "")) for w in kept),
        "words": kept,
    }


def _language(parts: Sequence[PartTranscript], asked: str | None) -> tuple[str | None, Any]:
    heard: dict[str, int] = {}
    probabilities: dict[str, list[float]] = {}
    for part in parts:
        language = part.transcript.get("language")
        if not language:
            continue
        words = sum(len(s.get("words") or [s]) for s in part.transcript.get("segments", []))
        heard[language] = heard.get(language, 0) + words
        probability = part.transcript.get("language_probability")
        if isinstance(probability, int | float):
            probabilities.setdefault(language, []).append(float(probability))
    if asked:
        return asked, None
    if not heard:
        return None, None
    chosen = max(heard, key=lambda lang: heard[lang])  # first inserted wins a tie
    found = probabilities.get(chosen)
    return chosen, (sum(found) / len(found) if found else None)


def stitch(
    parts: Sequence[PartTranscript], duration: float, asked: str | None, *, complete: bool = True
) -> dict[str, Any]:
    """The job's transcript from its parts' (see the invariants); `asked`: the job's language.
    `complete=False`: `parts` are the job's first parts only, the last of them not the job's
    last, so its overlap is left to the next; the segments are then exactly the first ones of
    the job's whole stitch (each part's kept words depend on the parts before it only)."""
    seam = _Seam()
    segments: list[dict[str, Any]] = []
    for n, part in enumerate(parts):
        last = complete and n == len(parts) - 1
        for segment in part.transcript.get("segments", []):
            if isinstance(segment, dict):
                joined = _segment(segment, seam, part.span, last)
                if joined is not None:
                    segments.append({**joined, "id": len(segments)})
    language, probability = _language(parts, asked)
    body: dict[str, Any] = {
        "text": "".join(str(s.get("text", "")) for s in segments).strip(),
        "duration": duration,
        "segments": segments,
    }
    if language:
        body["language"] = language
    if probability is not None:
        body["language_probability"] = probability
    task = next((p.transcript["task"] for p in parts if p.transcript.get("task")), None)
    if task:
        body["task"] = task
    return body


def with_speakers(stitched: dict[str, Any], turns: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stitched transcript with a speaker on every segment and word, from the speakers
    part's turns (times of the whole file); a segment whose words change speaker is split."""
    said = [Turn.model_validate(turn) for turn in turns]
    labelled = assign_speakers(
        Transcript.model_validate(stitched),
        [SpeakerTurn(turn.start, turn.end, turn.speaker) for turn in said],
        words=True,
    )
    return {**stitched, **labelled.model_dump(exclude_none=True)}
