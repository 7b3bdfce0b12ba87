"""The control plane's own check of worker log lines before they are stored: redact, then bound.

Workers redact their log tail themselves (gpu_worker/telemetry.py); this is the second,
independent pass, so an old or buggy worker still cannot make the control plane store a
credential or a URL. It removes the presenting worker's own credential wherever it appears,
any URL (any scheme: http, redis, s3, ...), bearer tokens, `key=value` secrets, query
strings and long hex strings (HMACs, signatures), control characters, and cuts the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_STORED_LINE = 400

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://\S*")
_BEARER = re.compile(r"(?i)\bbearer\s+\S+")
_KEY_VALUE = re.compile(
    r"(?i)\b(token|password|passwd|secret|signature|sig|api[_-]?key|access[_-]?key|"
    r"authorization|credential)s?(\s*[=:]\s*)\S+"
)
_QUERY = re.compile(r"(/[^\s?]*)\?\S+")
_HEX = re.compile(r"\b[0-9A-Fa-f]{32,}\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")


def clean_log_line(text: str, secrets: Iterable[str] = ()) -> str:
    """One line safe to store and show to an admin."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<secret>")
    text = _CONTROL.sub(" ", text)
    text = _URL.sub("<url>", text)
    text = _BEARER.sub("Bearer <secret>", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}<secret>", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}?<redacted>", text)
    text = _HEX.sub("<secret>", text)
    return text if len(text) <= MAX_STORED_LINE else text[: MAX_STORED_LINE - 1] + "…"
