"""The body of a worker's progress report (routes.PROGRESS), sent at its per-segment checkpoint.

`seq` numbers the reports of one claim from 1; the control plane takes the attempt from the job
(a redelivered job's claim is a new attempt), so a retried report is applied once. The segments
are those finished since the previous report: text and times only, never a credential or URL.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# A report is small: the control plane refuses bodies past MAX_PROGRESS_BYTES.
MAX_PROGRESS_BYTES = 256 * 1024
MAX_SEGMENTS = 64


class ProgressWord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: float
    end: float
    word: str = Field(max_length=200)
    probability: float | None = None


class ProgressSegment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int = Field(ge=0)
    start: float = Field(ge=0)
    end: float = Field(ge=0)
    text: str = Field(max_length=4000)
    speaker: str | None = Field(default=None, max_length=64)
    words: list[ProgressWord] | None = Field(default=None, max_length=2000)


class ProgressBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1)
    done_seconds: float = Field(ge=0, le=1e7)
    total_seconds: float = Field(ge=0, le=1e7)
    segments: list[ProgressSegment] = Field(default_factory=list, max_length=MAX_SEGMENTS)
