"""Checking that an upload is real audio, by decoding it rather than trusting its name."""

from __future__ import annotations

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
# header of common audio formats sits in the first few KB, so try that first.
_FAST_PROBE = {"probesize": "4096", "analyzeduration": "0"}


def _read_first_frame(path: Path, options: dict[str, str]) -> AudioInfo | None:
    """The file's audio facts after decoding one frame; None when no frame could be read."""
    with av.open(str(path), metadata_errors="ignore", options=options) as container:
        streams = [s for s in container.streams if s.type == "audio"]
        if not streams:
            return None
        stream: Any = streams[0]
        if next(container.decode(stream), None) is None:
            return None
        duration = (
            container.duration / av.time_base
            if container.duration
            else float((stream.duration or 0) * (stream.time_base or 0))
        )
        if duration <= 0:  # no duration in the headers (e.g. browser-recorded webm): count it
            duration = _demuxed_seconds(path)
        return AudioInfo(
            duration_seconds=float(duration),
            codec=stream.codec_context.name,
            sample_rate=int(stream.codec_context.sample_rate or 0),
            channels=int(stream.codec_context.channels or 0),
        )


def _demuxed_seconds(path: Path) -> float:
    """The audio's length from its packets' timestamps (no decoding)."""
    with av.open(str(path), metadata_errors="ignore") as container:
        stream: Any = container.streams.audio[0]
        end = 0.0
        for packet in container.demux(stream):
            if packet.pts is not None and packet.duration is not None and packet.time_base:
                end = max(end, float((packet.pts + packet.duration) * packet.time_base))
        return end


def probe_audio(path: Path, max_seconds: float) -> AudioInfo:
    """Open the file with FFmpeg (PyAV), decode its first audio frame, return its facts.

    Raises ApiError 400 for anything that is not decodable audio and 413 when it is longer than
    the service accepts.
    """
    if path.stat().st_size == 0:
        raise ApiError(400, "empty_file", "the uploaded file is empty")
    info = None
    for options in (_FAST_PROBE, {}):  # then a full probe for what the quick one cannot place
        try:
            info = _read_first_frame(path, options)
        except (av.FFmpegError, ValueError, OSError, StopIteration):
            info = None
        if info is not None:
            break
    if info is None:
        raise ApiError(
            400,
            "invalid_audio",
            "the file is not audio that can be decoded (supported: wav, mp3, m4a, ogg, flac, "
            "webm and other FFmpeg formats)",
        )
    if info.duration_seconds > max_seconds:
        raise ApiError(
            413,
            "audio_too_long",
            f"the audio lasts {info.duration_seconds:.0f} s; the limit is {max_seconds:.0f} s",
        )
    return info
