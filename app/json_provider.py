"""The API's JSON encoder: every response is valid JSON, whatever a stored row holds.

A non-finite float is written as null rather than as `NaN`/`Infinity` (which no strict JSON
parser accepts); the wire types of gpu_worker/protocol/bounds.py keep new ones out, this keeps
a row stored before them from breaking a whole listing.
"""

from __future__ import annotations

from typing import Any

from flask.json.provider import DefaultJSONProvider

from gpu_worker.protocol.bounds import finite_or_none


class FiniteJSONProvider(DefaultJSONProvider):
    sort_keys = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("allow_nan", False)
        try:
            return super().dumps(obj, **kwargs)
        except ValueError:
            # Only a body holding NaN/Infinity pays for the walk (allow_nan=False refused it).
            return super().dumps(finite_or_none(obj), **kwargs)
