"""Where a long job is cut into parts: a pure function of its duration and its loudness.

The analysis is the audio's loudness in short frames (app/jobs/loudness.py measures it once on
the control plane, from the stored file, with no model). Each cut lies at the quietest moment
near a nominal boundary, so a part ends in a pause and no word is split by the cut itself; the
worker still transcribes `OVERLAP_SECONDS` past its part's end, and the stitch
(app/jobs/stitch.py) keeps each word from the part it starts in.

Invariants (tests/test_cuts.py checks them on random loudness):
- The spans cover [0, duration] in order, with no gap and no overlap: span i ends where span
  i + 1 starts; the first starts at 0, the last ends at the duration.
- A job shorter than `CUT_FACTOR` x part_seconds (or part_seconds 0) is one span: not cut.
- There are n = round(duration / part_seconds) spans, n >= 2 when cut; each cut lies within
  `search_radius` of its nominal boundary k x duration / n, so a span lasts its nominal length
  (duration / n) give or take twice that radius, never less than half of it.
- Each cut is at the lowest smoothed level (mean over `PAUSE_SECONDS`) within its search
  window; among equal levels, the one nearest the nominal boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# A job is cut when it lasts at least this many part lengths (one part and a half): a file
# barely longer than a part gains little from two workers and pays two downloads.
CUT_FACTOR = 1.5
# The analysis frame, and the pause the cut looks for: a cut sits in the middle of the
# quietest window of this length, not on one quiet frame between two syllables.
FRAME_SECONDS = 0.05
PAUSE_SECONDS = 0.4
# How far from its nominal boundary a cut may move: a quarter of a nominal part, at most this.
MAX_SEARCH_SECONDS = 20.0
# Audio a worker transcribes past its part's end, so a word the cut catches is heard whole.
OVERLAP_SECONDS = 2.0
# More parts than this are never made: a 4 h file at the shortest parts is 480.
MAX_PARTS = 500


@dataclass(frozen=True)
class Loudness:
    """The audio's level in dBFS, one value per `frame_seconds` from the start."""

    frame_seconds: float
    levels: npt.NDArray[np.float32]


@dataclass(frozen=True)
class Span:
    """One part of a job: [start, end) seconds of the whole file."""

    index: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def part_count(duration: float, part_seconds: float) -> int:
    """How many parts a job of `duration` seconds is cut into (1: not cut)."""
    if part_seconds <= 0 or duration < CUT_FACTOR * part_seconds:
        return 1
    return min(MAX_PARTS, max(2, round(duration / part_seconds)))


def search_radius(duration: float, count: int) -> float:
    """How far a cut may move from its nominal boundary, for `count` parts."""
    return min(MAX_SEARCH_SECONDS, 0.25 * duration / count)


def _smoothed(loudness: Loudness) -> npt.NDArray[np.float64]:
    levels = np.asarray(loudness.levels, dtype=np.float64)
    width = max(1, round(PAUSE_SECONDS / loudness.frame_seconds))
    if levels.size < width:
        return levels
    # The mean of each window of `width` frames, placed at the window's centre frame.
    sums = np.convolve(levels, np.ones(width) / width, mode="same")
    return np.asarray(sums, dtype=np.float64)


def _quietest(smooth: npt.NDArray[np.float64], frame: float, low: float, high: float) -> float:
    """The time (a frame's centre) of the lowest level in [low, high]; nearest the middle on
    ties. Without frames there, the middle."""
    middle = (low + high) / 2
    first = max(0, math.ceil(low / frame - 0.5))
    last = min(smooth.size - 1, math.floor(high / frame - 0.5))
    if last < first:
        return middle
    window = smooth[first : last + 1]
    lowest = np.flatnonzero(window <= window.min())
    centres = (first + lowest + 0.5) * frame
    return float(centres[np.argmin(np.abs(centres - middle))])


def plan_spans(duration: float, loudness: Loudness, part_seconds: float) -> tuple[Span, ...]:
    """The spans a job of `duration` seconds is cut into (see the invariants)."""
    count = part_count(duration, part_seconds)
    if count == 1:
        return (Span(0, 0.0, duration),)
    nominal = duration / count
    radius = search_radius(duration, count)
    smooth = _smoothed(loudness)
    cuts = [
        _quietest(smooth, loudness.frame_seconds, k * nominal - radius, k * nominal + radius)
        for k in range(1, count)
    ]
    bounds = [0.0, *cuts, duration]
    return tuple(Span(i, bounds[i], bounds[i + 1]) for i in range(count))


def spans_of(bounds: Sequence[tuple[float, float]]) -> tuple[Span, ...]:
    """Spans from stored (start, end) pairs, numbered in order."""
    return tuple(Span(i, float(start), float(end)) for i, (start, end) in enumerate(bounds))
