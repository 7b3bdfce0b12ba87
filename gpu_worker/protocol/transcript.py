"""The transcript a worker posts as its result, in the shape of docs/worker-protocol.md.

The worker builds these models (gpu_worker/transcriber.py) and posts
`ResultBody(transcript=..., processing_seconds=...).to_json()` (gpu_worker/client.py); the
control plane validates the result body with the same models (app/internal.py) and stores
the transcript's `model_dump(exclude_none=True)`.

Invariants:
- Unknown fields are ignored (`extra="ignore"`), not refused. The control plane must accept
  a result from a worker newer than itself: refusing it would leave the job running and the
  work lost until the worker gave up, during every rolling upgrade. Dropping the fields keeps
  the rule of docs/worker-protocol.md, "fields the control plane does not know are dropped,
  never stored": only what is declared here reaches the database and the API's JSON. On the
  worker's side nothing is lost by not forbidding them: its models are built with keyword
  arguments, which mypy checks against the declared fields.
- Every number is finite and bounded (gpu_worker/protocol/bounds.py); a non-finite or
  out-of-range number is refused, never clamped. A statistic the decoder could not measure
  is None: the worker says so with `measured()` before building, rather than sending `-inf`.
- Text holds no NUL and no lone surrogate (`StorableText`): PostgreSQL refuses both.
- Fields an older worker may not send have defaults; `to_json()` sends exactly the fields
  the worker set, and `words` only when word timestamps ran.
- Speaker labels (`speaker` on segments and words, `speakers` on the transcript) are set only
  when the job asked for diarization and the worker ran it; they read `SPEAKER_00`,
  `SPEAKER_01`, ... numbered by first appearance (gpu_worker/speakers.py). Absent otherwise,
  so a transcript without diarization keeps its shape.
- A speakers part's result (gpu_worker/protocol/claim.py, `SPEAKERS_PART`) has no text and
  no segments; its `turns` are who speaks when over the whole file, labelled like segments.
  `turns` is absent from every other transcript.
- The result body's envelope (`ResultBody`) is strict (`extra="forbid"`): its two fields are
  the whole envelope; only the transcript inside it tolerates a newer worker's fields.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpu_worker.protocol.bounds import MAX_TOKEN, Probability, Seconds, Statistic, Token


def _storable(value: str) -> str:
    # Free text that PostgreSQL must accept: NUL and lone surrogates are what it refuses.
    if "\x00" in value:
        raise ValueError("contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid Unicode)") from None
    return value


# Text a worker sends (transcripts, failure messages): stored as it is, so it may hold any
# character a model can emit, except the two no database column accepts.
StorableText = Annotated[str, AfterValidator(_storable)]


def measured(value: float | None) -> float | None:
    """A decoder's statistic as the protocol carries it: None when it is not finite.

    A decoder that could not measure a statistic gives -inf or NaN (an empty segment's
    average log probability); the protocol says "None, never invented" for those.
    """
    if value is None or not math.isfinite(value):
        return None
    return float(value)


# A diarization label as the worker numbers it (gpu_worker/speakers.py, `speaker_label`).
SpeakerLabel = Annotated[str, Field(pattern=r"^SPEAKER_[0-9]{2,3}$")]
# More speakers than any clustering finds in practice; the list only has to be bounded.
MAX_SPEAKERS_LISTED = 100
# Turns of a speakers part: one every 0.5 s over the 4-hour maximum, far above real speech.
MAX_TURNS = 30_000


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)


class Word(_Wire):
    word: StorableText
    start: Seconds
    end: Seconds
    probability: Probability | None = None
    speaker: SpeakerLabel | None = None


class Segment(_Wire):
    """One decoded segment. Fields a backend cannot measure are None, never invented."""

    id: int | None = Field(default=None, ge=0, le=MAX_TOKEN)
    seek: int | None = Field(default=None, ge=0, le=MAX_TOKEN)
    start: Seconds
    end: Seconds
    text: StorableText
    tokens: list[Token] | None = None
    avg_logprob: Statistic | None = None
    no_speech_prob: Probability | None = None
    compression_ratio: Statistic | None = None
    temperature: Statistic | None = None
    words: list[Word] | None = None
    speaker: SpeakerLabel | None = None


class Turn(_Wire):
    """One stretch of one speaker's speech, as a speakers part reports it."""

    start: Seconds
    end: Seconds
    speaker: SpeakerLabel


class Transcript(_Wire):
    text: StorableText
    # The language of the audio (ISO 639-1): the job's, or the one the model detected, whose
    # probability is then `language_probability`. A translation's text is English; its
    # `language` is still the audio's.
    language: str | None = Field(default=None, max_length=16, pattern=r"^[A-Za-z_-]*$")
    language_probability: Probability | None = None
    task: Literal["transcribe", "translate"] | None = None
    duration: Seconds = 0.0
    segments: list[Segment]
    # The speakers the segments name, in label order; set only when diarization ran.
    speakers: list[SpeakerLabel] | None = Field(default=None, max_length=MAX_SPEAKERS_LISTED)
    # Who speaks when over the whole file: a speakers part's result only (see the invariants).
    turns: list[Turn] | None = Field(default=None, max_length=MAX_TURNS)

    def to_json(self) -> dict[str, Any]:
        """The result body's `transcript`: the fields the worker set; `words` only when set."""
        body = self.model_dump(exclude_unset=True)
        for segment in body["segments"]:
            if segment.get("words", ()) is None:
                del segment["words"]
        return body


class ResultBody(BaseModel):
    """The result body, `POST .../jobs/<id>/result`: the transcript and the job's duration."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    transcript: Transcript
    # Wall-clock seconds the worker spent on the job, download and decoding included.
    processing_seconds: Seconds

    def to_json(self) -> dict[str, Any]:
        """The body as the worker sends it: the transcript's `to_json()` and the seconds."""
        return {
            "transcript": self.transcript.to_json(),
            "processing_seconds": self.processing_seconds,
        }
