"""Speaker turns onto a transcript: which speaker said each segment and word (pure functions).

The diarization stage (gpu_worker/diarization.py) finds *when* each speaker talks; this module
decides *who said what*, as WhisperX's `assign_word_speakers` does: a segment (or word) goes to
the speaker whose turns overlap it the longest. Kept free of torch and pyannote so the rules are
tested in the default tier.

Invariants:
- Labels on the transcript are `SPEAKER_00`, `SPEAKER_01`, ... numbered by first appearance in
  the transcript (segments in order, then their words), whatever the clustering called them,
  so the first voice heard is always SPEAKER_00 and no number is skipped.
- `Transcript.speakers` lists exactly the labels some segment or word carries, in label order.
- A segment that no turn overlaps (the recogniser heard speech where the diarizer heard none)
  takes the nearest turn's speaker: every segment of a diarized transcript names a speaker
  once any turn exists. A word no turn overlaps takes its segment's speaker.
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
    """The transcript with `speaker` on each segment (and word, when `words`) and `speakers`."""
    ordered = sorted(turns, key=lambda turn: (turn.start, turn.end))
    raw_segments: list[tuple[Segment, str | None, list[str | None]]] = []
    for segment in transcript.segments:
        speaker = speaker_by_overlap(segment.start, segment.end, ordered)
        if speaker is None:
            speaker = nearest_speaker(segment.start, segment.end, ordered)
        word_speakers: list[str | None] = []
        if words and segment.words:
            word_speakers = [
                speaker_by_overlap(word.start, word.end, ordered) or speaker
                for word in segment.words
            ]
        raw_segments.append((segment, speaker, word_speakers))

    labels: dict[str, str] = {}

    def relabel(raw: str | None) -> str | None:
        if raw is None:
            return None
        if raw not in labels:
            labels[raw] = speaker_label(len(labels))
        return labels[raw]

    segments = []
    for segment, speaker, word_speakers in raw_segments:
        label = relabel(speaker)
        update: dict[str, object] = {"speaker": label}
        if word_speakers and segment.words:
            update["words"] = [
                _word_with(word, relabel(raw))
                for word, raw in zip(segment.words, word_speakers, strict=True)
            ]
        segments.append(segment.model_copy(update=update))
    return transcript.model_copy(update={"segments": segments, "speakers": sorted(labels.values())})


def _word_with(word: Word, speaker: str | None) -> Word:
    return word.model_copy(update={"speaker": speaker})
