"""Decoding a job's audio to 16 kHz mono float32, stopped as soon as it passes the job's limit.

Invariants:
- A length is the count of samples the decoder produced, never a header's duration, a
  container's index or packet timestamps: a file can state any of those falsely (issue 10: an
  8 h FLAC whose STREAMINFO says 10 s, a VBR MP3 without a Xing header).
- Decoding stops with AudioTooLong as soon as that count passes the limit, so no more than
  the limit plus one frame is ever decoded, whatever the file's size or headers say.
- The samples live in one buffer grown in place (realloc), never in a list of pieces joined
  at the end: peak memory is the audio's own size, not twice it, and never more than the limit.
- A run of packets that decode to nothing is bounded (a file of garbage frames).
- The samples are faster_whisper.decode_audio's: s16 mono from FFmpeg's resampler, / 32768.

The control plane's probe (app/audio.py) opens, decodes and counts a file with the same code
(gpu_worker/decoding.py), so audio it accepted decodes here within the same limit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO, Any

import av
import numpy as np
import numpy.typing as npt

from gpu_worker.decoding import (
    MAX_SAMPLE_RATE,
    OPEN_LIMITS,
    DecodedLength,
    UndecodableAudio,
    decoded_frames,
)

SAMPLE_RATE = 16000
# Native samples resampled at a time: fewer resampler calls for small-frame codecs, and a
# bounded amount held between decoder and buffer (4 MiB of float32 stereo at most).
_GROUP_SAMPLES = 1 << 19
# The resampler may hand back a few samples beyond the native count (its filter's tail).
_RESAMPLER_SLACK = SAMPLE_RATE // 10


class AudioTooLong(Exception):
    """The decoded audio passed the limit; decoding stopped there."""

    def __init__(self, limit_seconds: float) -> None:
        super().__init__(
            f"the audio lasts more than {limit_seconds:.0f} s; the limit is {limit_seconds:.0f} s"
        )
        self.limit_seconds = limit_seconds


class _Samples:
    """A float32 buffer that grows in place up to `limit` samples and refuses to pass it."""

    def __init__(self, capacity: int, limit: int, limit_seconds: float) -> None:
        self.array: npt.NDArray[np.float32] = np.empty(max(capacity, 1), dtype=np.float32)
        self.size = 0
        self.limit = limit
        self.limit_seconds = limit_seconds

    def extend(self, pcm: npt.NDArray[np.int16]) -> None:
        count = pcm.shape[-1]
        end = self.size + count
        if end > self.limit:
            raise AudioTooLong(self.limit_seconds)
        if end > self.array.shape[0]:
            grown = min(self.limit, max(end, self.array.shape[0] * 3 // 2))
            # realloc: large blocks are mmap'd, so glibc moves their pages (mremap) rather
            # than copying; no second full-size buffer exists at any moment.
            self.array.resize(grown, refcheck=False)
        np.divide(pcm.reshape(-1), 32768.0, out=self.array[self.size : end], casting="unsafe")
        self.size = end

    def finish(self) -> npt.NDArray[np.float32]:
        self.array.resize(self.size, refcheck=False)
        return self.array


def decode_bounded(
    source: str | Path | IO[bytes],
    max_seconds: float,
    *,
    expected_seconds: float | None = None,
    stop_after_seconds: float | None = None,
) -> npt.NDArray[np.float32]:
    """The audio as 16 kHz mono float32; AudioTooLong as soon as it passes `max_seconds`.

    `expected_seconds` (the length the control plane measured) only sizes the first buffer.
    `stop_after_seconds`: decoding ends, without error, once that much audio is decoded (a
    part of a long job needs the file only up to its span's end).
    Raises UndecodableAudio, or PyAV's own errors, for what is not decodable audio.
    """
    limit = math.ceil(max_seconds * SAMPLE_RATE) + _RESAMPLER_SLACK
    hint = SAMPLE_RATE * 60 if expected_seconds is None else expected_seconds * SAMPLE_RATE
    samples = _Samples(min(limit, math.ceil(hint) + SAMPLE_RATE), limit, max_seconds)
    length = DecodedLength()
    opened = str(source) if isinstance(source, str | Path) else source
    with av.open(opened, mode="r", metadata_errors="ignore", container_options=OPEN_LIMITS) as c:
        streams = [s for s in c.streams if s.type == "audio"]
        if not streams:
            raise UndecodableAudio("the file has no audio stream")
        fifo: Any = None
        resampler: Any = None
        shape: tuple[str, str, int] | None = None
        for frame in decoded_frames(c, streams[0]):
            if not 0 < frame.sample_rate <= MAX_SAMPLE_RATE:
                raise UndecodableAudio(f"a decoded frame's sample rate is {frame.sample_rate} Hz")
            # A stream may change rate or layout midway (concatenated MP3s): one resampler
            # per shape, the previous one flushed first.
            frame_shape = (frame.format.name, frame.layout.name, frame.sample_rate)
            if frame_shape != shape:
                _drain(fifo, resampler, samples, flush=True)
                fifo, resampler = av.AudioFifo(), _resampler()
                shape = frame_shape
            decoded = length.add(frame.sample_rate, frame.samples)
            if decoded > max_seconds:
                raise AudioTooLong(max_seconds)
            frame.pts = None  # timestamps are not trusted, nor needed to join frames
            fifo.write(frame)
            if fifo.samples >= _GROUP_SAMPLES:
                _drain(fifo, resampler, samples, flush=False)
            if stop_after_seconds is not None and decoded > stop_after_seconds:
                break
        _drain(fifo, resampler, samples, flush=True)
    return samples.finish()


def _resampler() -> Any:
    return av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)


def _drain(fifo: Any, resampler: Any, samples: _Samples, *, flush: bool) -> None:
    if fifo is None:
        return
    grouped = fifo.read() if fifo.samples else None
    outputs = list(resampler.resample(grouped)) if grouped is not None else []
    if flush:
        outputs += resampler.resample(None)
    for out in outputs:
        samples.extend(out.to_ndarray())
