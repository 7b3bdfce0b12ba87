"""What a successful claim hands the worker: the job, as `POST .../jobs/<id>/claim` answers it.

Invariants:
- The control plane builds the answer's `job` with `ClaimedJob` (app/internal.py) and the
  worker parses it with the same model (gpu_worker/client.py): one field list.
- Unknown fields are ignored, so a newer control plane may add some; fields an older
  control plane did not send have defaults. Without `max_audio_seconds` the worker applies
  `DEFAULT_MAX_AUDIO_SECONDS`, the control plane's own default `api.max_audio_seconds`.
- A field whose meaning an older worker would get
  wrong by ignoring it (`part`) is sent only to a worker whose readiness runtime lists the
  feature (`features`, gpu_worker/protocol/readiness.py): a part is never claimed by a worker
  that would transcribe the whole file for it.
- A part (`ClaimedPart`) is transcribed over [offset_seconds, until_seconds) of the job's
  audio only, and every time in its transcript is of the whole file (the offset added).
- A diarized job's speakers part (`kind="speakers"`) is diarized, not transcribed, over the
  whole file; its result carries speaker turns and no text (`Transcript.turns`). It is handed
  only to a worker that lists `SPEAKER_PARTS` as well: an older one would transcribe the file.
  The job's other parts come with `diarize` false: their speakers are assigned after the join.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_worker.protocol.capabilities import MAX_SPEAKERS, MIN_SPEAKERS

# The sampling temperatures a job may ask for (OpenAI's range).
MIN_TEMPERATURE = 0.0
MAX_TEMPERATURE = 1.0
# The claim feature a worker lists in its readiness runtime when it transcribes parts.
PARTS = "parts"
# ... and the one it lists when it also runs a diarized job's speakers part.
SPEAKER_PARTS = "speaker_parts"
# A part's kinds: a span to transcribe, or the speakers of the whole file (diarization only).
PartKind = Literal["transcribe", "speakers"]
TRANSCRIBE_PART: PartKind = "transcribe"
SPEAKERS_PART: PartKind = "speakers"
# The longest audio accepted when nothing else says (4 h).
DEFAULT_MAX_AUDIO_SECONDS = 4 * 3600.0


class ClaimedPart(BaseModel):
    """The span of the job's audio a part's claim asks for (app/jobs/parts.py cuts it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0)
    count: int = Field(ge=1)
    # Transcribe [offset_seconds, until_seconds) of the audio; shift every time by the offset.
    offset_seconds: float = Field(ge=0, allow_inf_nan=False)
    until_seconds: float = Field(gt=0, allow_inf_nan=False)
    # What the worker does with the span: transcribe it, or find who speaks when in it.
    kind: PartKind = TRANSCRIBE_PART


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
    # Set when the claimed id is a part of a long job: only that span is transcribed.
    part: ClaimedPart | None = None
