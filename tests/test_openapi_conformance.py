"""The API keeps the promises of its own /openapi.json, under schemathesis-generated requests.

Every operation of the document is called through the real Flask app (WSGI, SQLite and
PostgreSQL, real Redis) with bounded examples; each answer must be no 5xx, a documented status
code and content type, and a body and headers that match the documented schema. URLs in
bodies are pinned to 127.0.0.1 before sending, so no test request ever resolves another host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app import create_app
from app.db import Database
from tests.conftest import REDIS_URL, auth, make_settings
from tests.hostile import loopback_only

# The synchronous operations wait for a worker; none runs here, so audio that decodes (raw PCM
# with whisper-asr-webservice's encode=false, which any bytes are) ends in their documented
# 504 `timeout`: an answer, not a server error. Every other 5xx still fails.
SYNC_PATHS = frozenset(
    {"/v1/audio/transcriptions", "/v1/audio/translations", "/asr", "/detect-language"}
)


def no_server_error_but_the_sync_timeout(ctx: Any, response: Any, case: Any) -> Any:
    sync = response.status_code == 504 and case.operation.path in SYNC_PATHS
    if sync and response.json().get("error", {}).get("code") == "timeout":
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [
    no_server_error_but_the_sync_timeout,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
EXAMPLES = 25
_URL_FIELDS = ("url", "webhook_url")


@pytest.fixture()
def api(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Iterator[Any]:
    # A short synchronous wait: a generated upload is never transcribed (no worker runs).
    settings = make_settings(database_url, REDIS_URL, tmp_path, MURMUR_SYNC_TIMEOUT_SECONDS="0.5")
    database = Database(settings.database_url)
    yield create_app(settings, db=database)
    database.dispose()


def _operations(app: Any) -> list[Any]:
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_matches_the_document(api: Any, mode: GenerationMode) -> None:
    """Valid requests (positive) and requests that break the document (negative) alike."""
    operations = _operations(api)
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
                # Its documented 503 (a dependency or the control plane is down) is an answer,
                # not a server error; the other checks still hold it to the document.
                checks = CHECKS[1:]  # all but the server-error check
            case.call_and_validate(headers=headers, checks=checks)

        try:
            run()
        except Unsatisfiable:
            # An operation with no inputs (/healthz) has no request that breaks its document.
            assert mode is GenerationMode.NEGATIVE, operation.label
