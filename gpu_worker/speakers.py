"""Speaker turns onto a transcript: which speaker said each segment and word (pure functions).

The diarization stage (gpu_worker/diarization.py) finds *when* each speaker talks; this module
decides *who said what*, word by word, as WhisperX's `assign_word_speakers` does: a word goes
to the speaker whose turns overlap it the longest, and a segment whose words change speaker is
split there. Kept free of torch and pyannote so the rules are tested in the default tier.

Invariants:
- Labels on the transcript are `SPEAKER_00`, `SPEAKER_01`, ... numbered by first appearance in
  the transcript (segments in order, then their words), whatever the clustering called them,
  so the first voice heard is always SPEAKER_00 and no number is skipped.
- `Transcript.speakers` lists exactly the labels some segment or word carries, in label order.
- A word (or a segment without words) that no turn overlaps (the recogniser heard speech where
  the diarizer heard none) takes the nearest turn's speaker: every segment and word of a
  diarized transcript names a speaker once any turn exists.
- No segment mixes two speakers when it has words: it is split into runs of one speaker's
  words, and the pieces' texts add up to the segment's text.
- Ties in overlap go to the speaker heard first, so the result does not depend on set order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_worker.protocol.transcript import Segment, Transcript, Word


@dataclass(frozen=True)
class SpeakerTurn:
    """One stretch of speech by one speaker; `speaker` is the diarizer's own label."""

    start: float
    end: float
    speaker: str


def speaker_label(index: int) -> str:
    """The protocol's label of the index-th speaker: 0 -> SPEAKER_00."""
    return f"SPEAKER_{index:02d}"


def overlap(start: float, end: float, turn: SpeakerTurn) -> float:
    """Seconds that [start, end] and the turn share (0 when disjoint)."""
    return max(0.0, min(end, turn.end) - max(start, turn.start))


def speaker_by_overlap(start: float, end: float, turns: Sequence[SpeakerTurn]) -> str | None:
    """The speaker whose turns cover the most of [start, end]; None when no turn touches it."""
    totals: dict[str, float] = {}
    for turn in turns:
        shared = overlap(start, end, turn)
        if shared > 0:
            totals[turn.speaker] = totals.get(turn.speaker, 0.0) + shared
    if not totals:
        return None
    # max() keeps the first of equal totals: dict order is the order turns were met in.
    return max(totals, key=lambda speaker: totals[speaker])


def nearest_speaker(start: float, end: float, turns: Sequence[SpeakerTurn]) -> str | None:
    """The speaker of the turn closest in time to [start, end]; None when there are no turns."""
    best: tuple[float, str] | None = None
    for turn in turns:
        gap = max(turn.start - end, start - turn.end, 0.0)
        if best is None or gap < best[0]:
            best = (gap, turn.speaker)
    return None if best is None else best[1]


def assign_speakers(
    transcript: Transcript, turns: Iterable[SpeakerTurn], *, words: bool = True
) -> Transcript:
    """The transcript with a speaker on every word and segment, split where the speaker changes.

    Each word goes to the speaker whose turns cover most of it (the nearest turn's when none
    does); a segment whose words change speaker becomes one segment per run of words, so no
    segment, and no cue built from one, mixes two voices. A segment without words takes the
    speaker covering most of it. `words=False` drops the word lists from the result (the job
    did not ask for word times; the split still used them).
    """
    ordered = sorted(turns, key=lambda turn: (turn.start, turn.end))
    if not ordered:
        return transcript.model_copy(update={"speakers": []})
    pieces: list[tuple[Segment, str]] = []
    for segment in transcript.segments:
        pieces.extend(_split_by_speaker(segment, ordered))

    labels: dict[str, str] = {}

    def relabel(raw: str) -> str:
        if raw not in labels:
            labels[raw] = speaker_label(len(labels))
        return labels[raw]

    segments = []
    for index, (piece, raw) in enumerate(pieces):
        update: dict[str, object] = {"speaker": relabel(raw)}
        if piece.id is not None:
            update["id"] = index
        if piece.words:
            update["words"] = (
                [_word_with(word, relabel(word.speaker or raw)) for word in piece.words]
                if words
                else None
            )
        segments.append(piece.model_copy(update=update))
    return transcript.model_copy(update={"segments": segments, "speakers": sorted(labels.values())})


def _speaker_of(start: float, end: float, turns: Sequence[SpeakerTurn]) -> str:
    # Callers pass at least one turn, so the nearest one always exists.
    return (
        speaker_by_overlap(start, end, turns)
        or nearest_speaker(start, end, turns)
        or turns[0].speaker
    )


def _split_by_speaker(segment: Segment, turns: Sequence[SpeakerTurn]) -> list[tuple[Segment, str]]:
    """The segment as runs of consecutive words of one speaker, each with that speaker."""
    if not segment.words:
        return [(segment, _speaker_of(segment.start, segment.end, turns))]
    said = [
        word.model_copy(update={"speaker": _speaker_of(word.start, word.end, turns)})
        for word in segment.words
    ]
    runs: list[list[Word]] = []
    for word in said:
        if runs and runs[-1][-1].speaker == word.speaker:
            runs[-1].append(word)
        else:
            runs.append([word])
    if len(runs) == 1:
        return [(segment.model_copy(update={"words": said}), str(said[0].speaker))]
    # faster-whisper's words carry their own leading spaces and add up to the segment's text;
    # WhisperX's aligned words are bare: they are joined with one space.
    glued = "".join(word.word for word in segment.words).strip() == segment.text.strip()
    pieces = []
    for number, run in enumerate(runs):
        text = (
            "".join(w.word for w in run) if glued else " " + " ".join(w.word.strip() for w in run)
        )
        piece = segment.model_copy(
            update={
                "start": segment.start if number == 0 else run[0].start,
                "end": segment.end if number == len(runs) - 1 else run[-1].end,
                "text": text,
                # A piece's tokens are not known apart from its neighbours'.
                "tokens": None if segment.tokens is None else [],
                "words": run,
            }
        )
        pieces.append((piece, str(run[0].speaker)))
    return pieces


def _word_with(word: Word, speaker: str | None) -> Word:
    return word.model_copy(update={"speaker": speaker})
