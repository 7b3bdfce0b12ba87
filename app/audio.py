"""Checking that an upload is real audio, by decoding it rather than trusting its name.

Invariants:
- The length is the count of samples the decoder produced, never a header's duration, a
  container's index or packet timestamps: a file can state any of those falsely (issue 10).
- Reading stops as soon as that count passes the limit (413 audio_too_long), and the work a
  file can cause is bounded whatever it holds: packets in a row that give no audio, CPU time.
- The worker counts the same way, with the same code (gpu_worker/decoding.py), so audio
  accepted here decodes there within the same limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av

from app.errors import Refused
from gpu_worker.decoding import (
    MAX_SAMPLE_RATE,
    OPEN_LIMITS,
    DecodedLength,
    UndecodableAudio,
    decoded_frames,
)


@dataclass(frozen=True)
class AudioInfo:
    duration_seconds: float
    codec: str
    sample_rate: int
    channels: int


# FFmpeg's default probe reads up to 5 MB and analyses streams (about 3 ms a file); the
# header of common audio formats sits in the first few KB, so try that first. `max_size` is
# the WAV demuxer's packet size (other demuxers ignore it): 16 KB packets count a 90 s WAV in
# about 1 ms (4 KB: 2.3 ms; larger ones are slower again). bench/long_audio.py measures the
# probe's cost per format; docs/performance.md has the figures.
# Only audio containers, and no protocol but the file itself (gpu_worker/decoding.py).
_FAST_PROBE = {"probesize": "4096", "analyzeduration": "0", "max_size": "16384", **OPEN_LIMITS}
_FULL_PROBE = {"max_size": "16384", **OPEN_LIMITS}
# CPU seconds the check may spend: a fixed allowance plus what decoding the longest accepted
# audio needs at 250x real time. The slowest common codec (Opus) decodes at 370-900x real time
# on one core of this project's machines, so only a file built to be slow to decode reaches
# it (4 h limit: 62.6 s of CPU).
_CPU_BASE_SECONDS = 5.0
_CPU_REAL_TIME_FACTOR = 250.0
# Checking the CPU clock costs a system call; every 64 packets is often enough.
_CPU_CHECK_EVERY = 64


def _cpu_bound(cpu_deadline: float) -> Callable[[int], None]:
    """A packet hook that refuses the file once decoding it has used up its CPU allowance."""

    def check(read: int) -> None:
        if read % _CPU_CHECK_EVERY == 0 and time.thread_time() > cpu_deadline:
            raise Refused(
                "audio_too_complex",
                "the file takes too much work to decode; re-encode it (e.g. as FLAC or MP3)",
            )

    return check


def _measure(
    path: Path, options: dict[str, str], max_seconds: float, cpu_deadline: float
) -> AudioInfo:
    """The file's facts and its decoded length; 413 as soon as the length passes max_seconds."""
    with av.open(str(path), metadata_errors="ignore", options=options) as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise UndecodableAudio("the file has no audio stream")
        stream: Any = streams[0]
        length = DecodedLength()
        for frame in decoded_frames(container, stream, _cpu_bound(cpu_deadline)):
            if frame.sample_rate <= 0:
                raise UndecodableAudio("a decoded frame has no sample rate")
            if frame.sample_rate > MAX_SAMPLE_RATE:
                raise Refused(
                    "invalid_audio",
                    f"the audio's sample rate ({frame.sample_rate} Hz) is above what audio uses "
                    f"({MAX_SAMPLE_RATE} Hz)",
                )
            if length.add(frame.sample_rate, frame.samples) > max_seconds:
                raise Refused(
                    "audio_too_long",
                    f"the audio lasts more than {max_seconds:.0f} s; the limit is "
                    f"{max_seconds:.0f} s (the setting api.max_audio_seconds)",
                )
        if not length.frames:
            raise UndecodableAudio("no audio decoded")
        return AudioInfo(
            duration_seconds=length.seconds,
            codec=stream.codec_context.name,
            sample_rate=int(stream.codec_context.sample_rate or 0),
            channels=int(stream.codec_context.channels or 0),
        )


def probe_audio(path: Path, max_seconds: float) -> AudioInfo:
    """Open the file with FFmpeg (PyAV), decode its audio up to max_seconds, return its facts.

    Refuses (`invalid_audio`, `empty_file`) anything that is not decodable audio, and
    (`audio_too_long`, `audio_too_complex`) audio longer than the service accepts, or that
    takes more work to decode than such audio could, as soon as that shows.
    """
    if path.stat().st_size == 0:
        raise Refused("empty_file", "the uploaded file is empty")
    # One allowance for both attempts: a file the quick probe cannot place gets no second one.
    cpu_deadline = time.thread_time() + _CPU_BASE_SECONDS + max_seconds / _CPU_REAL_TIME_FACTOR
    info = None
    for options in (_FAST_PROBE, _FULL_PROBE):  # a full probe for what the quick one cannot place
        try:
            info = _measure(path, options, max_seconds, cpu_deadline)
        except (UndecodableAudio, av.FFmpegError, ValueError, OSError, StopIteration):
            info = None
        if info is not None:
            break
    if info is None:
        raise Refused(
            "invalid_audio",
            "the file is not audio that can be decoded (supported: wav, mp3, m4a/mp4, ogg/opus, "
            "flac, webm/mkv, aac, aiff, caf, amr, wavpack, ape, wma and other audio containers)",
        )
    return info
