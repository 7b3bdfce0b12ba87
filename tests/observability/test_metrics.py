"""GET /metrics: scrape auth, values from shared state, valid exposition, nothing sensitive."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from app.db import Database
from app.fleet.liveness import record_reconciled
from app.fleet.service import PLAN_KEY
from app.models import Job, Worker, WorkerState, utcnow
from app.observability import store
from app.observability.collector import MurmurCollector
from app.observability.exposition import SeriesFamily, encode_text
from tests.conftest import (
    ADMIN_TOKEN,
    API_TOKEN,
    OTHER_TOKEN,
    SIGNING_KEY,
    WEBHOOK_SECRET,
    wait_for,
)
from tests.observability.conftest import (
    SCRAPE_TOKEN,
    ObsEnv,
    build_app,
    credential,
    live_worker,
    make_report,
    post_report,
    scrape_headers,
)

TRANSCRIPT_TEXT = "the confidential words somebody spoke"
SOURCE_URL = "https://audio.example.org/private/meeting.wav?X-Amz-Signature=abc123"


def scrape(obs: ObsEnv) -> str:
    response = obs.client.get("/metrics", headers=scrape_headers())
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain; version=0.0.4")
    return str(response.get_data(as_text=True))


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(text: str, name: str, **labels: str) -> float | None:
    found = [v for n, lab, v in samples(text) if n == name and lab == labels]
    assert len(found) <= 1, f"{name}{labels} is ambiguous"
    return found[0] if found else None


def series_of(text: str, worker_id: str) -> list[str]:
    return [n for n, lab, _ in samples(text) if lab.get("worker") == worker_id]


# --- auth ------------------------------------------------------------------------------------


def test_metrics_are_off_without_a_scrape_token(obs: ObsEnv) -> None:
    off = obs.with_settings(MURMUR_SCRAPE_TOKEN="")
    response = off.client.get("/metrics", headers=scrape_headers())
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "metrics_disabled"


@pytest.mark.parametrize(
    "scrape_token",
    ["too-short-scrape-token", API_TOKEN, ADMIN_TOKEN],
    ids=["short", "an API token", "the admin token"],
)
def test_a_short_or_shared_scrape_token_keeps_metrics_off(obs: ObsEnv, scrape_token: str) -> None:
    # An app started without `murmur api`'s checks (gunicorn 'app:create_app()') must not
    # let such a token in either, even when it is presented exactly.
    weak = obs.with_settings(MURMUR_SCRAPE_TOKEN=scrape_token)
    response = weak.client.get("/metrics", headers=scrape_headers(scrape_token))
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "metrics_disabled"
    assert scrape_token not in response.get_data(as_text=True)


def test_metrics_need_the_scrape_token_and_nothing_else(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    for token in (None, "x" * 40, API_TOKEN, ADMIN_TOKEN, credential(worker)):
        headers = scrape_headers(token) if token else {}
        response = obs.client.get("/metrics", headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        if token:
            assert token not in response.get_data(as_text=True)
    assert obs.client.get("/metrics", headers=scrape_headers()).status_code == 200


# --- a populated fleet -----------------------------------------------------------------------


@dataclass
class Scenario:
    ready: Worker
    no_gpu: Worker
    deleting: Worker
    deleted: Worker
    failed_creation: Worker
    jobs: list[Job]


def _worker(db: Database, **fields: Any) -> Worker:
    worker = Worker(provider="local", **fields)
    with db.session() as s:
        s.add(worker)
    return worker


def _job(db: Database, **fields: Any) -> Job:
    defaults = {
        "owner": "o" * 64,
        "source": "url",
        "source_url": SOURCE_URL,
        "prompt": "names: Alice Confidential",
        "filename": "board-meeting.wav",
    }
    job = Job(**{**defaults, **fields})
    with db.session() as s:
        s.add(job)
    return job


def populate(obs: ObsEnv) -> Scenario:
    now = utcnow()
    ago = lambda seconds: now - timedelta(seconds=seconds)  # noqa: E731
    db = obs.db
    ready = _worker(
        db,
        profile="local-cpu",
        instance_id="inst-ready",
        state=WorkerState.READY.value,
        requested_at=ago(100),
        created_at=ago(95),  # provision 5 s
        booted_at=ago(75),  # boot 20 s
        ready_at=ago(70),  # start-up 5 s
        first_job_at=ago(60),  # first job after 10 s
    )
    no_gpu = _worker(
        db,
        profile="gpu-l4",
        instance_id="inst-gpu",
        state=WorkerState.BOOTING.value,
        hourly_cost_eur=0.75,
        requested_at=ago(50),
        created_at=ago(48),
    )
    deleting = _worker(
        db,
        profile="local-cpu",
        instance_id="inst-leaking",
        state=WorkerState.DELETING.value,
        requested_at=ago(2000),
        delete_requested_at=ago(700),
    )
    deleted = _worker(
        db,
        profile="local-cpu",
        instance_id="inst-gone",
        state=WorkerState.DELETED.value,
        requested_at=ago(500),
        delete_requested_at=ago(40),
        deleted_at=ago(28),  # teardown 12 s
    )
    failed_creation = _worker(
        db,
        profile="gpu-l4",
        state=WorkerState.FAILED.value,
        hourly_cost_eur=0.75,
        requested_at=ago(10),
        delete_requested_at=ago(9),
        deleted_at=ago(9),
    )
    jobs = [
        _job(db, status="queued", profile=None, created_at=ago(120)),
        _job(db, status="dispatched", profile="local-cpu", created_at=ago(30)),
        _job(db, status="running", profile="local-cpu", created_at=ago(20), worker_id=ready.id),
        _job(
            db,
            status="succeeded",
            profile="local-cpu",
            created_at=ago(90),
            started_at=ago(80),
            finished_at=ago(60),
            transcript={"text": TRANSCRIPT_TEXT, "segments": []},
        ),
        _job(db, status="succeeded", profile="local-cpu", created_at=ago(90)),
        _job(db, status="failed", profile="gpu-l4", created_at=ago(90), error_message="boom"),
    ]
    store.record_job_finished(obs.redis, jobs[3])
    obs.redis.rpush("transcribe.local-cpu", "m1", "m2", "m3")
    store.record_provision_attempt(obs.redis, "gpu-l4", "out_of_stock")
    store.record_provision_attempt(obs.redis, "gpu-l4", "out_of_stock")
    store.record_broker_user_recreated(obs.redis, "gpu-l4")
    store.record_provision_attempt(obs.redis, "local-cpu", "succeeded")
    record_reconciled(obs.redis, ago(12))
    assert post_report(obs.client, ready, make_report(1, state="busy")).status_code == 200
    no_gpu_report = make_report(
        1, state="loading", gpu={"devices": [], "reason": "nvml_unavailable"}
    )
    assert post_report(obs.client, no_gpu, no_gpu_report).status_code == 200
    # One refused report, for the rejection counter.
    assert post_report(obs.client, ready, make_report(1)).status_code == 409
    return Scenario(ready, no_gpu, deleting, deleted, failed_creation, jobs)


def test_jobs_and_queues_come_from_the_table_and_the_broker(obs: ObsEnv) -> None:
    populate(obs)
    text = scrape(obs)
    assert value(text, "murmur_jobs_submitted_total") == 6
    assert value(text, "murmur_jobs_finished_total", profile="local-cpu", outcome="succeeded") == 2
    assert value(text, "murmur_jobs_finished_total", profile="gpu-l4", outcome="failed") == 1
    assert value(text, "murmur_jobs_finished_total", profile="gpu-l4", outcome="cancelled") == 0
    assert value(text, "murmur_jobs", profile="", state="queued") == 1
    assert value(text, "murmur_jobs", profile="local-cpu", state="running") == 1
    assert value(text, "murmur_queue_jobs", profile="local-cpu") == 1
    assert value(text, "murmur_queue_jobs", profile="") == 1
    assert value(text, "murmur_queue_messages", profile="local-cpu") == 3
    assert value(text, "murmur_queue_messages", profile="gpu-l4") == 0
    unrouted_wait = value(text, "murmur_queue_oldest_wait_seconds", profile="")
    assert unrouted_wait is not None and unrouted_wait >= 119
    assert value(text, "murmur_queue_oldest_wait_seconds", profile="gpu-l4") == 0
    assert value(text, "murmur_job_wait_seconds_count", profile="local-cpu") == 1
    assert value(text, "murmur_job_wait_seconds_bucket", profile="local-cpu", le="10") == 1
    assert value(text, "murmur_job_wait_seconds_bucket", profile="local-cpu", le="5") == 0
    assert (
        value(text, "murmur_job_duration_seconds_sum", profile="local-cpu", outcome="succeeded")
        == 30
    )


def test_fleet_workers_cost_and_provisioning(obs: ObsEnv) -> None:
    scenario = populate(obs)
    text = scrape(obs)
    assert value(text, "murmur_workers", profile="local-cpu", state="ready") == 1
    assert value(text, "murmur_workers", profile="local-cpu", state="deleting") == 1
    assert value(text, "murmur_workers", profile="gpu-l4", state="booting") == 1
    # A creation that failed outright owns nothing: not in the inventory, not billed.
    assert value(text, "murmur_workers", profile="gpu-l4", state="failed") == 0
    assert value(text, "murmur_fleet_cost_euros_per_hour", profile="gpu-l4") == 0.75
    assert value(text, "murmur_fleet_planned_cost_euros_per_hour") == 0.75
    assert value(text, "murmur_fleet_plan_recorded") == 0
    assert value(text, "murmur_fleet_budget_euros_per_hour") == 5.0
    assert (
        value(text, "murmur_provision_attempts_total", profile="gpu-l4", outcome="out_of_stock")
        == 2
    )
    assert (
        value(text, "murmur_provision_attempts_total", profile="gpu-l4", outcome="succeeded") == 0
    )
    assert value(text, "murmur_broker_users_recreated_total", profile="gpu-l4") == 1
    assert value(text, "murmur_broker_users_recreated_total", profile="local-cpu") == 0
    pending = value(
        text,
        "murmur_worker_delete_pending_seconds",
        profile="local-cpu",
        worker=scenario.deleting.id,
    )
    assert pending is not None and pending >= 699
    obs.redis.set(PLAN_KEY, json.dumps({"planned_hourly_eur": 1.5, "profiles": {}}))
    text = scrape(obs)
    assert value(text, "murmur_fleet_planned_cost_euros_per_hour") == 1.5
    assert value(text, "murmur_fleet_plan_recorded") == 1


def test_lifecycle_phases_are_histograms_per_profile(obs: ObsEnv) -> None:
    populate(obs)
    text = scrape(obs)
    boot = "murmur_worker_boot_seconds_bucket"
    assert value(text, boot, profile="local-cpu", le="10") == 0
    assert value(text, boot, profile="local-cpu", le="30") == 1
    assert value(text, "murmur_worker_boot_seconds_count", profile="local-cpu") == 1
    assert value(text, "murmur_worker_provision_seconds_bucket", profile="local-cpu", le="5") == 1
    assert value(text, "murmur_worker_startup_seconds_sum", profile="local-cpu") == pytest.approx(
        5, abs=0.01
    )
    assert value(text, "murmur_worker_first_job_wait_seconds_count", profile="local-cpu") == 1
    assert value(text, "murmur_worker_teardown_seconds_count", profile="local-cpu") == 1
    assert value(text, "murmur_worker_teardown_seconds_sum", profile="local-cpu") == pytest.approx(
        12, abs=0.01
    )
    # The failed creation was never an instance: it is no teardown measurement.
    assert value(text, "murmur_worker_teardown_seconds_count", profile="gpu-l4") == 0


def test_usage_series_per_worker_and_missing_gpu_telemetry(obs: ObsEnv) -> None:
    scenario = populate(obs)
    text = scrape(obs)
    ready = {"profile": "local-cpu", "worker": scenario.ready.id}
    assert value(text, "murmur_worker_reported_state", state="busy", **ready) == 1
    assert value(text, "murmur_worker_model_load_seconds", **ready) == 1.75
    assert value(text, "murmur_worker_transcriptions_total", outcome="succeeded", **ready) == 3
    assert value(text, "murmur_worker_transcriptions_total", outcome="failed", **ready) == 1
    assert value(text, "murmur_worker_processing_seconds_total", **ready) == 8.5
    assert value(text, "murmur_worker_audio_seconds_total", **ready) == 95.25
    assert value(text, "murmur_worker_cpu_utilization_ratio", **ready) == 0.25
    assert value(text, "murmur_worker_memory_used_bytes", **ready) == 2e9
    assert value(text, "murmur_worker_memory_total_bytes", **ready) == 8e9
    assert value(text, "murmur_gpu_utilization_ratio", gpu="0", **ready) == 0.42
    assert value(text, "murmur_gpu_memory_used_bytes", gpu="0", **ready) == 6e9
    assert value(text, "murmur_gpu_memory_total_bytes", gpu="0", **ready) == 24e9
    assert value(text, "murmur_gpu_temperature_celsius", gpu="0", **ready) == 61
    assert value(text, "murmur_gpu_power_watts", gpu="0", **ready) == 72.5
    assert value(text, "murmur_worker_gpu_telemetry_available", **ready) == 1
    age = value(text, "murmur_worker_report_age_seconds", **ready)
    assert age is not None and age >= 0
    no_gpu = {"profile": "gpu-l4", "worker": scenario.no_gpu.id}
    # Missing is missing: no GPU sample at all, never a zero.
    assert not [n for n in series_of(text, scenario.no_gpu.id) if n.startswith("murmur_gpu_")]
    assert value(text, "murmur_worker_gpu_telemetry_available", **no_gpu) == 0
    assert value(text, "murmur_worker_readings_missing", reason="nvml_unavailable", **no_gpu) == 1
    assert value(text, "murmur_worker_reports_accepted_total") == 2
    assert value(text, "murmur_worker_report_rejections_total", reason="stale_sequence") == 1


def test_every_configured_profile_is_exposed_even_without_workers(obs: ObsEnv) -> None:
    text = scrape(obs)
    for profile in ("local-cpu", "gpu-l4"):
        assert value(text, "murmur_queue_jobs", profile=profile) == 0
        assert value(text, "murmur_queue_messages", profile=profile) == 0
        assert value(text, "murmur_queue_oldest_wait_seconds", profile=profile) == 0
        assert value(text, "murmur_workers", profile=profile, state="ready") == 0
        assert value(text, "murmur_worker_boot_seconds_count", profile=profile) == 0


def test_the_exposition_is_valid_and_leaks_nothing(obs: ObsEnv) -> None:
    scenario = populate(obs)
    text = scrape(obs)
    samples(text)  # the official parser accepts every line
    secrets = [
        SCRAPE_TOKEN,
        API_TOKEN,
        OTHER_TOKEN,
        SIGNING_KEY,
        ADMIN_TOKEN,
        WEBHOOK_SECRET,
        credential(scenario.ready),
        credential(scenario.no_gpu),
        TRANSCRIPT_TEXT,
        "confidential",
        "Confidential",
        "board-meeting",
        "audio.example.org",
        "X-Amz-Signature",
        "inst-ready",  # provider instance ids are not labels either
        *(job.id for job in scenario.jobs),
    ]
    for secret in secrets:
        assert secret not in text
    assert "://" not in text
    allowed = {"profile", "worker", "gpu", "state", "outcome", "reason", "le"}
    assert {k for _, labels, _ in samples(text) for k in labels} <= allowed
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("murmur_")
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed; the official parser accepted the scrape")
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_our_text_encoding_is_byte_for_byte_the_librarys(obs: ObsEnv) -> None:
    populate(obs)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MurmurCollector(obs.settings, obs.db, obs.redis, clock=lambda: 1.9e9))
    assert encode_text(registry) == generate_latest(registry)


def test_values_formatted_once_per_scrape_still_print_as_the_library_prints_them() -> None:
    """Equal values share one formatting, but -0.0, 0 and 0.0 or 1 and 1.0 keep their text."""
    values = [0.0, -0.0, 0, 1, 1.0, True, 2.5e-07, 6e9, 6000000.0, float("nan"), float("inf")]
    values += [-float("inf"), 123456789.0, 0.1 + 0.2, 0.30000000000000004, 1e21]

    class Fixed:
        def collect(self) -> list[GaugeMetricFamily]:
            family = GaugeMetricFamily("murmur_probe", "Values.", labels=["worker"])
            for index, value in enumerate(values * 2):  # each value twice: cached the second
                family.add_metric([f"w{index}"], value)
            return [family]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    assert encode_text(registry) == generate_latest(registry)


def test_row_families_print_as_the_library_prints_their_samples() -> None:
    """SeriesFamily rows (values needing escapes, a counter's _total) match generate_latest."""
    gauge = SeriesFamily("murmur_probe_ratio", "A gauge.", "gauge", ("worker", "gpu"))
    counter = SeriesFamily("murmur_probe_events", "A counter.", "counter", ("worker", "outcome"))
    for worker in ("plain", 'quo"te', "back\\slash", "new\nline"):
        gauge.add((worker, "0"), 0.25)
        gauge.add((worker, "1"), -0.0)
        counter.add((worker, "failed"), 3)

    class Fixed:
        def collect(self) -> list[SeriesFamily]:
            return [gauge, counter]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    text = encode_text(registry)
    assert text == generate_latest(registry)
    assert b'murmur_probe_events_total{outcome="failed",worker="quo\\"te"} 3.0' in text
    with pytest.raises(ValueError, match="labels"):
        SeriesFamily("murmur_probe", "No labels.", "gauge", ())


def test_every_api_process_serves_the_same_numbers(obs: ObsEnv) -> None:
    worker = live_worker(obs.db)
    # Two apps with their own connections stand in for two gunicorn processes.
    other_db = Database(obs.settings.database_url)
    try:
        other = build_app(obs.settings, other_db).test_client()
        assert post_report(obs.client, worker, make_report(2)).status_code == 200
        assert post_report(other, worker, make_report(1)).status_code == 409
        bad = other.post(
            f"/internal/workers/{worker.id}/{worker.instance_id}/report",
            data=b"{}",
            content_type="application/json",
        )
        assert bad.status_code == 401
        texts = [
            scrape(obs),
            str(other.get("/metrics", headers=scrape_headers()).get_data(as_text=True)),
        ]
    finally:
        other_db.dispose()
    for text in texts:
        assert value(text, "murmur_worker_reports_accepted_total") == 1
        assert value(text, "murmur_worker_report_rejections_total", reason="stale_sequence") == 1
        assert value(text, "murmur_worker_report_rejections_total", reason="unauthorized") == 1


def test_retired_workers_series_disappear(obs: ObsEnv) -> None:
    fast = obs.with_interval(0.2)
    kept, retired = live_worker(fast.db), live_worker(fast.db)
    for worker in (kept, retired):
        assert post_report(fast.client, worker, make_report(1)).status_code == 200
    with fast.db.session() as s:
        s.execute(
            update(Worker).where(Worker.id == retired.id).values(state=WorkerState.DELETED.value)
        )
    text = scrape(fast)
    # Gone from the scrape at once, although Redis still holds its snapshot for a moment.
    assert series_of(text, retired.id) == []
    assert "murmur_worker_cpu_utilization_ratio" in series_of(text, kept.id)
    wait_for(
        lambda: store.read_snapshot(fast.redis, kept.id) is None, 10, "the snapshots to expire"
    )
    text = scrape(fast)
    # Usage series go with the snapshot; freshness stays for a worker still in the inventory.
    assert series_of(text, kept.id) == ["murmur_worker_report_age_seconds"]
    # The retired worker's leftovers are pruned by a scrape (the fleet had not forgotten it)
    # once older than the snapshot's life: scraped again until then, on a loaded machine.
    wait_for(
        lambda: scrape(fast) and store.read_last_report(fast.redis, retired.id) is None,
        10,
        "a scrape to prune the retired worker's freshness",
    )
    assert store.read_last_report(fast.redis, kept.id) is not None
