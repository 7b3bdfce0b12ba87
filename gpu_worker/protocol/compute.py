"""Which CTranslate2 compute types a device runs: one rule for the config check and the worker.

Invariants:
- `COMPUTE_TYPES` is the closed set a profile (and `MURMUR_COMPUTE_TYPE`) may name, in the
  protocol's order (the order error messages list them in).
- `supported_compute_types` is CTranslate2's own rule (src/types.cc): float16 needs CUDA
  capability >= 7.0; int8 needs >= 7.0 or exactly 6.1; bfloat16 needs >= 8.0. The control
  plane refuses a profile whose server type cannot run its compute type, and the worker
  refuses to start on such a device, by the same function.
"""

from __future__ import annotations

from typing import Literal, get_args

ComputeType = Literal["float16", "float32", "int8", "int8_float16", "int8_float32", "bfloat16"]
COMPUTE_TYPES: tuple[str, ...] = get_args(ComputeType)

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
