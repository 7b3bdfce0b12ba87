"""Finite, bounded numbers: the only float types a schema crossing the wire may use.

Both sides import these (the worker to build its transcript, the control plane to accept a
result or a usage report). `Field(ge=0)` alone admits `Infinity`, `NaN` never compares, and
JSON parsers read `1e400` as infinity; one stored non-finite value later makes every listing
invalid JSON. So every float type here refuses non-finite input (`allow_inf_nan=False`) and
has both bounds, generous enough for any real measurement, tight enough for any consumer.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import Field

# Ten years: longer than any audio, uptime or processing total a worker can report.
MAX_SECONDS = 10 * 365 * 86400.0
# Scores and statistics (log probabilities, compression ratios, temperatures): any real one
# is within a few hundred of zero.
MAX_STATISTIC = 1e9
# Token ids of every Whisper vocabulary fit in 32 bits.
MAX_TOKEN = 2**31 - 1

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Statistic = Annotated[float, Field(ge=-MAX_STATISTIC, le=MAX_STATISTIC, allow_inf_nan=False)]
Token = Annotated[int, Field(ge=0, le=MAX_TOKEN)]


def finite_or_none(value: Any) -> Any:
    """`value` with every non-finite float (at any depth) replaced by None.

    For output built from stored rows: a value stored before the wire types refused
    non-finite numbers must not turn a whole answer into invalid JSON.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value
