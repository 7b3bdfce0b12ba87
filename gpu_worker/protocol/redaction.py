"""What a worker log line may carry: no credential, no URL, one line, bounded.

The worker cleans each line of its log tail with `clean_log_line` before the line leaves the
process (gpu_worker/telemetry.py); the control plane cleans every line it receives again,
with the same function and the presenting worker's own credential as a secret
(app/observability/views.py), so an old or buggy worker still cannot make it store a secret.

Invariants of `clean_log_line`:
- Every given secret, any URL (any scheme: http, redis, s3, ...; `\\S+` after `://`, so a
  bare `scheme://` is left and nothing empty is replaced), bearer tokens, `key=value`
  secrets, query strings and long hex strings (HMACs, signatures) become placeholders.
- The result is one line: C0 and C1 control characters and U+2028/U+2029 (line and paragraph
  separators, which `str.splitlines` and JavaScript split on) become spaces. Patterns run
  both before and after that replacement, so a control character can neither split a URL
  so that half of it survives nor hide a token from `Bearer\\s+`.
- At most `MAX_LOG_LINE` characters; a longer line is cut and ends with an ellipsis.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A log line in the tail is at most this long, as the worker sends it and as the control
# plane stores it.
MAX_LOG_LINE = 400

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://\S+")
_BEARER = re.compile(r"(?i)\bbearer\s+\S+")
_KEY_VALUE = re.compile(
    r"(?i)\b(token|password|passwd|secret|signature|sig|api[_-]?key|access[_-]?key|"
    r"authorization|credential)s?(\s*[=:]\s*)\S+"
)
_QUERY = re.compile(r"(/[^\s?]*)\?\S+")
_HEX = re.compile(r"\b[0-9A-Fa-f]{32,}\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the secrets, URLs, bearer tokens, `key=value` secrets, queries or hex."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<secret>")
    text = _URL.sub("<url>", text)
    text = _BEARER.sub("Bearer <secret>", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}<secret>", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}?<redacted>", text)
    return _HEX.sub("<secret>", text)


def clean_log_line(text: str, secrets: Iterable[str] = ()) -> str:
    """One line safe to send, store and show to an admin."""
    given = tuple(secrets)
    text = redact(_CONTROL.sub(" ", redact(text, given)), given)
    return text if len(text) <= MAX_LOG_LINE else text[: MAX_LOG_LINE - 1] + "…"
