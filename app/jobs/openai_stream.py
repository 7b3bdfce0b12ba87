"""OpenAI's `stream=true` for POST /v1/audio/transcriptions, from a job's events.

OpenAI's `CreateTranscriptionResponseStreamEvent` (openai/openai-openapi): `transcript.text.delta`
events as segments are transcribed, `transcript.text.segment` events (with speakers) when
`response_format` is `diarized_json`, and one `transcript.text.done` with the whole text. Each is
one `data:` line of JSON; the official SDK iterates them with `stream=True`.

Invariants:
- The deltas concatenate to the done event's text, which is the stored transcript's (the same
  text the non-streaming answer has): a delta is sent only where the text so far extends what
  was sent (trailing whitespace is held back, as the transcript's text is stripped); whatever
  the stored text adds at the end is one last delta before `done`. Only a redelivered job whose
  new attempt decoded an earlier part differently can break this, and then `done.text` (the
  transcript) is what counts.
- A job that fails or is cancelled, and any error after the stream started, is one event
  `{"error": {...}}` (the SDK raises it as an APIError), never a truncated stream.
- `usage` is OpenAI's token usage (the only kind its done event takes): `output_tokens` are the
  decoded text tokens, `input_tokens` the audio's encoder positions (Whisper encodes each
  30 s window as 1,500, 50 per second), docs/api.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from app.jobs.event_stream import Emitted
from app.jobs.formats import to_diarized_json

# Whisper's encoder: 1,500 positions per 30 s window.
AUDIO_TOKENS_PER_SECOND = 50


def _extension(sent: str, text: str) -> str:
    """What `text` adds to `sent` ("" when it does not extend it)."""
    return text[len(sent) :] if text.startswith(sent) else ""


def usage(transcript: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `TranscriptTextUsageTokens` for a transcript (module docstring)."""
    duration = float(transcript.get("duration") or 0.0)
    audio = math.ceil(max(0.0, duration) * AUDIO_TOKENS_PER_SECOND)
    output = sum(len(seg.get("tokens") or []) for seg in transcript.get("segments", []))
    return {
        "type": "tokens",
        "input_tokens": audio,
        "input_token_details": {"audio_tokens": audio, "text_tokens": 0},
        "output_tokens": output,
        "total_tokens": audio + output,
    }


def _failure(job: dict[str, Any]) -> dict[str, Any]:
    error = job.get("error") or {}
    if job.get("status") == "cancelled":
        code, message = "job_cancelled", f"job {job.get('id')} was cancelled"
    else:
        code = error.get("code") or "transcription_failed"
        message = error.get("message") or "the transcription failed"
    kind = "invalid_request_error" if job.get("status") == "cancelled" else "server_error"
    return {"error": {"code": code, "message": message, "type": kind, "param": None}}


def _finish(
    job: dict[str, Any], transcript: dict[str, Any], sent: str, diarized: bool
) -> Iterator[dict[str, Any]]:
    if job.get("status") != "succeeded":
        yield _failure(job)
        return
    text = str(transcript.get("text", ""))
    rest = _extension(sent, text)
    if rest:
        yield {"type": "transcript.text.delta", "delta": rest}
    if diarized:
        yield from to_diarized_json(transcript)["segments"]
    yield {"type": "transcript.text.done", "text": text, "usage": usage(transcript)}


def openai_events(
    events: Iterator[Emitted | None],
    transcript: Callable[[], dict[str, Any]],
    *,
    diarized: bool,
) -> Iterator[dict[str, Any] | None]:
    """OpenAI's stream events (`None`: a heartbeat) from a job's events (module docstring)."""
    texts: list[str] = []  # the current attempt's segment texts
    sent = ""
    for emitted in events:
        if emitted is None:
            yield None
        elif emitted.kind == "attempt":
            texts = []
        elif emitted.kind == "segment":
            texts.append(str(emitted.data.get("text", "")))
            delta = _extension(sent, "".join(texts).strip())
            if delta:
                sent += delta
                yield {"type": "transcript.text.delta", "delta": delta}
        elif emitted.kind == "done":
            job = emitted.data
            stored = transcript() if job.get("status") == "succeeded" else {}
            yield from _finish(job, stored, sent, diarized)
            return


def data_line(event: dict[str, Any] | None) -> str:
    """One event as OpenAI writes it (a `data:` line), or a heartbeat comment."""
    if event is None:
        return ": heartbeat\n\n"
    return f"data: {json.dumps(event, separators=(',', ':'), allow_nan=False)}\n\n"
