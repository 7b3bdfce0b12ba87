"""Property tests: no usage report, however hostile, reaches a 5xx or stores a non-finite number.

Arbitrary JSON (NaN, ±Infinity, numbers past float range, huge integers, deep nesting, any
text) and real reports with values swapped for those, posted by a live worker through the
real app and Redis on SQLite and PostgreSQL. An accepted report is one whose every number is
finite and bounded, and everything that shows it afterwards answers in strict JSON.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import event, example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpu_worker.protocol.usage import UsageReport
from tests.conftest import ADMIN_TOKEN, auth
from tests.hostile import (
    PROPERTY_SETTINGS,
    assert_answer,
    dumps,
    json_values,
    mutations,
    nasty_floats,
    numbers,
    raw_bodies,
    replaced,
    strict_json,
)
from tests.observability.conftest import (
    ObsEnv,
    live_worker,
    make_report,
    report_url,
    scrape_headers,
    worker_headers,
)

VALID = make_report(1)
reports = st.one_of(
    st.just(dumps(VALID)),
    mutations(VALID, st.floats(min_value=0, max_value=1e6)).map(dumps),  # mostly accepted
    mutations(VALID).map(dumps),
    mutations(VALID, numbers).map(dumps),
    mutations(VALID, nasty_floats).map(dumps),
    json_values.map(dumps),
    raw_bodies,
)


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


@PROPERTY_SETTINGS
@example(raw=dumps(replaced(VALID, [(("uptime_seconds",), math.inf)])))
@example(raw=dumps(replaced(VALID, [(("process_started_at",), 1e300)])))
@example(raw=dumps(VALID).replace('"audio_seconds": 95.25', '"audio_seconds": 1e400'))
@given(raw=reports)
def test_an_accepted_report_holds_only_finite_bounded_numbers(raw: str) -> None:
    try:
        report = UsageReport.model_validate_json(raw.encode("utf-8", "surrogatepass"))
    except ValidationError:
        event("refused")
        return
    event("accepted")
    for number in _numbers(report.model_dump()):
        assert math.isfinite(number) and abs(number) <= 2**53, number


@PROPERTY_SETTINGS
@example(raw=dumps(replaced(VALID, [(("host", "memory_used_bytes", "value"), math.inf)])))
@given(raw=reports)
def test_no_report_fails_the_server_and_what_it_shows_stays_json(obs: ObsEnv, raw: str) -> None:
    worker = live_worker(obs.db)  # a fresh worker: sequence 1 is new to it
    client = obs.client
    response = client.post(
        report_url(worker),
        data=raw.encode("utf-8", "surrogatepass"),
        headers=worker_headers(worker),
        content_type="application/json",
    )
    assert_answer(response)
    event(f"answered {response.status_code}")
    diagnostics = client.get(f"/v1/workers/{worker.id}/diagnostics", headers=auth(ADMIN_TOKEN))
    assert diagnostics.status_code == 200
    strict_json(diagnostics.get_data())
    metrics = client.get("/metrics", headers=scrape_headers())
    assert metrics.status_code == 200
    for line in metrics.get_data(as_text=True).splitlines():
        if line and not line.startswith("#"):
            # Prometheus text allows NaN and ±Inf; a worker's report must never cause one.
            assert line.rsplit(" ", 1)[-1].lower() not in ("nan", "+inf", "-inf"), line
