"""Checking that an upload is real audio, by decoding it rather than trusting its name.

Invariants:
- The length is the count of samples the decoder produced, never a header's duration, a
  container's index or packet timestamps: a file can state any of those falsely (issue 10).
- Reading stops as soon as that count passes the limit (413 audio_too_long), and the work a
  file can cause is bounded whatever it holds: packets in a row that give no audio, CPU time.
- The worker counts the same way (gpu_worker/audio.py, which the control plane does not ship),
  so audio accepted here decodes there within the same limit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av

from app.errors import ApiError


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
# Only audio containers (issue 10 review L3): FFmpeg also has demuxers that open other files
# or URLs an upload names (concat, hls, image2...), which would let the probe read local files
# and measure them instead of the upload. The match is on FFmpeg's demuxer names: "mov" is
# mp4/m4a/mov, "matroska" is mkv/webm, "aac" is ADTS. No protocol but the file itself either.
# Mirrors gpu_worker.audio.AUDIO_DEMUXERS.
AUDIO_DEMUXERS = (
    "wav,w64,mp3,mov,ogg,flac,matroska,aac,aiff,caf,amr,wv,ape,asf,au,tta,ac3,eac3,dts,mpc,mpc8,dsf"
)
_OPEN_LIMITS = {"format_whitelist": AUDIO_DEMUXERS, "protocol_whitelist": "file"}
_FAST_PROBE = {"probesize": "4096", "analyzeduration": "0", "max_size": "16384", **_OPEN_LIMITS}
_FULL_PROBE = {"max_size": "16384", **_OPEN_LIMITS}
# Packets in a row that give no audio before the file counts as garbage: real files have a
# few (encoder priming, a damaged frame); 500 is 10 s of 20 ms Opus packets.
MAX_EMPTY_PACKETS = 500
# CPU seconds the check may spend: a fixed allowance plus what decoding the longest accepted
# audio needs at 250x real time. The slowest common codec (Opus) decodes at 370-900x real time
# on one core of this project's machines, so only a file built to be slow to decode reaches
# it (4 h limit: 62.6 s of CPU).
_CPU_BASE_SECONDS = 5.0
_CPU_REAL_TIME_FACTOR = 250.0
# Checking the CPU clock costs a system call; every 64 packets is often enough.
_CPU_CHECK_EVERY = 64
# The highest rate audio is recorded at (DXD 352.8 kHz, 384 kHz); a header can state any
# number, and resampling from hundreds of MHz costs seconds for a fraction of a second of
# audio. Mirrors gpu_worker.audio.MAX_SAMPLE_RATE.
MAX_SAMPLE_RATE = 384_000


class _NoAudio(Exception):
    """Nothing decodable was found with these probe options."""


def _decoded_frames(container: Any, stream: Any, cpu_deadline: float) -> Iterator[Any]:
    """The stream's decoded frames: damaged packets skipped, a damaged tail ends it, work bounded.

    Mirrors gpu_worker.audio.decoded_frames, plus the CPU bound the API needs.
    """
    packets = container.demux(stream)
    empty_run = 0
    read = 0
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except av.InvalidDataError:
            return
        read += 1
        if read % _CPU_CHECK_EVERY == 0 and time.thread_time() > cpu_deadline:
            raise ApiError(
                413,
                "audio_too_complex",
                "the file takes too much work to decode; re-encode it (e.g. as FLAC or MP3)",
            )
        try:
            frames = packet.decode()
        except av.FFmpegError:  # a damaged packet (InvalidDataError, or worse: AAC gives -50531338)
            frames = []
        if frames:
            empty_run = 0
        elif packet.size:  # the empty packet at the end only flushes the decoder
            empty_run += 1
            if empty_run > MAX_EMPTY_PACKETS:
                raise _NoAudio
        yield from frames


def _measure(
    path: Path, options: dict[str, str], max_seconds: float, cpu_deadline: float
) -> AudioInfo:
    """The file's facts and its decoded length; 413 as soon as the length passes max_seconds."""
    with av.open(str(path), metadata_errors="ignore", options=options) as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            raise _NoAudio
        stream: Any = streams[0]
        decoded_any = False
        # Whole samples per sample rate, divided once: a float sum of frame lengths drifts.
        earlier, run_samples, run_rate = 0.0, 0, 0
        for frame in _decoded_frames(container, stream, cpu_deadline):
            if frame.sample_rate <= 0:
                raise _NoAudio
            if frame.sample_rate > MAX_SAMPLE_RATE:
                raise ApiError(
                    400,
                    "invalid_audio",
                    f"the audio's sample rate ({frame.sample_rate} Hz) is above what audio uses "
                    f"({MAX_SAMPLE_RATE} Hz)",
                )
            if frame.sample_rate != run_rate:
                if run_rate:
                    earlier += run_samples / run_rate
                run_samples, run_rate = 0, frame.sample_rate
            decoded_any = True
            run_samples += frame.samples
            if earlier + run_samples / run_rate > max_seconds:
                raise ApiError(
                    413,
                    "audio_too_long",
                    f"the audio lasts more than {max_seconds:.0f} s; the limit is "
                    f"{max_seconds:.0f} s",
                )
        if not decoded_any:
            raise _NoAudio
        return AudioInfo(
            duration_seconds=earlier + run_samples / run_rate,
            codec=stream.codec_context.name,
            sample_rate=int(stream.codec_context.sample_rate or 0),
            channels=int(stream.codec_context.channels or 0),
        )


def probe_audio(path: Path, max_seconds: float) -> AudioInfo:
    """Open the file with FFmpeg (PyAV), decode its audio up to max_seconds, return its facts.

    Raises ApiError 400 for anything that is not decodable audio and 413 as soon as it is longer
    than the service accepts, or takes more work to decode than such audio could.
    """
    if path.stat().st_size == 0:
        raise ApiError(400, "empty_file", "the uploaded file is empty")
    # One allowance for both attempts: a file the quick probe cannot place gets no second one.
    cpu_deadline = time.thread_time() + _CPU_BASE_SECONDS + max_seconds / _CPU_REAL_TIME_FACTOR
    info = None
    for options in (_FAST_PROBE, _FULL_PROBE):  # a full probe for what the quick one cannot place
        try:
            info = _measure(path, options, max_seconds, cpu_deadline)
        except (_NoAudio, av.FFmpegError, ValueError, OSError, StopIteration):
            info = None
        if info is not None:
            break
    if info is None:
        raise ApiError(
            400,
            "invalid_audio",
            "the file is not audio that can be decoded (supported: wav, mp3, m4a/mp4, ogg/opus, "
            "flac, webm/mkv, aac, aiff, caf, amr, wavpack, ape, wma and other audio containers)",
        )
    return info
