"""Rendering a stored transcript as json, verbose_json, txt, srt or vtt."""

from __future__ import annotations

import json
import math
from typing import Any, Literal, get_args

from gpu_worker.protocol.bounds import MAX_SECONDS, finite_or_none

TranscriptFormat = Literal["json", "verbose_json", "txt", "text", "srt", "vtt"]
FORMATS: tuple[str, ...] = get_args(TranscriptFormat)

MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "txt": "text/plain; charset=utf-8",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def _seconds(value: Any) -> float:
    """A stored time as a finite number of seconds in range (a bad stored row reads as 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return min(max(float(value), 0.0), MAX_SECONDS)


def _clock(seconds: float, separator: str) -> str:
    millis = round(_seconds(seconds) * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def _segments(transcript: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in transcript.get("segments", []) if str(s.get("text", "")).strip()]


def to_srt(transcript: dict[str, Any]) -> str:
    blocks = []
    for index, seg in enumerate(_segments(transcript), start=1):
        start, end = _clock(seg["start"], ","), _clock(seg["end"], ",")
        blocks.append(f"{index}\n{start} --> {end}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


def to_vtt(transcript: dict[str, Any]) -> str:
    blocks = ["WEBVTT\n"]
    for seg in _segments(transcript):
        start, end = _clock(seg["start"], "."), _clock(seg["end"], ".")
        blocks.append(f"{start} --> {end}\n{seg['text'].strip()}\n")
    return "\n".join(blocks)


def to_verbose_json(transcript: dict[str, Any], *, words: bool = True) -> dict[str, Any]:
    """OpenAI's verbose_json shape (segments, words, usage in seconds)."""
    segments: list[dict[str, Any]] = []
    all_words: list[dict[str, Any]] = []
    for seg in transcript.get("segments", []):
        segments.append(
            {
                "id": seg.get("id", len(segments)),
                "seek": seg.get("seek", 0),
                "start": seg["start"],
                "end": seg["end"],
                "text": seg["text"],
                "tokens": seg.get("tokens", []),
                "temperature": seg.get("temperature", 0.0),
                "avg_logprob": seg.get("avg_logprob", 0.0),
                "compression_ratio": seg.get("compression_ratio", 0.0),
                "no_speech_prob": seg.get("no_speech_prob", 0.0),
            }
        )
        for w in seg.get("words") or []:
            all_words.append({"word": w["word"], "start": w["start"], "end": w["end"]})
    body: dict[str, Any] = {
        "task": transcript.get("task") or "transcribe",
        "language": transcript.get("language", ""),
        "duration": transcript.get("duration", 0.0),
        "text": transcript.get("text", ""),
        "segments": segments,
        "usage": {"type": "duration", "seconds": round(_seconds(transcript.get("duration")))},
    }
    if transcript.get("language_probability") is not None:
        body["language_probability"] = transcript["language_probability"]
    if words and all_words:
        body["words"] = all_words
    return body


def render(transcript: dict[str, Any], fmt: str) -> tuple[str, str]:
    """(body, media type) of the transcript in `fmt`; `fmt` must be one of FORMATS."""
    if fmt == "json":
        # The text, and the language: asked for, or detected (then with its probability).
        short = {"text": transcript.get("text", ""), "language": transcript.get("language")}
        if transcript.get("language_probability") is not None:
            short["language_probability"] = transcript["language_probability"]
        body = json.dumps(finite_or_none(short), allow_nan=False)
    elif fmt == "verbose_json":
        # allow_nan=False: a stored non-finite number is written as null, never as NaN.
        body = json.dumps(finite_or_none(to_verbose_json(transcript)), allow_nan=False)
    elif fmt in ("txt", "text"):
        body = transcript.get("text", "").strip() + "\n"
    elif fmt == "srt":
        body = to_srt(transcript)
    elif fmt == "vtt":
        body = to_vtt(transcript)
    else:
        raise ValueError(fmt)
    return body, MEDIA_TYPES[fmt]
