"""The worker's environment: the names of the variables the control plane writes at boot.

Cloud-init (app/fleet/cloudinit.py, `worker_environment` and `render_user_data`) and the
`local` provider (app/fleet/providers/local.py) write them; the worker reads and validates
them before any model loads (gpu_worker/runtime.py). docs/worker-protocol.md, "Environment",
says what each one means and accepts.

Invariants:
- Each name is written here and only here: the writers and the reader use these constants,
  so a renamed variable changes on both sides at once.
- Values are checked on the worker's side alone (fail-closed, one message per variable); the
  control plane writes them from a profile already checked against the closed sets of
  gpu_worker/protocol/runtime.py.
- `IMAGE_PULL_SECONDS_VAR` is written by the instance's pull script into an env file of its
  own, not by the control plane; the worker treats it as informational and never fails on it.
"""

from __future__ import annotations

# Identity and reachability: needed to serve jobs (`WorkerIdentity`).
WORKER_ID_VAR = "MURMUR_WORKER_ID"
INSTANCE_ID_VAR = "MURMUR_INSTANCE_ID"
WORKER_TOKEN_VAR = "MURMUR_WORKER_TOKEN"  # noqa: S105 - the name, not the token
CONTROL_URL_VAR = "MURMUR_CONTROL_URL"
BROKER_URL_VAR = "MURMUR_BROKER_URL"
BROKER_MASTER_NAME_VAR = "MURMUR_BROKER_MASTER_NAME"
BROKER_CA_CERTS_VAR = "MURMUR_BROKER_CA_CERTS"

# The runtime profile (`RuntimeProfile`), reported back at readiness.
PROFILE_VAR = "MURMUR_PROFILE"
MODEL_VAR = "MURMUR_MODEL"
DEVICE_VAR = "MURMUR_DEVICE"
COMPUTE_TYPE_VAR = "MURMUR_COMPUTE_TYPE"
VAD_VAR = "MURMUR_VAD"
ALIGNMENT_DEVICE_VAR = "MURMUR_ALIGNMENT_DEVICE"
BATCH_SIZE_VAR = "MURMUR_BATCH_SIZE"
CPU_THREADS_VAR = "MURMUR_CPU_THREADS"
# The diarization weight set (gpu_worker/models.toml, kind = "diarization"); unset: none.
DIARIZATION_VAR = "MURMUR_DIARIZATION"

# Reporting and lifecycle.
OBSERVABILITY_ENABLED_VAR = "MURMUR_OBSERVABILITY_ENABLED"
REPORT_INTERVAL_VAR = "MURMUR_REPORT_INTERVAL"
DRAIN_TIMEOUT_VAR = "MURMUR_DRAIN_TIMEOUT"
IMAGE_PULL_SECONDS_VAR = "MURMUR_IMAGE_PULL_SECONDS"
