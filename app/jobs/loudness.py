"""Measuring a stored file's loudness for the cut planner (app/jobs/cuts.py): one decode, no model.

Why this analysis, and here: the cuts need pauses, not speech labels. A level per 50 ms frame
finds them in any recording a person would cut by ear, costs one decode of the file (hundreds
of times real time on one core, the probe's own cost), and runs once, on the control plane,
while the upload is still on local disk, so the parts can be queued with the job. The worker's
Silero VAD would need the model on the control plane (or a round trip through a worker before
any part could start), and its segments are cut again by the worker's own VAD anyway.

Invariants:
- Opened and decoded like the probe (gpu_worker/decoding.py: audio demuxers only, the file
  protocol only, damaged packets skipped); the probe has already accepted the file.
- Decoded in bounded windows: at most one decoded frame and one analysis frame are held
  besides the result, whose size is 20 floats per second of audio; decoding stops after
  `max_seconds`.
- A level is the mean power of the frame's 16 kHz mono samples in dBFS, floored at
  `FLOOR_DB` (digital silence has no logarithm).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import av
import numpy as np

from app.jobs.cuts import FRAME_SECONDS, Loudness, Span, part_count, plan_spans
from gpu_worker.decoding import MAX_SAMPLE_RATE, OPEN_LIMITS, UndecodableAudio, decoded_frames

log = logging.getLogger(__name__)

RATE = 16000
FLOOR_DB = -120.0
_FRAME = round(RATE * FRAME_SECONDS)


class _Levels:
    """Mean power per analysis frame, fed any number of samples at a time."""

    def __init__(self, limit_frames: int) -> None:
        self.levels: list[float] = []
        self._carry = np.zeros(0, dtype=np.float32)
        self._limit = limit_frames

    @property
    def full(self) -> bool:
        return len(self.levels) >= self._limit

    def feed(self, samples: Any) -> None:
        data = np.concatenate([self._carry, np.asarray(samples, dtype=np.float32).reshape(-1)])
        whole = (data.size // _FRAME) * _FRAME
        frames = data[:whole].reshape(-1, _FRAME)
        power = np.mean(np.square(frames, dtype=np.float64), axis=1)
        self.levels.extend(_db(p) for p in power)
        self._carry = data[whole:]

    def finish(self) -> Loudness:
        if self._carry.size:
            self.levels.append(_db(float(np.mean(np.square(self._carry, dtype=np.float64)))))
        kept = self.levels[: self._limit]
        return Loudness(FRAME_SECONDS, np.asarray(kept, dtype=np.float32))


def _db(power: float) -> float:
    return max(FLOOR_DB, 10.0 * math.log10(power)) if power > 0 else FLOOR_DB


def spans_of(path: Path, duration: float, part_seconds: float) -> tuple[Span, ...]:
    """Where a stored file (an upload, a URL job's download) is cut into parts; () when it is
    not. A diarized job is cut too: its speakers part labels the whole file (app/jobs/parts.py).
    The probe has accepted the file, so a loudness pass that fails leaves the job whole."""
    if part_count(duration, part_seconds) == 1:
        return ()
    try:
        loudness = measure_loudness(path, duration + 1.0)
    except Exception as exc:
        log.warning("could not measure loudness; the job is not cut: %s", type(exc).__name__)
        return ()
    return plan_spans(duration, loudness, part_seconds)


def measure_loudness(path: Path, max_seconds: float) -> Loudness:
    """The file's level per `FRAME_SECONDS`, for at most `max_seconds` of audio."""
    levels = _Levels(math.ceil(max_seconds / FRAME_SECONDS))
    with av.open(str(path), metadata_errors="ignore", options=OPEN_LIMITS) as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise UndecodableAudio("the file has no audio stream")
        resampler: Any = None
        shape: tuple[str, str, int] | None = None
        for frame in decoded_frames(container, streams[0]):
            if not 0 < frame.sample_rate <= MAX_SAMPLE_RATE:
                raise UndecodableAudio(f"a decoded frame's sample rate is {frame.sample_rate} Hz")
            frame_shape = (frame.format.name, frame.layout.name, frame.sample_rate)
            if frame_shape != shape:  # a stream may change rate or layout midway
                resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
                shape = frame_shape
            frame.pts = None
            for out in resampler.resample(frame):
                levels.feed(out.to_ndarray())
            if levels.full:
                break
    return levels.finish()
