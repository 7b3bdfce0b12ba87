"""The one place request text and JSON bodies are checked before anything else reads them.

Invariants: a string that reaches a view, the database or a log has no NUL, no lone
surrogate and (outside free text) no control character, so PostgreSQL never refuses it and a
log line is never split; a JSON body is parsed without recursion errors and nested at most
`MAX_JSON_DEPTH` deep, with finite numbers only. Refusals are `ApiError` 400s with a code.
A body is read through `read_body`, which never holds more than its limit + 1 bytes, declared
length or chunked: a JSON body is at most `MAX_JSON_BYTES`, not the audio upload's limit.
A filename from a client is display text only: no path component, no control or bidi
characters, bounded; it is never used as a path. A name (query parameter, form field, JSON
key) holds one value: a repeated one is refused (`duplicate_field`), since a proxy or WAF in
front may read another of its values than the one this code would.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

from flask import request

from app.errors import ApiError, Refused

MAX_JSON_DEPTH = 32
# A URL job's JSON is a URL and a few short fields; the upload limit is for audio only.
MAX_JSON_BYTES = 64 * 1024
_READ_CHUNK = 64 * 1024
MAX_FILENAME_CHARS = 255
# Free text (a prompt, a failure message) may hold line breaks and tabs; nothing else below
# U+0020 has a meaning in it.
_FREE_TEXT_CONTROLS = frozenset("\t\n\r")
# Unicode categories that never belong in a displayed name: controls, formatting (bidi
# overrides such as U+202E, zero-width joiners), surrogates, private use, unassigned, and
# line/paragraph separators.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def text_problem(value: str, *, free_text: bool = False) -> str | None:
    """Why `value` cannot be stored or shown as it is, or None when it can."""
    for char in value:
        point = ord(char)
        if point == 0:
            return "contains a NUL character"
        if 0xD800 <= point <= 0xDFFF:
            return "contains a lone surrogate (not valid Unicode)"
        if (point < 0x20 or 0x7F <= point < 0xA0) and not (
            free_text and char in _FREE_TEXT_CONTROLS
        ):
            return "contains a control character"
    return None


def check_text(value: str, field: str, *, free_text: bool = False) -> str:
    """`value` unchanged, or ApiError 400 `invalid_text` naming the field (never the value)."""
    problem = text_problem(value, free_text=free_text)
    if problem is not None:
        raise ApiError(400, "invalid_text", f"{field} {problem}")
    return value


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why a parsed JSON value is unacceptable (depth, strings, non-finite numbers), or None.

    Iterative, so a hostile nesting depth cannot exhaust the stack here either.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item, free_text=True)
            if problem is not None:
                return f"a string {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "a number is not finite"
        elif isinstance(item, dict | list):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            children: Iterable[Any] = item.items() if isinstance(item, dict) else item
            for child in children:
                if isinstance(item, dict):
                    key, child_value = child
                    stack.append((key, depth))
                    stack.append((child_value, depth + 1))
                else:
                    stack.append((child, depth + 1))
    return None


MAX_SHOWN_NAME_CHARS = 100


def shown_name(name: Any) -> str:
    """A client's field name as an error message may quote it: bounded, and escaped when it
    holds what `text_problem` refuses."""
    if name is None:
        return "(unnamed)"
    text = str(name)
    if text_problem(text) is not None:
        text = ascii(text)[1:-1]
    return text[:MAX_SHOWN_NAME_CHARS]


def refuse_repeated(names: Iterable[Any], what: str, *, lists: Collection[Any] = ()) -> None:
    """Refuse (`400 duplicate_field`) any of `names` given more than once, all of them named,
    unless it names a list field (`lists`, e.g. `timestamp_granularities[]`)."""
    repeated = [name for name, count in Counter(names).items() if count > 1 and name not in lists]
    if repeated:
        listed = ", ".join(sorted(shown_name(name) for name in repeated))
        raise Refused(
            "duplicate_field", f"{what} given more than once (send one value each): {listed}"
        )


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_body(limit: int) -> bytes:
    """The request body, or ApiError 413 `payload_too_large` once it passes `limit` bytes.

    A declared length over the limit is refused unread; a chunked body is read until it
    ends or passes the limit, so memory never holds more than `limit` + one read.
    """
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, "payload_too_large", f"the request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    received = 0
    stream = request.stream
    while chunk := stream.read(min(_READ_CHUNK, limit + 1 - received)):
        received += len(chunk)
        if received > limit:
            raise ApiError(
                413, "payload_too_large", f"the request body is larger than {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _strict_loads(raw: bytes) -> Any:
    """`raw` parsed; a key given twice in one object, at any depth, is `400 duplicate_field`."""
    try:
        return json.loads(raw, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise Refused(
            "duplicate_field",
            f"JSON field given more than once (send one value each): {shown_name(dup.key)}",
        ) from None


def refuse_duplicate_keys(raw: bytes) -> None:
    """The one duplicate-key rule for a body another parser (pydantic) reads: a key given twice
    is `400 duplicate_field`, as in `request_json`. Any other problem is left to that parser."""
    try:
        _strict_loads(raw)
    except (ValueError, RecursionError):
        return


def request_json(limit: int = MAX_JSON_BYTES) -> Any:
    """The request body parsed as JSON, or ApiError 400 `invalid_json` (never a 500).

    Flask's `get_json(silent=True)` lets `RecursionError` escape and accepts `NaN`; this
    refuses both, and anything `json_problem` refuses. Bodies over `limit` are 413. An
    object with a key twice, at any depth, is `400 duplicate_field` (Python's parser would
    keep the last value, another parser the first).
    """
    raw = read_body(limit)
    try:
        body = _strict_loads(raw)
    except (ValueError, RecursionError):
        raise ApiError(400, "invalid_json", "the request body is not a JSON object") from None
    problem = json_problem(body)
    if problem is not None:
        raise ApiError(400, "invalid_json", f"the request body is refused: {problem}")
    return body


def check_request_text() -> None:
    """Before every request: path parts, query parameters and the idempotency key are clean.

    Form fields and JSON bodies are checked where they are parsed (`request_json`, the views).
    """
    for name, value in (request.view_args or {}).items():
        if isinstance(value, str):
            check_text(value, name)
    for name, value in request.args.items(multi=True):
        check_text(name, "a query parameter name")
        check_text(value, name if text_problem(name) is None else "a query parameter")
    refuse_repeated((name for name, _ in request.args.items(multi=True)), "query parameter")
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        check_text(key, "Idempotency-Key")


def display_filename(raw: str | None) -> str | None:
    """The client's filename as display text: last path component, visible characters only.

    `../../etc/x` becomes `x`, a right-to-left override is dropped, and the result is at most
    `MAX_FILENAME_CHARS`; None when nothing displayable is left.
    """
    if not raw:
        return None
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(
        char for char in name if unicodedata.category(char) not in _HIDDEN_CATEGORIES
    ).strip()
    if name in ("", ".", ".."):
        return None
    return name[:MAX_FILENAME_CHARS]
