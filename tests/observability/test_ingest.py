"""POST /internal/workers/<w>/<i>/report: identity, schema, size, ordering, storage, expiry."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import update

from app.credentials import InstanceCredential
from app.models import Worker, WorkerState
from app.observability import store
from app.observability.views import MAX_REPORT_BYTES
from gpu_worker.protocol.usage import UsageReport
from tests.conftest import SIGNING_KEY, wait_for
from tests.observability.conftest import (
    ObsEnv,
    credential,
    live_worker,
    make_report,
    post_report,
    report_url,
    worker_headers,
)


def rejections(obs: ObsEnv) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in obs.redis.hgetall(store.REJECTIONS_KEY).items()}


def test_an_accepted_report_becomes_the_snapshot_and_a_heartbeat(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    response = post_report(obs.client, worker, make_report(1))
    assert response.status_code == 200
    assert response.get_json() == {"accepted": True, "sequence": 1}
    snapshot = store.read_snapshot(obs.redis, worker.id)
    assert snapshot is not None
    assert snapshot.report["sequence"] == 1
    assert snapshot.report["gpu"]["devices"][0]["power_watts"] == {"value": 72.5, "reason": None}
    assert store.read_last_report(obs.redis, worker.id) == pytest.approx(snapshot.received_at)
    # The heartbeat the fleet reads: the report's arrival, from Redis (no database write).
    seen = store.last_reports(obs.redis, [worker.id])[worker.id]
    assert seen.timestamp() == pytest.approx(snapshot.received_at)
    assert store.last_reports(obs.redis, ["wrk_never_reported"]) == {}


def test_reporting_is_opt_in(obs: ObsEnv) -> None:
    off = obs.with_settings(MURMUR_OBSERVABILITY_ENABLED="0")
    worker = live_worker(off.db)
    response = post_report(off.client, worker, make_report(1))
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "reporting_disabled"
    assert store.read_snapshot(off.redis, worker.id) is None
    assert rejections(off)["reporting_disabled"] == 1


def test_invalid_credential_is_refused_without_echo(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    wrong = "0" * 64
    response = post_report(
        obs.client, worker, make_report(1), headers={"Authorization": f"Bearer {wrong}"}
    )
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"
    assert wrong not in response.get_data(as_text=True)
    missing = obs.client.post(report_url(worker), json=make_report(1))
    assert missing.status_code == 401
    assert rejections(obs)["unauthorized"] == 2
    assert store.read_snapshot(obs.redis, worker.id) is None


def test_another_workers_credential_does_not_work(obs: ObsEnv) -> None:
    worker, other = live_worker(obs.db), live_worker(obs.db)
    response = post_report(obs.client, worker, make_report(1), headers=worker_headers(other))
    assert response.status_code == 401
    assert store.read_snapshot(obs.redis, worker.id) is None


def test_a_credential_for_another_instance_is_an_unknown_worker(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    # A genuine credential, but for a (worker, instance) pair the inventory does not hold.
    token = InstanceCredential.derive(SIGNING_KEY, worker.id, "inst-elsewhere").token
    response = obs.client.post(
        f"/internal/workers/{worker.id}/inst-elsewhere/report",
        json=make_report(1),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 403
    assert response.get_json()["error"]["code"] == "unknown_worker"
    assert rejections(obs)["unknown_worker"] == 1


def test_a_retired_worker_is_refused_and_its_series_dropped(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    line = {"number": 1, "text": "INFO gpu_worker: last words"}
    assert post_report(obs.client, worker, make_report(1, log=[line])).status_code == 200
    with obs.db.session() as s:
        s.execute(
            update(Worker).where(Worker.id == worker.id).values(state=WorkerState.DELETED.value)
        )
    response = post_report(obs.client, worker, make_report(2))
    assert response.status_code == 403
    assert response.get_json()["error"]["code"] == "worker_retired"
    assert store.read_snapshot(obs.redis, worker.id) is None
    assert store.read_last_report(obs.redis, worker.id) is None
    # Its log tail stays readable for diagnosis until it expires.
    assert store.read_log(obs.redis, worker.id) == ["INFO gpu_worker: last words"]
    assert rejections(obs)["worker_retired"] == 1


def last_seen(obs: ObsEnv, worker: Worker) -> Any:
    with obs.db.session() as s:
        row = s.get(Worker, worker.id)
        assert row is not None
        return row.last_seen_at


def test_a_refused_report_from_a_live_worker_still_counts_as_alive(obs: ObsEnv) -> None:
    # With reporting on, reports are a worker's only heartbeat; a control plane that switched
    # reporting off, or refuses a report, must not get busy workers deleted as silent.
    off = obs.with_settings(MURMUR_OBSERVABILITY_ENABLED="0")
    worker = live_worker(off.db)
    assert last_seen(off, worker) is None
    response = post_report(off.client, worker, make_report(1))
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "reporting_disabled"
    first = last_seen(off, worker)
    assert first is not None

    invalid = post_report(obs.client, worker, {**make_report(2), "job_id": "job_1"})
    assert invalid.status_code == 400
    assert last_seen(obs, worker) > first
    # The usage series only move with an accepted report.
    assert store.read_snapshot(obs.redis, worker.id) is None
    assert store.read_last_report(obs.redis, worker.id) is None


def test_a_refusal_stays_the_answer_when_its_heartbeat_cannot_be_written(
    obs: ObsEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    from app.jobs import service

    def database_gone(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("UPDATE workers", {}, Exception("connection lost"))

    worker = live_worker(obs.db)
    monkeypatch.setattr(service, "record_heartbeat", database_gone)
    response = post_report(obs.client, worker, {**make_report(1), "job_id": "job_1"})
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_report"


def test_a_refusal_before_identity_records_nothing(obs: ObsEnv) -> None:
    off = obs.with_settings(MURMUR_OBSERVABILITY_ENABLED="0")
    worker = live_worker(off.db)
    forged = post_report(off.client, worker, make_report(1), headers={"Authorization": "Bearer x"})
    assert forged.status_code == 401
    assert last_seen(off, worker) is None
    assert rejections(off) == {"unauthorized": 1}


def _bad_reading_body() -> dict[str, Any]:
    body = make_report(1)
    body["host"]["cpu_utilization_ratio"] = {"value": 0.5, "reason": "warming_up"}
    return body


def _gpu_missing_without_reason() -> dict[str, Any]:
    return make_report(1, gpu={"devices": [], "reason": None})


def _zero_instead_of_missing() -> dict[str, Any]:
    body = make_report(1)
    body["host"]["memory_used_bytes"] = {"value": None, "reason": None}
    return body


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"{not json", None),
        (b"[]", None),
        (json.dumps({**make_report(1), "job_id": "job_1"}).encode(), "job_id: unknown field"),
        (json.dumps(make_report("1")).encode(), "sequence"),
        (json.dumps(make_report(0)).encode(), "sequence"),
        (json.dumps(make_report(1, state="stopped")).encode(), "state"),
        (json.dumps(make_report(1, version=2)).encode(), "version"),
        (json.dumps(make_report(1, uptime_seconds=True)).encode(), "uptime_seconds"),
        (json.dumps(make_report(1, audio_seconds=float("nan"))).encode(), "audio_seconds"),
        (json.dumps(_bad_reading_body()).encode(), "host.cpu_utilization_ratio"),
        (json.dumps(_gpu_missing_without_reason()).encode(), "gpu"),
        (json.dumps(_zero_instead_of_missing()).encode(), "host.memory_used_bytes"),
        (
            json.dumps(
                make_report(1, log=[{"number": 2, "text": "b"}, {"number": 1, "text": "a"}])
            ).encode(),
            "log",
        ),
    ],
)
def test_malformed_reports_are_refused_with_the_reason(
    obs: ObsEnv, body: bytes, where: str | None
) -> None:
    worker = live_worker(obs.db)
    response = obs.client.post(
        report_url(worker),
        data=body,
        content_type="application/json",
        headers=worker_headers(worker),
    )
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "invalid_report"
    if where is not None:
        assert error["message"].startswith(where)
    assert store.read_snapshot(obs.redis, worker.id) is None
    assert rejections(obs)["invalid_body"] == 1


class ExplodingStream:
    """A request body that fails the test if anything reads it."""

    read_calls = 0

    def read(self, *args: Any) -> bytes:
        ExplodingStream.read_calls += 1
        raise AssertionError("the body was read")

    readline = read


def test_an_oversized_declared_body_is_refused_before_reading(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    ExplodingStream.read_calls = 0
    response = obs.client.post(
        report_url(worker),
        content_type="application/json",
        headers=worker_headers(worker),
        environ_overrides={
            "wsgi.input": ExplodingStream(),
            "CONTENT_LENGTH": str(MAX_REPORT_BYTES + 1),
        },
    )
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "payload_too_large"
    assert ExplodingStream.read_calls == 0
    assert rejections(obs)["payload_too_large"] == 1


def test_an_oversized_chunked_body_is_refused_while_reading(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    body = json.dumps(make_report(1, padding="x" * MAX_REPORT_BYTES)).encode()

    class Chunked:
        """A body with no declared length, as a chunked request arrives."""

        def __init__(self) -> None:
            self.sent = 0

        def read(self, size: int = -1) -> bytes:
            size = len(body) if size is None or size < 0 else size
            chunk = body[self.sent : self.sent + size]
            self.sent += len(chunk)
            return chunk

    stream = Chunked()
    response = obs.client.post(
        report_url(worker),
        content_type="application/json",
        headers={**worker_headers(worker), "Transfer-Encoding": "chunked"},
        # What a WSGI server hands over for a chunked request: no length, a terminated input.
        environ_overrides={
            "wsgi.input": stream,
            "CONTENT_LENGTH": "",
            "wsgi.input_terminated": True,
        },
    )
    assert response.status_code == 413
    # It stopped just past the cap instead of taking the whole body.
    assert MAX_REPORT_BYTES < stream.sent < len(body)


def test_older_and_repeated_reports_never_overwrite_newer_ones(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    post = lambda body: post_report(obs.client, worker, body)  # noqa: E731
    assert post(make_report(5, state="busy")).status_code == 200
    stale = post(make_report(3, state="ready"))
    assert stale.status_code == 409
    assert stale.get_json()["error"]["code"] == "stale_report"
    assert post(make_report(5, state="ready")).status_code == 409
    snapshot = store.read_snapshot(obs.redis, worker.id)
    assert snapshot is not None and snapshot.report["state"] == "busy"
    # A restarted process starts its sequence again, a second ago by its uptime.
    restarted = make_report(1, started=1_764_000_100.5, state="loading", uptime_seconds=1.0)
    assert post(restarted).status_code == 200
    # The previous process's late report (sent before the restart, after 100 s of uptime)
    # is older, whatever its sequence number.
    assert post(make_report(99, state="draining", uptime_seconds=100.0)).status_code == 409
    snapshot = store.read_snapshot(obs.redis, worker.id)
    assert snapshot is not None and snapshot.report["state"] == "loading"
    assert rejections(obs)["stale_sequence"] == 3


def test_a_worker_clock_hours_off_never_blocks_its_later_reports(obs: ObsEnv) -> None:
    """Reports order by the control plane's clock (issue 21 §5): a process that started with
    its clock 5 h ahead, then a restart with the clock put right, is not `stale_report`."""
    worker = live_worker(obs.db)

    def post(body: dict[str, Any]) -> Any:
        return post_report(obs.client, worker, body)

    now = time.time()
    ahead = now + 5 * 3600
    assert post(make_report(1, started=ahead, uptime_seconds=2.0)).status_code == 200
    assert post(make_report(2, started=ahead, uptime_seconds=32.0)).status_code == 200
    # NTP puts the clock right; the worker process restarts: its start reads 5 h earlier.
    right = make_report(1, started=now + 1.0, state="loading", uptime_seconds=0.5)
    response = post(right)
    assert response.status_code == 200, response.get_json()
    assert post(make_report(2, started=now + 1.0, uptime_seconds=30.5)).status_code == 200
    snapshot = store.read_snapshot(obs.redis, worker.id)
    assert snapshot is not None and snapshot.report["process_started_at"] == now + 1.0
    # The skewed process's report still in flight, sent after 40 s of its uptime: older.
    late = post(make_report(3, started=ahead, state="draining", uptime_seconds=40.0))
    assert late.status_code == 409
    assert late.get_json()["error"]["code"] == "stale_report"
    # A clock hours behind is no different: the next process is newer by this clock.
    behind = make_report(1, started=now - 9 * 3600, state="loading", uptime_seconds=0.5)
    assert post(behind).status_code == 200
    assert rejections(obs).get("stale_sequence", 0) == 1


def test_processes_are_ordered_by_arrival_minus_uptime(obs: ObsEnv) -> None:
    """The store itself, on a clock the test sets: which process is newer is decided by when
    it started on the control plane's clock, not by its own `process_started_at`."""
    worker = live_worker(obs.db)

    def report(sequence: int, started: float, uptime_seconds: float) -> UsageReport:
        body = make_report(sequence, started=started, uptime_seconds=uptime_seconds)
        return UsageReport.model_validate(body)

    def keep(body: UsageReport, at: float) -> bool:
        return store.store_report(
            obs.redis, worker.id, body, [], received_at=at, interval_seconds=30.0
        )

    t0 = 1_900_000_000.0
    # Process A started at t0 - 10 (this clock) and says it started in 2100.
    assert keep(report(sequence=7, started=4_102_444_800.0, uptime_seconds=10.0), t0)
    # Process B started at t0 + 5 and says 1970: newer.
    assert keep(report(sequence=1, started=1.0, uptime_seconds=5.0), t0 + 10)
    # A's report sent at t0 + 4, delivered 3 s late: older than B, refused.
    assert not keep(report(sequence=8, started=4_102_444_800.0, uptime_seconds=14.0), t0 + 17)
    # B's own reports go on by sequence, whatever their transit time.
    assert keep(report(sequence=2, started=1.0, uptime_seconds=35.0), t0 + 41)
    assert not keep(report(sequence=2, started=1.0, uptime_seconds=35.0), t0 + 42)
    # A cursor written before origins were kept: a new process is taken as the newer one.
    obs.redis.hdel(store.cursor_key(worker.id), "origin")
    assert keep(report(sequence=1, started=0.5, uptime_seconds=1.0), t0 + 60)


def test_log_lines_are_checked_again_deduplicated_and_capped(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    token = credential(worker)
    leaky = [
        {"number": 1, "text": f"WARNING x: retry with Bearer {token}"},
        {"number": 2, "text": "INFO x: fetched http://10.0.0.5/internal/audio/job_9?sig=abc"},
        {"number": 3, "text": f"INFO x: raw {token} and\x1b[31m colour"},
    ]
    assert post_report(obs.client, worker, make_report(1, log=leaky)).status_code == 200
    stored = store.read_log(obs.redis, worker.id)
    assert len(stored) == 3
    assert not any(token in line or "10.0.0.5" in line or "sig=" in line for line in stored)
    assert not any("\x1b" in line for line in stored)
    # The response to report 1 was lost, so the worker sends lines 1-3 again with line 4.
    again = [*leaky, {"number": 4, "text": "INFO x: four"}]
    assert post_report(obs.client, worker, make_report(2, log=again)).status_code == 200
    assert len(store.read_log(obs.redis, worker.id)) == 4
    # More than the retention keeps only the newest lines.
    number, sequence = 4, 3
    while number < store.LOG_LINES_KEPT + 30:
        lines = [{"number": number + i, "text": f"INFO x: line {number + i}"} for i in range(1, 51)]
        assert post_report(obs.client, worker, make_report(sequence, log=lines)).status_code == 200
        number, sequence = number + 50, sequence + 1
    stored = store.read_log(obs.redis, worker.id)
    assert len(stored) == store.LOG_LINES_KEPT
    assert stored[-1] == f"INFO x: line {number}"
    assert 0 < obs.redis.ttl(store.log_key(worker.id)) <= store.LOG_RETENTION_SECONDS


def test_snapshots_expire_after_three_intervals_but_freshness_stays(obs: ObsEnv) -> None:
    fast = obs.with_interval(0.2)
    worker = live_worker(fast.db)
    assert post_report(fast.client, worker, make_report(1)).status_code == 200
    ttl_ms = fast.redis.pttl(store.snapshot_key(worker.id))
    assert 0 < ttl_ms <= 600
    wait_for(
        lambda: store.read_snapshot(fast.redis, worker.id) is None, 10, "the snapshot to expire"
    )
    assert store.read_last_report(fast.redis, worker.id) is not None


def test_forget_worker_removes_everything(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    line = {"number": 1, "text": "INFO x: hello"}
    assert post_report(obs.client, worker, make_report(1, log=[line])).status_code == 200
    store.forget_worker(obs.redis, worker.id)
    assert obs.redis.keys(f"*{worker.id}*") == []
    assert store.read_last_report(obs.redis, worker.id) is None
    # Forgetting also resets ordering: a fresh report is accepted again.
    assert post_report(obs.client, worker, make_report(1)).status_code == 200
