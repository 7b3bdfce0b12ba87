"""A claimed part of a long job on the worker: its span of the audio, and its times made the file's.

Invariants (gpu_worker/protocol/claim.py, `ClaimedPart`):
- Only [offset_seconds, until_seconds) of the decoded audio is transcribed: the span's samples
  are a view of the decoded array, never a copy of the rest.
- Every time in the part's transcript (segments, words, a segment's `seek`) is shifted by
  the offset, so the control plane receives times of the whole file; `duration` stays the
  span's length.
- A speakers part's turns (`labelled_turns`) are shifted the same way and labelled
  `SPEAKER_00`, ... by first appearance, as the protocol's labels read.
- Nothing else changes: the control plane trims the overlap past the part's end and joins the
  parts (app/jobs/stitch.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpu_worker.protocol.claim import ClaimedPart
from gpu_worker.protocol.transcript import Segment, Transcript, Turn, Word
from gpu_worker.speakers import SpeakerTurn, speaker_label

SAMPLE_RATE = 16000


def span_samples(samples: npt.NDArray[np.float32], part: ClaimedPart) -> npt.NDArray[np.float32]:
    """The part's samples: [offset_seconds, until_seconds) of the 16 kHz audio (a view)."""
    first = min(samples.shape[0], max(0, round(part.offset_seconds * SAMPLE_RATE)))
    last = min(samples.shape[0], max(first, round(part.until_seconds * SAMPLE_RATE)))
    return samples[first:last]


def _word(word: Word, offset: float) -> Word:
    return word.model_copy(update={"start": word.start + offset, "end": word.end + offset})


def _segment(segment: Segment, offset: float) -> Segment:
    update: dict[str, object] = {"start": segment.start + offset, "end": segment.end + offset}
    if segment.seek is not None:  # Whisper's frame offset (100 a second), of the whole file
        update["seek"] = segment.seek + round(offset * 100)
    if segment.words is not None:
        update["words"] = [_word(w, offset) for w in segment.words]
    return segment.model_copy(update=update)


def shifted(transcript: Transcript, offset: float) -> Transcript:
    """The part's transcript with every time moved by `offset` seconds (the whole file's)."""
    if offset == 0:
        return transcript
    segments = [_segment(s, offset) for s in transcript.segments]
    return transcript.model_copy(update={"segments": segments})


def labelled_turns(turns: list[SpeakerTurn], offset: float) -> list[Turn]:
    """The diarizer's turns as a speakers part reports them: times of the whole file, labels
    numbered by first appearance (the diarizer's own are its clustering's)."""
    labels: dict[str, str] = {}
    said = []
    for turn in sorted(turns, key=lambda t: (t.start, t.end)):
        label = labels.setdefault(turn.speaker, speaker_label(len(labels)))
        said.append(Turn(start=turn.start + offset, end=turn.end + offset, speaker=label))
    return said
