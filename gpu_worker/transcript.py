"""Helpers the backends share to build a transcript (gpu_worker/protocol/transcript.py's models)."""

from __future__ import annotations

from gpu_worker.protocol.transcript import Segment, Word


def join_text(segments: list[Segment]) -> str:
    # Whisper segment texts carry their own leading space; stripping the join gives the
    # same text OpenAI's API returns, and "" for silence.
    return "".join(segment.text for segment in segments).strip()


def monotonic_words(words: list[Word], floor: float) -> list[Word]:
    """Clamp word times so they never go backwards (the protocol promises non-decreasing)."""
    result = []
    for word in words:
        start = max(word.start, floor)
        end = max(word.end, start)
        result.append(word.model_copy(update={"start": start, "end": end}))
        floor = end
    return result
