"""The runtime a profile names and a worker runs with: closed sets, and compute types per device.

A profile's settings (app/config.py) become the worker's environment (`MURMUR_COMPUTE_TYPE`,
`MURMUR_VAD`, `MURMUR_ALIGNMENT_DEVICE`), which the worker validates (gpu_worker/runtime.py)
and reports back at readiness, where the control plane compares them with the profile.

Invariants:
- `DEVICES`, `COMPUTE_TYPES`, `VAD_BACKENDS` and `ALIGNMENT_DEVICES` are the closed sets both
  sides accept, in the protocol's order (the order error messages list them in).
- `supported_compute_types` is CTranslate2's capability rule (docs/runtime.md, "Checks, in
  order"): float16 needs CUDA capability >= 7.0; int8 needs >= 7.0 or exactly 6.1; bfloat16
  needs >= 8.0. The control
  plane refuses a profile whose server type cannot run its compute type, and the worker
  refuses to start on such a device, by the same function.
- The worker process and the unit that runs it agree on `DEFAULT_DRAIN_TIMEOUT_SECONDS` (the
  unit's stop timeout outlasts it) and on `EXIT_RUNTIME_MISMATCH` (the unit does not restart
  a worker the control plane refused).
"""

from __future__ import annotations

from typing import Literal, get_args

Device = Literal["cpu", "cuda"]
ComputeType = Literal["float16", "float32", "int8", "int8_float16", "int8_float32", "bfloat16"]
VadBackend = Literal["silero", "pyannote"]
AlignmentDevice = Literal["cuda", "cpu", "none"]

DEVICES: tuple[str, ...] = get_args(Device)
COMPUTE_TYPES: tuple[str, ...] = get_args(ComputeType)
VAD_BACKENDS: tuple[str, ...] = get_args(VadBackend)
ALIGNMENT_DEVICES: tuple[str, ...] = get_args(AlignmentDevice)

# How long a SIGTERM waits for the running job before handing it back (MURMUR_DRAIN_TIMEOUT).
DEFAULT_DRAIN_TIMEOUT_SECONDS = 600.0
# The worker's exit status when the control plane refuses its runtime (409 runtime_mismatch).
EXIT_RUNTIME_MISMATCH = 3

CPU_COMPUTE_TYPES = frozenset({"float32", "int8", "int8_float32"})


def supported_compute_types(capability: tuple[int, int] | None) -> frozenset[str]:
    """Compute types CTranslate2 runs efficiently on a device of this capability (None = CPU)."""
    if capability is None:
        return CPU_COMPUTE_TYPES
    types = {"float32"}
    if capability >= (7, 0) or capability == (6, 1):
        types |= {"int8", "int8_float32"}
    if capability >= (7, 0):
        types |= {"float16", "int8_float16"}
    if capability >= (8, 0):
        types |= {"bfloat16", "int8_bfloat16"}
    return frozenset(types)
