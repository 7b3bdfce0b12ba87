"""Redaction a red team cannot walk around (issue 32 §4).

Secrets are generated in many notations (env lines with prefixes and suffixes, JSON, YAML,
headers, URLs with userinfo, bearer values, known token shapes), with bidi controls and
zero-width characters planted in them; none may survive `redact` or `clean_log_line`. Prose
that merely contains a keyword ("keyboard", "token bucket") is left as it is.
"""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.protocol.redaction import clean_log_line, redact

# Secret values: long enough to be told apart from the surrounding text, and marked so that a
# surviving piece is found ("ZQ" never appears in a template).
_VALUE_ALPHABET = string.ascii_letters + string.digits + "+/_-."
values = st.text(_VALUE_ALPHABET, min_size=8, max_size=40).map(lambda v: "ZQ" + v + "QZ")

prefixes = st.sampled_from(["", "MURMUR_", "AWS_", "DB_", "HF_", "MY_APP_", "x-", "app.", "GH_"])
keywords = st.sampled_from(
    [
        "TOKEN",
        "API_TOKEN",
        "SECRET",
        "SECRET_ACCESS_KEY",
        "PASSWORD",
        "PASSWD",
        "PWD",
        "API_KEY",
        "APIKEY",
        "ACCESS_KEY",
        "PRIVATE_KEY",
        "CLIENT_SECRET",
        "CREDENTIALS",
        "AUTH",
        "SIGNATURE",
    ]
)
suffixes = st.sampled_from(["", "_ID", "_VALUE", "_1", "S", ".prod"])
cases = st.sampled_from(["upper", "lower", "camel"])

_BIDI = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))] + ["\u200b", "\ufeff"]


def _cased(name: str, how: str) -> str:
    if how == "lower":
        return name.lower()
    if how == "camel":
        parts = [p for p in name.lower().replace("-", "_").split("_") if p]
        return parts[0] + "".join(p.title() for p in parts[1:]) if parts else name
    return name


@st.composite
def secret_names(draw: st.DrawFn) -> str:
    name = draw(prefixes) + draw(keywords) + draw(suffixes)
    return _cased(name, draw(cases))


NOTATIONS = [
    "{name}={value}",
    "export {name}={value}",
    "{name} = {value}",
    '{name}="{value}"',
    "{name}='{value}'",
    '{{"{name}": "{value}"}}',
    '{{"{name}":"{value}","other":1}}',
    "{name}: {value}",
    "  {name}: '{value}'",
    "{name}:{value}",
    "--{name}={value}",
    "Authorization: Bearer {value}",
    "authorization: basic {value}",
    "Bearer {value}",
    "postgresql://admin:{value}@db.internal:5432/murmur",
    "admin:{value}@db.internal",
    "redis://:{value}@127.0.0.1:6379/0",
    "https://host/path?{name}={value}",
    "hf_{value}",
    "AKIA{value}",
]


@st.composite
def leaks(draw: st.DrawFn) -> tuple[str, str]:
    value = draw(values)
    template = draw(st.sampled_from(NOTATIONS))
    line = template.format(name=draw(secret_names()), value=value)
    before = draw(st.sampled_from(["", "boot failed: ", "ERROR worker: ", "config ", "\t"]))
    after = draw(st.sampled_from(["", " and more", ", retrying", "\n next line", ";"]))
    text = before + line + after
    # Plant invisible characters anywhere, the value included.
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(_BIDI)) + text[at:]
    return text, value


def _survives(value: str, out: str) -> bool:
    # The value, or any 8-character piece of it, still readable.
    inner = value[2:-2]
    pieces = {inner[i : i + 8] for i in range(max(1, len(inner) - 7))}
    return any(p in out for p in pieces)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(leaks())
def test_no_generated_secret_survives(leak: tuple[str, str]) -> None:
    text, value = leak
    for out in (redact(text), clean_log_line(text)):
        assert not _survives(value, out), (text, out)
        assert not any(c in out for c in _BIDI), (text, out)


PROSE = [
    "the keyboard layout is us",
    "token bucket refill at 5 per second",
    "tokenizer: gpt2",
    "design: flat, author: Jane",
    "monkey=3 keys=4",
    "passing the secret of a good boot is patience",
    "decoded 1200 tokens in 3.2 s",
    "language: en, model: small, beam_size: 5",
]


def test_ordinary_words_are_not_redacted() -> None:
    for text in PROSE:
        assert redact(text) == text
        assert clean_log_line(text) == text


def test_the_issue_s_planted_secrets_are_redacted() -> None:
    planted = (
        "MURMUR_API_TOKEN=tok-aaaaaaaa AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI DB_PASSWORD=hunter22 "
        'HF_TOKEN=hf_bbbbbbbbbbbbbbbb {"password": "correct horse"} \u202egnirts\u202c'
    )
    out = clean_log_line(planted)
    for secret in ("tok-aaaaaaaa", "wJalrXUtnFEMI", "hunter22", "hf_bbbb", "correct horse"):
        assert secret not in out
    assert "\u202e" not in out and "\u202c" not in out
