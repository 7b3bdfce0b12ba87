"""Hypothesis strategies for hostile input, and the checks every answer to it must pass.

Values cover what production sends on a bad day: any Unicode including NUL, controls, bidi
overrides and lone surrogates; NaN, ±Infinity, numbers past float range, huge integers;
deep nesting; wrong types everywhere; and real documents with one value swapped for any of
those. Every URL is pinned to 127.0.0.1 before it is sent, so no test resolves another host.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Bounded so that each property test takes a few seconds; CI runs them on every push.
PROPERTY_SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

_CHARS = st.one_of(
    st.characters(),
    st.characters(categories=["Cc", "Cf", "Cs", "Zl", "Zp"]),
    st.sampled_from(["\x00", "\u202e", "\ud800", "\udfff", "/", "\\", ".", "\n", "%"]),
)
texts = st.one_of(
    st.text(alphabet=_CHARS, max_size=40),
    st.sampled_from(["../../etc/passwd", "%00", "\u202egnp.exe", "x" * 3000]),
)
# What a multipart body or a header can carry at all: no lone surrogates (not encodable).
encodable_texts = st.text(max_size=40)
header_texts = st.text(
    alphabet=st.characters(max_codepoint=255, exclude_characters="\r\n"), max_size=300
)
# Any other header a client may send, the bearer token included (framing headers excepted:
# the test client sets those from the body).
extra_headers = st.dictionaries(
    st.one_of(
        st.sampled_from(
            ["Authorization", "Accept", "Accept-Language", "Content-Language", "Origin"]
        ),
        st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True).filter(
            lambda name: (
                name.lower() not in ("content-length", "content-type", "transfer-encoding", "host")
            )
        ),
    ),
    header_texts,
    max_size=3,
)

nasty_floats = st.sampled_from(
    [math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, -0.0, 2.0**63]
)
numbers = st.one_of(
    nasty_floats,
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    nasty_floats,
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=16,
)


def dumps(value: Any) -> str:
    """As a careless client would write it: NaN and Infinity as bare words, \\ud800 escapes."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True)


# Bodies no encoder writes: deep nesting, numbers past every range, broken text.
raw_bodies = st.one_of(
    st.sampled_from([10, 2_000, 100_000]).map(lambda n: "[" * n),
    st.sampled_from([10, 2_000, 20_000]).map(lambda n: '{"url":' * n + "1" + "}" * n),
    st.just('{"url": 1' + "0" * 5_000 + "}"),
    st.just('{"url": 1e99999}'),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*prefix, index))


def replaced(doc: Any, changes: list[tuple[tuple[Any, ...], Any]]) -> Any:
    result = deepcopy(doc)
    for path, value in changes:
        if not path:
            result = value
            continue
        parent = result
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change replaced a container on this path
    return result


def _removed(doc: Any, path: tuple[Any, ...]) -> Any:
    result = deepcopy(doc)
    parent = result
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    return result


def mutations(doc: Any, anything: st.SearchStrategy[Any] = json_values) -> st.SearchStrategy[Any]:
    """`doc` with one to four values at any depth replaced by `anything`, or one removed.

    Places are drawn uniformly from every value in `doc`, so a deep leaf (a word's start
    time) is hit as often as a top-level field.
    """
    paths = list(_paths(doc))
    changes = st.lists(st.tuples(st.sampled_from(paths), anything), min_size=1, max_size=4)
    replace = changes.map(lambda c: replaced(doc, c))
    remove = st.sampled_from([p for p in paths if p]).map(lambda p: _removed(doc, p))
    return st.one_of(replace, replace, replace, remove)


def loopback_only(value: Any) -> Any:
    """An http(s) URL naming any host but 127.0.0.1 becomes one on 127.0.0.1 (text kept)."""
    if not isinstance(value, str):
        return value
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        return value
    if parts.scheme.lower() in ("http", "https") and host not in (None, "127.0.0.1"):
        return "http://127.0.0.1:9/" + quote(value, safe="", errors="replace")
    return value


def pin_urls(body: Any, fields: tuple[str, ...] = ("url", "webhook_url")) -> Any:
    if isinstance(body, dict):
        return {k: loopback_only(v) if k in fields else v for k, v in body.items()}
    return body


def mutated_audio(audio: bytes) -> st.SearchStrategy[bytes]:
    """A real file cut short, with bytes overwritten, or with bytes inserted."""
    size = len(audio)
    return st.one_of(
        st.integers(0, size).map(lambda n: audio[:n]),
        st.tuples(st.integers(0, size - 1), st.binary(min_size=1, max_size=16)).map(
            lambda t: audio[: t[0]] + t[1] + audio[t[0] + len(t[1]) :]
        ),
        st.tuples(st.integers(0, 64), st.binary(min_size=1, max_size=64)).map(
            lambda t: audio[: t[0]] + t[1] + audio[t[0] :]
        ),
    )


def strict_json(raw: str | bytes) -> Any:
    """Parse as a strict JSON parser would: NaN and Infinity are not JSON."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"the body holds {name}, which is not JSON")

    return json.loads(raw, parse_constant=refuse)


def assert_answer(response: Any) -> Any:
    """No 5xx; a refusal is the JSON error shape with a code; the body is strict JSON."""
    body_text = response.get_data()
    assert response.status_code < 500, body_text[:2000]
    if response.status_code >= 400:
        assert response.mimetype == "application/json", body_text[:2000]
        body = strict_json(body_text)
        assert set(body) == {"error"}, body
        assert isinstance(body["error"]["code"], str) and body["error"]["code"]
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        return body
    if response.mimetype == "application/json":
        return strict_json(body_text)
    return body_text


def stored_files(root: str | Path) -> set[Path]:
    return {p for p in Path(root).rglob("*") if p.is_file()}
