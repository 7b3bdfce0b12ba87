"""The runtime a profile names and a worker runs with: closed sets, and compute types per device.

A profile's settings (app/config.py) become the worker's environment (`MURMUR_COMPUTE_TYPE`,
`MURMUR_VAD`, `MURMUR_ALIGNMENT_DEVICE`), which the worker validates (gpu_worker/runtime.py)
and reports back at readiness, where the control plane compares them with the profile.

Invariants:
- `DEVICES`, `COMPUTE_TYPES`, `VAD_BACKENDS` and `ALIGNMENT_DEVICES` are the closed sets both
  sides accept, in the protocol's order (the order error messages list them in).
- CTranslate2's capability rule (docs/runtime.md, "Checks, in order") is stated once, in
  `_CUDA_CAPABILITY`: float16 needs CUDA capability >= 7.0; int8 needs >= 7.0 or exactly 6.1;
  bfloat16 needs >= 8.0. `supported_compute_types` and `capability_requirement` (the words
  every message uses) are read from it. The control plane refuses a profile whose server type
  cannot run its compute type, and a worker whose GPU cannot, and the worker refuses to start
  on such a device, by the same rule.
- Alignment on `cuda` needs the ASR runtime on `cuda` (`alignment_fits`): the control plane
  refuses such a profile on a CPU-only server type, the worker such an environment.
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

# A CUDA capability, (major, minor).
Capability = tuple[int, int]

CPU_COMPUTE_TYPES = frozenset({"float32", "int8", "int8_float32"})

# CTranslate2's capability rule, per compute type on a GPU: the lowest capability that runs it
# efficiently, and the older ones that run it too (6.1, the Pascal boards with fast int8).
_CUDA_CAPABILITY: dict[str, tuple[Capability, frozenset[Capability]]] = {
    "float32": ((0, 0), frozenset()),
    "int8": ((7, 0), frozenset({(6, 1)})),
    "int8_float32": ((7, 0), frozenset({(6, 1)})),
    "float16": ((7, 0), frozenset()),
    "int8_float16": ((7, 0), frozenset()),
    "bfloat16": ((8, 0), frozenset()),
    "int8_bfloat16": ((8, 0), frozenset()),
}


def supported_compute_types(capability: Capability | None) -> frozenset[str]:
    """Compute types CTranslate2 runs efficiently on a device of this capability (None = CPU)."""
    if capability is None:
        return CPU_COMPUTE_TYPES
    return frozenset(
        name
        for name, (lowest, also) in _CUDA_CAPABILITY.items()
        if capability >= lowest or capability in also
    )


def capability_requirement(compute_type: str) -> str | None:
    """The CUDA capability `compute_type` needs, in words; None for a type no GPU runs.

    `"CUDA capability >= 7.0"` for float16, `"CUDA capability >= 7.0 or exactly 6.1"` for int8.
    """
    rule = _CUDA_CAPABILITY.get(compute_type)
    if rule is None:
        return None
    (major, minor), also = rule
    if (major, minor) == (0, 0):
        return "any CUDA capability"
    older = "".join(f" or exactly {m}.{n}" for m, n in sorted(also))
    return f"CUDA capability >= {major}.{minor}{older}"


def alignment_fits(device: str, alignment_device: str) -> bool:
    """Whether word alignment on `alignment_device` can run beside an ASR runtime on `device`.

    CUDA alignment needs a GPU: `cuda` alignment beside a `cpu` runtime means the profile and
    the server it was written for disagree.
    """
    return not (alignment_device == "cuda" and device == "cpu")
