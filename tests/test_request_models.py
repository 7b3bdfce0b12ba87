"""The request models (app/jobs/requests.py) refuse one thing per request, in a fixed order.

Unknown fields first, then each field in declaration order; a check that resolves a URL runs
only once every earlier field passed. Refusals carry the codes and messages clients know.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.errors import Refused
from app.jobs import requests


class Resolver:
    """Stands in for URL resolution: records what it was asked, refuses ftp URLs."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, value: Any, field: str) -> str:
        self.asked.append(field)
        if not isinstance(value, str) or not value.startswith("http"):
            raise Refused("invalid_url", f"{field} must use http or https")
        return value


def deployment(resolver: Resolver, **overrides: Any) -> requests.Deployment:
    values: dict[str, Any] = {"default_language": "en", "english_only": False, "webhooks": True}
    return requests.Deployment(**{**values, **overrides}, resolve=resolver)


def refusal(model: type[BaseModel], data: dict[Any, Any], **overrides: Any) -> tuple[str, str]:
    with pytest.raises(Refused) as refused:
        requests.parse(model, data, deployment(Resolver(), **overrides))
    return refused.value.code, refused.value.message


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ({"colour": "red", "language": "klingon"}, "unknown_field"),
        ({"language": "klingon"}, "missing_url"),
        ({"url": "ftp://x", "language": "klingon"}, "invalid_url"),
        ({"url": "http://x", "language": "klingon", "prompt": 5}, "invalid_language"),
        ({"url": "http://x", "prompt": "x" * 2001, "word_timestamps": "t"}, "invalid_parameter"),
        ({"url": "http://x", "prompt": "a\x00", "word_timestamps": "t"}, "invalid_text"),
        ({"url": "http://x", "word_timestamps": 1, "webhook_url": "ftp://"}, "invalid_parameter"),
        ({"url": "http://x", "webhook_url": "ftp://"}, "invalid_url"),
    ],
)
def test_a_url_job_is_refused_for_its_first_bad_field(data: dict[str, Any], code: str) -> None:
    assert refusal(requests.UrlJob, data)[0] == code


def test_the_messages_clients_know() -> None:
    assert refusal(requests.UrlJob, {"a": 1, "b": 2}) == ("unknown_field", "unknown field(s): a, b")
    assert refusal(requests.UploadForm, {None: "x"}) == (
        "unknown_field",
        "unknown form field(s): None",
    )
    code, message = refusal(requests.UploadForm, {"language": "klingon"})
    assert (code, "'klingon'" in message, "ISO 639-1" in message) == (
        "invalid_language",
        True,
        True,
    )
    code, message = refusal(requests.UploadForm, {"language": "FR"}, english_only=True)
    assert (code, "English-only" in message) == ("unsupported_language", True)
    assert refusal(requests.UploadForm, {"webhook_url": "http://x"}, webhooks=False)[0] == (
        "webhooks_disabled"
    )
    assert refusal(requests.UploadForm, {"prompt": "a\x00"}) == (
        "invalid_text",
        "prompt contains a NUL character",
    )
    assert refusal(requests.CancelQuery, {"purge": "soon"}) == (
        "invalid_parameter",
        "purge must be true or false",
    )
    assert refusal(requests.JobListQuery, {"limit": "1.5"}) == (
        "invalid_limit",
        "limit must be an integer from 1 to 100",
    )


def test_an_openai_form_checks_its_format_before_the_language() -> None:
    form = requests.OpenAITranscriptionForm
    both = {"response_format": "docx", "timestamp_granularities[]": ["x"], "language": "zz"}
    assert refusal(form, both)[0] == "invalid_response_format"
    assert refusal(form, {**both, "response_format": ""})[0] == "invalid_parameter"
    parsed = requests.parse(
        form,
        requests.form_values(form, {"timestamp_granularities[]": ["word", "segment"]}),
        deployment(Resolver()),
    )
    assert parsed.response_format == "json" and parsed.options().word_timestamps is True


def test_no_url_is_resolved_once_an_earlier_field_failed() -> None:
    resolver = Resolver()
    body = {"url": "http://x", "language": "klingon", "webhook_url": "http://hook"}
    with pytest.raises(Refused):
        requests.parse(requests.UrlJob, body, deployment(resolver))
    assert resolver.asked == ["url"]
    parsed = requests.parse(requests.UrlJob, {**body, "language": "EN"}, deployment(resolver))
    assert resolver.asked == ["url", "url", "webhook_url"]
    assert parsed.options() == requests.JobOptions("en", None, False, "http://hook")


def test_flags_and_defaults_read_as_before() -> None:
    known = deployment(Resolver(), default_language="de")
    form = requests.parse(requests.UploadForm, {"word_timestamps": "ON", "prompt": ""}, known)
    assert form.options() == requests.JobOptions("de", None, True, None)
    query = requests.parse(requests.JobListQuery, {"status": "", "limit": " 7 ", "other": "x"})
    assert (query.status, query.limit, query.cursor) == (None, 7, None)
    assert requests.parse(requests.CancelQuery, {"purge": ""}).purge is False
