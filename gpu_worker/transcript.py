"""The transcript a worker returns: typed records in the shape of docs/worker-protocol.md."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gpu_worker.bounds import MeasuredProbability, MeasuredStatistic, Seconds, Token


class Word(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    word: str
    start: Seconds
    end: Seconds
    probability: MeasuredProbability


class Segment(BaseModel):
    """One decoded segment. Fields a backend cannot measure are None, never invented."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    start: Seconds
    end: Seconds
    text: str
    tokens: list[Token]
    avg_logprob: MeasuredStatistic
    no_speech_prob: MeasuredProbability
    compression_ratio: MeasuredStatistic
    temperature: MeasuredStatistic
    words: list[Word] | None = None


class Transcript(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    language: str
    duration: Seconds
    segments: list[Segment]

    def to_json(self) -> dict[str, Any]:
        """The result body's `transcript`: `words` appears only when word timestamps ran."""
        body = self.model_dump()
        for segment in body["segments"]:
            if segment["words"] is None:
                del segment["words"]
        return body


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
