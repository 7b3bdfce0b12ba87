"""A job's failure as the worker reports it: `POST .../jobs/<id>/failure` with a code and a message.

Invariants:
- The control plane accepts any code matching `FAILURE_CODE_PATTERN` (a newer worker may
  have new ones) and a message of at most `MAX_FAILURE_MESSAGE` characters without NUL or
  lone surrogates (`Failure`); the worker cuts its message to that length, so a long error
  text never loses the failure.
- The worker builds the body with `Failure` and sends `to_json()` (gpu_worker/client.py);
  the control plane parses it with the same model (app/internal.py).
- `FailureCode` lists the codes this worker sends. `CLIENT_FAILURES` are those caused by
  what the client sent: the synchronous endpoint answers them as 4xx, not 502. `CANCELLED`
  frees the worker and is never stored: the job was cancelled on the control plane first.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_worker.protocol.transcript import StorableText

FailureCode = Literal[
    "audio_too_large",  # the download passed the worker's byte cap
    "audio_download_failed",
    "audio_too_long",  # the decoded audio passed the job's length limit
    "audio_decode_failed",
    "unsupported_language",
    "transcription_failed",
    "diarization_failed",  # the diarization stage failed, or this worker cannot diarize
    "worker_error",  # anything else that went wrong on the worker
    "cancelled",
]
CANCELLED: FailureCode = "cancelled"
CLIENT_FAILURES: frozenset[str] = frozenset(
    {"audio_decode_failed", "audio_too_large", "audio_too_long", "unsupported_language"}
)

FAILURE_CODE_PATTERN = r"^[a-z0-9_]{1,64}$"
MAX_FAILURE_MESSAGE = 2000


class Failure(BaseModel):
    """The failure body, `POST .../jobs/<id>/failure`: a code and a message."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str = Field(pattern=FAILURE_CODE_PATTERN)
    message: StorableText = Field(max_length=MAX_FAILURE_MESSAGE)

    @classmethod
    def of(cls, code: str, message: str) -> Failure:
        """The body the worker sends: its message cut to `MAX_FAILURE_MESSAGE` characters."""
        return cls(code=code, message=message[:MAX_FAILURE_MESSAGE])

    def to_json(self) -> dict[str, Any]:
        """The body as the worker sends it."""
        return {"code": self.code, "message": self.message}
