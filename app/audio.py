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


def probe_audio(path: Path, max_seconds: float) -> AudioInfo:
    """Open the file with FFmpeg (PyAV), decode its first audio frame, return its facts.

    Raises ApiError 400 for anything that is not decodable audio and 413 when it is longer than
    the service accepts.
    """
    if path.stat().st_size == 0:
        raise ApiError(400, "empty_file", "the uploaded file is empty")
    try:
        with av.open(str(path), metadata_errors="ignore") as container:
            streams = [s for s in container.streams if s.type == "audio"]
            if not streams:
                raise ApiError(400, "invalid_audio", "the file contains no audio stream")
            stream: Any = streams[0]
            first_frame = next(container.decode(stream), None)
            if first_frame is None:
                raise ApiError(400, "invalid_audio", "the file contains no audio data")
            duration = (
                container.duration / av.time_base
                if container.duration
                else float((stream.duration or 0) * (stream.time_base or 0))
            )
            info = AudioInfo(
                duration_seconds=float(duration),
                codec=stream.codec_context.name,
                sample_rate=int(stream.codec_context.sample_rate or 0),
                channels=int(stream.codec_context.channels or 0),
            )
    except ApiError:
        raise
    except (av.FFmpegError, ValueError, OSError, StopIteration) as exc:
        raise ApiError(
            400,
            "invalid_audio",
            "the file is not audio that can be decoded (supported: wav, mp3, m4a, ogg, "
            "flac, webm and other FFmpeg formats)",
        ) from exc
    if info.duration_seconds > max_seconds:
        raise ApiError(
            413,
            "audio_too_long",
            f"the audio lasts {info.duration_seconds:.0f} s; the limit is {max_seconds:.0f} s",
        )
    return info
