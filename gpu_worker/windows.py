"""Cutting long audio into bounded windows for faster-whisper, and moving segments back in time.

Invariants: the windows returned by `window_bounds` cover the audio exactly once, in order,
without gaps or overlap; none is longer than `window` samples; each cut lies in the quietest
frame of the window's last `search` samples. `shifted` moves a faster-whisper segment (and its
words) by a window's start and clamps it to the window's end, so segments from consecutive
windows stay in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from faster_whisper.transcribe import Segment as WhisperSegment


def window_bounds(
    samples: npt.NDArray[np.float32], *, window: int, search: int, frame: int
) -> Iterator[tuple[int, int]]:
    """(start, end) sample indices of consecutive windows of at most `window` samples."""
    total = int(samples.shape[0])
    search = max(frame, min(search, window // 2))
    start = 0
    while total - start > window:
        latest = start + window
        region = samples[latest - search : latest]
        frames = region[: (region.shape[0] // frame) * frame].reshape(-1, frame)
        # Short-term energy per frame; of equally quiet frames (digital silence) the last,
        # so that windows stay as long as allowed.
        energy = np.einsum("ij,ij->i", frames, frames, dtype=np.float64)
        quietest = energy.shape[0] - 1 - int(np.argmin(energy[::-1]))
        end = latest - search + quietest * frame + frame // 2
        yield start, end
        start = end
    yield start, total


def shifted(segment: WhisperSegment, offset: float, limit: float) -> WhisperSegment:
    """`segment` with its times (and its words' times) moved by `offset`, at most `limit`."""

    def at(seconds: float) -> float:
        return min(float(seconds) + offset, limit)

    words = segment.words
    if words is not None:
        words = [replace(w, start=at(w.start), end=at(w.end)) for w in words]
    return replace(segment, start=at(segment.start), end=at(segment.end), words=words)
