"""The control plane's internal routes a worker calls: one list of paths for both sides.

The worker builds every request path from these templates (gpu_worker/client.py,
gpu_worker/reporter.py); the control plane routes the same templates (app/internal.py,
app/observability/views.py) through `flask_rule`. docs/worker-protocol.md, "HTTP", says what
each route takes and answers; the bodies are this package's models (`ReadyBody` in
readiness.py, `ResultBody` in transcript.py, `Failure` in failure.py, `UsageReport` in
usage.py, `BootFailure` in boot.py), the claim's answer `ClaimedJob` in claim.py.

Invariants:
- Every route lies under `INTERNAL_PREFIX`. A worker's own routes (all but `AUDIO`) lie
  under `WORKER_PREFIX`, which names the worker id and instance id its credential is bound
  to; the job routes are `/jobs/{job_id}/<action>` below that.
- Templates hold `{name}` placeholders and nothing else that varies. `worker_prefix`,
  `job_route` and `audio_path` fill each with its id percent-encoded as one path segment
  (`quote(id, safe="")`), so an id can never reach another route (`../ready` is sent as
  `..%2Fready`).
- `flask_rule` writes a template in the control plane's rule syntax (`{job_id}` as
  `<job_id>`), so both sides route by the same text.
"""

from __future__ import annotations

import re
from urllib.parse import quote

INTERNAL_PREFIX = "/internal"
# Below INTERNAL_PREFIX: every route a worker calls with its credential.
WORKER_PREFIX = "/workers/{worker_id}/{instance_id}"

# Below WORKER_PREFIX.
READY = "/ready"
HEARTBEAT = "/heartbeat"
REPORT = "/report"
CLAIM = "/jobs/{job_id}/claim"
STATUS = "/jobs/{job_id}/status"
RELEASE = "/jobs/{job_id}/release"
RESULT = "/jobs/{job_id}/result"
FAILURE = "/jobs/{job_id}/failure"
# Hot progress at the per-segment checkpoint (gpu_worker/protocol/progress.py).
PROGRESS = "/jobs/{job_id}/progress"
# The instance's boot path says the worker cannot come up (gpu_worker/protocol/boot.py).
BOOT_FAILURE = "/boot-failure"

# Below INTERNAL_PREFIX, without a credential: the signed, expiring audio URL a claim issues.
AUDIO = "/audio/{job_id}"

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _segment(value: str) -> str:
    return quote(value, safe="")


def worker_prefix(worker_id: str, instance_id: str) -> str:
    """`/internal/workers/<worker id>/<instance id>`: where this worker's routes start."""
    return INTERNAL_PREFIX + WORKER_PREFIX.format(
        worker_id=_segment(worker_id), instance_id=_segment(instance_id)
    )


def job_route(route: str, job_id: str) -> str:
    """A job route (`CLAIM`, `STATUS`, `RELEASE`, `RESULT`, `FAILURE`) for job `job_id`."""
    return route.format(job_id=_segment(job_id))


def audio_path(job_id: str) -> str:
    """The path of job `job_id`'s audio; a claim appends the signature as the query."""
    return INTERNAL_PREFIX + AUDIO.format(job_id=_segment(job_id))


def flask_rule(*templates: str) -> str:
    """The templates joined, in Werkzeug's rule syntax: `{job_id}` becomes `<job_id>`."""
    return _PLACEHOLDER.sub(r"<\1>", "".join(templates))
