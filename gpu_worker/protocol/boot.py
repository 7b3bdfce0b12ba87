"""A failed boot as the instance reports it: `POST .../boot-failure` with a stage and a detail.

The instance's boot path (the pull script and the systemd unit that cloud-init writes,
app/fleet/cloudinit.py) calls it when the worker cannot come up: the image did not pull, the
container exited before the worker was ready, or the worker's own fail-closed checks refused
its runtime. It authenticates with the instance credential, like every worker route.

Invariants:
- The body is small and closed: a `stage` from `BootStage` and a `detail` of at most
  `MAX_BOOT_DETAIL` characters without NUL or lone surrogates, secrets redacted
  (`redaction.redact`) by whoever builds it and again by the control plane.
- Only a worker that is not ready yet can fail its boot; the control plane answers a report
  from a ready (or retired) worker without acting on it, so the unit may report every time its
  container stops without knowing whether the worker had become ready.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpu_worker.protocol.redaction import redact
from gpu_worker.protocol.transcript import StorableText

BootStage = Literal[
    "image_pull",  # the worker image did not pull (registry, digest, disk)
    "container_exited",  # the container stopped before the worker reported ready
    "runtime_rejected",  # the worker's own checks refused its runtime (exit 78)
]
BOOT_STAGES: tuple[str, ...] = ("image_pull", "container_exited", "runtime_rejected")
MAX_BOOT_DETAIL = 300


class BootFailure(BaseModel):
    """The body of `POST .../boot-failure`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: BootStage
    detail: StorableText = Field(default="", max_length=MAX_BOOT_DETAIL)

    @classmethod
    def of(cls, stage: BootStage, detail: str) -> BootFailure:
        """The body a sender builds: its detail redacted, then cut to `MAX_BOOT_DETAIL`."""
        return cls(stage=stage, detail=redact(detail)[:MAX_BOOT_DETAIL])

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "detail": self.detail}
