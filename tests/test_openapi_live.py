"""The running server, not only the Flask app, keeps the promises of its /openapi.json.

tests/test_openapi_conformance.py calls the app through WSGI, where gunicorn's own answers
(request parsing, body framing, its error pages) cannot be reached. Here schemathesis loads
the document from a real gunicorn (the production command line, tests/serving.py) on
loopback and sends every operation over HTTP, bounded in examples, with the same checks: no
5xx, documented status codes, content types, headers and bodies. Generated URLs are pinned to
127.0.0.1, so no request ever names another host.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

from tests.conftest import auth
from tests.hostile import loopback_only
from tests.serving import Gunicorn, gunicorn_api
from tests.test_openapi_conformance import _URL_FIELDS, CHECKS

EXAMPLES = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Gunicorn]:
    # A short synchronous wait: a generated upload is never transcribed (no worker runs).
    with gunicorn_api(
        tmp_path_factory.mktemp("live-openapi"), redis_url, MURMUR_SYNC_TIMEOUT_SECONDS="0.5"
    ) as api:
        yield api


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_running_server_matches_the_document(server: Gunicorn, mode: GenerationMode) -> None:
    served_before = server.proc.output().count('HTTP/1.1" ')
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            if isinstance(case.body, dict):
                for name in _URL_FIELDS:
                    if name in case.body:
                        case.body[name] = loopback_only(case.body[name])
            headers = {**auth(), **(case.headers or {})}
            if operation.path in ("/healthz", "/readyz", "/openapi.json"):
                headers.pop("Authorization")
            checks = CHECKS
            if operation.path == "/readyz":
                checks = [check for check in CHECKS if check is not not_a_server_error]
            case.call_and_validate(base_url=server.url, headers=headers, checks=checks, timeout=30)

        try:
            run()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, operation.label
    # The requests went through gunicorn (its access log), not around it.
    served = server.proc.output().count('HTTP/1.1" ') - served_before
    assert served >= len(operations), served
