"""What a worker log line may carry: no credential, no URL, one line, bounded.

The worker cleans each line of its log tail with `clean_log_line` before the line leaves the
process (gpu_worker/telemetry.py); the control plane cleans every line it receives again,
with the same function and the presenting worker's own credential as a secret
(app/observability/views.py), so an old or buggy worker still cannot make it store a secret.

Invariants of `clean_log_line`:
- Every given secret, any URL (any scheme: http, redis, s3, ...; `\\S+` after `://`, so a
  bare `scheme://` is left and nothing empty is replaced), `user:password@` userinfo, bearer
  and basic credentials, `key=value` secrets in any notation (`MURMUR_API_TOKEN=…`,
  `AWS_SECRET_ACCESS_KEY=…`, JSON `"password": "…"`, YAML `password: …`, `X-Api-Key: …`),
  well-known token shapes (`hf_…`, `AKIA…`), query strings and long hex strings (HMACs,
  signatures) become placeholders.
- Bidi controls (U+202A-U+202E, U+2066-U+2069), marks and zero-width characters are removed
  first, so none can hide a keyword or reorder what an operator reads.
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
# `user:password@host` without a scheme (a DSN fragment, a git remote).
_USERINFO = re.compile(r"[^\s:/@'\"=]+:[^\s@'\"]+@(?=[A-Za-z0-9\[])")
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")
# A secret's name: a keyword ending at a word part's end (`_`, `.`, `-`, a quote, the end, or
# camelCase's next part), with any prefix and suffix parts: MURMUR_API_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD, HF_TOKEN, STRIPE_KEY, accessToken, "password". Words
# that merely contain a keyword ("keyboard", "tokenizer", "design", "author") are not names.
_NAME_PART = r"[A-Za-z0-9_.\-]"
_KEYWORD = (
    r"(?:token|passw(?:or)?d|pwd|secret|signature|credential|authorization|auth|cookie|"
    r"api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?secret|(?<=[_.\-])(?:key|pass)|"
    r"(?<!" + _NAME_PART + r")sig)s*"
)
_KEY_VALUE = re.compile(
    r"(?i)(?<!"
    + _NAME_PART
    + r")([\"']?"
    + _NAME_PART
    + r"*?"
    + _KEYWORD
    + r"(?-i:(?![a-z]))"
    + _NAME_PART
    + r"*[\"']?)"
    + r"(\s*[=:]\s*)"
    + r"((?:bearer|basic|token|digest)\s+)?"
    + r"(\"(?:[^\"\\]|\\.)*\"?|'[^']*'?|[^\s,;}\]]+)"
)
# Well-known token shapes, whatever carries them.
_KNOWN_TOKEN = re.compile(
    r"\b(?:hf_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abpr]-|sk-|AKIA|ASIA)[A-Za-z0-9_+/=.\-]{12,}"
)
_QUERY = re.compile(r"(/[^\s?]*)\?\S+")
_HEX = re.compile(r"\b[0-9A-Fa-f]{32,}\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# Bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069), marks, and zero-width
# characters: they reorder what a reader sees, or split a keyword so that no pattern sees it.
_INVISIBLE = re.compile(r"[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]+")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the secrets, URLs, bearer tokens, `key=value` secrets (any notation:
    env, JSON, YAML, headers), known token shapes, queries, hex, or invisible characters."""
    text = _INVISIBLE.sub("", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<secret>")
    text = _URL.sub("<url>", text)
    text = _USERINFO.sub("<secret>@", text)
    text = _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}<secret>", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} <secret>", text)
    text = _KNOWN_TOKEN.sub("<secret>", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}?<redacted>", text)
    return _HEX.sub("<secret>", text)


def clean_log_line(text: str, secrets: Iterable[str] = ()) -> str:
    """One line safe to send, store and show to an admin."""
    given = tuple(secrets)
    text = redact(_CONTROL.sub(" ", redact(text, given)), given)
    return text if len(text) <= MAX_LOG_LINE else text[: MAX_LOG_LINE - 1] + "…"
