"""What a successful claim hands the worker: the job, as `POST .../jobs/<id>/claim` answers it.

Invariants:
- The control plane builds the answer's `job` with `ClaimedJob` (app/internal.py) and the
  worker parses it with the same model (gpu_worker/client.py): one field list.
- Unknown fields are ignored, so a newer control plane may add some; fields an older
  control plane did not send have defaults. Without `max_audio_seconds` the worker applies
  `DEFAULT_MAX_AUDIO_SECONDS`, the control plane's own default `api.max_audio_seconds`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_worker.protocol.capabilities import MAX_SPEAKERS, MIN_SPEAKERS

# The sampling temperatures a job may ask for (OpenAI's range).
MIN_TEMPERATURE = 0.0
MAX_TEMPERATURE = 1.0
# The longest audio accepted when nothing else says (4 h).
DEFAULT_MAX_AUDIO_SECONDS = 4 * 3600.0


class ClaimedJob(BaseModel):
    """The job as the claim returns it: everything the task needs besides its id."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    language: str | None = None
    prompt: str | None = None
    word_timestamps: bool = False
    # transcribe, or translate to English (a multilingual model only).
    task: Literal["transcribe", "translate"] = "transcribe"
    # Speaker labels (a profile with a diarization asset set), within these bounds if given.
    diarize: bool = False
    min_speakers: int | None = Field(default=None, ge=MIN_SPEAKERS, le=MAX_SPEAKERS)
    max_speakers: int | None = Field(default=None, ge=MIN_SPEAKERS, le=MAX_SPEAKERS)
    # Decoding options: the first temperature of the worker's fallback ladder, and
    # VAD off (every profile can: gpu_worker/transcriber.py decodes without it on request).
    temperature: float | None = Field(
        default=None, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, allow_inf_nan=False
    )
    vad_filter: bool = True
    # Signed, expiring and bound to this claim (docs/worker-protocol.md).
    audio_url: str
    duration_seconds: float | None = None
    # The job's length limit: the worker stops decoding past it (gpu_worker/audio.py).
    max_audio_seconds: float | None = Field(default=None, gt=0, allow_inf_nan=False)
