"""What each provider server type carries: GPU model, GPU count and CUDA capability.

The table is small on purpose: a profile may only name a server type listed here, so a
typo or an untested machine never reaches the provider. Capabilities are NVIDIA's
published compute capabilities; prices are read from configuration, not from here.

Invariant: a profile's device (`MURMUR_DEVICE`, and what readiness expects) is
`server_device(profile.server_type)`: `cuda` on a type with a GPU, `cpu` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_worker.protocol.runtime import Device


@dataclass(frozen=True)
class ServerType:
    name: str
    gpu: str | None  # None for CPU-only types
    gpu_count: int
    cuda_capability: tuple[int, int] | None
    # Zones that offer the type (Scaleway's availability page, Dec 2025); empty = not checked.
    zones: frozenset[str] = frozenset()
    # The billing increment: Scaleway bills GPU Instances per minute while powered on,
    # RENDER-S per started hour (its instances FAQ, Oct 2025).
    billing_seconds: int = 60

    @property
    def device(self) -> Device:
        """Where a worker on this type runs its ASR model: `cuda` with a GPU, else `cpu`."""
        return "cpu" if self.gpu is None else "cuda"


_PAR2_WAW2 = frozenset({"fr-par-2", "pl-waw-2"})


_TYPES = [
    ServerType("RENDER-S", "P100", 1, (6, 0), frozenset({"fr-par-1"}), billing_seconds=3600),
    ServerType("L4-1-24G", "L4", 1, (8, 9), _PAR2_WAW2),
    ServerType("L4-2-24G", "L4", 2, (8, 9), _PAR2_WAW2),
    ServerType("L4-4-24G", "L4", 4, (8, 9), _PAR2_WAW2),
    ServerType("L4-8-24G", "L4", 8, (8, 9), _PAR2_WAW2),
    ServerType("L40S-1-48G", "L40S", 1, (8, 9), _PAR2_WAW2),
    ServerType("L40S-2-48G", "L40S", 2, (8, 9), _PAR2_WAW2),
    ServerType("L40S-4-48G", "L40S", 4, (8, 9), _PAR2_WAW2),
    ServerType("L40S-8-48G", "L40S", 8, (8, 9), _PAR2_WAW2),
    ServerType("H100-1-80G", "H100-PCIe", 1, (9, 0), _PAR2_WAW2),
    ServerType("H100-2-80G", "H100-PCIe", 2, (9, 0), _PAR2_WAW2),
    ServerType("H100-SXM-2-80G", "H100-SXM", 2, (9, 0), frozenset({"fr-par-2"})),
    ServerType("H100-SXM-4-80G", "H100-SXM", 4, (9, 0), frozenset({"fr-par-2"})),
    ServerType("H100-SXM-8-80G", "H100-SXM", 8, (9, 0), frozenset({"fr-par-2"})),
    # The local provider's "instance" is a subprocess on this machine's CPU.
    ServerType("local-cpu", None, 0, None, billing_seconds=1),
]

SERVER_TYPES: dict[str, ServerType] = {t.name: t for t in _TYPES}


def server_device(server_type: str) -> Device:
    """The device a profile on `server_type` runs on; `cpu` for a type not in the table."""
    known = SERVER_TYPES.get(server_type)
    return known.device if known is not None else "cpu"


def billed_seconds(server_type: str, seconds: float) -> float:
    """What `seconds` of a server cost in billed time: every started increment counts in full
    (an unknown type is counted by the hour, the largest increment, to err on the safe side)."""
    if seconds <= 0:
        return 0.0
    known = SERVER_TYPES.get(server_type)
    step = known.billing_seconds if known is not None else 3600
    return float(math.ceil(seconds / step) * step)
