"""GET /v1/workers/<id>/diagnostics: lifecycle timings, latest report and log tail, admin only."""

from __future__ import annotations

from datetime import timedelta

from app.models import Worker, WorkerState, utcnow
from gpu_worker.telemetry import render_record
from tests.conftest import ADMIN_TOKEN, API_TOKEN, auth
from tests.observability.conftest import (
    ObsEnv,
    credential,
    make_report,
    post_report,
    scrape_headers,
)
from tests.observability.test_log_lines import LINE_BREAKS, log_record


def _booted_worker(obs: ObsEnv) -> Worker:
    now = utcnow()
    worker = Worker(
        profile="local-cpu",
        provider="local",
        instance_id="inst-diag",
        state=WorkerState.READY.value,
        requested_at=now - timedelta(seconds=60),
        created_at=now - timedelta(seconds=58),
        booted_at=now - timedelta(seconds=40),
        ready_at=now - timedelta(seconds=30),
    )
    with obs.db.session() as s:
        s.add(worker)
    return worker


def test_diagnostics_need_the_admin_token(obs: ObsEnv) -> None:
    worker = _booted_worker(obs)
    url = f"/v1/workers/{worker.id}/diagnostics"
    for headers in ({}, auth(API_TOKEN), scrape_headers(), auth(credential(worker))):
        assert obs.client.get(url, headers=headers).status_code == 401
    off = obs.with_settings(MURMUR_ADMIN_TOKEN="")
    response = off.client.get(url, headers=auth(ADMIN_TOKEN))
    assert response.status_code == 404


def test_unknown_worker(obs: ObsEnv) -> None:
    response = obs.client.get("/v1/workers/wrk_nope/diagnostics", headers=auth(ADMIN_TOKEN))
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "worker_not_found"


def test_diagnostics_show_timings_report_and_redacted_log(obs: ObsEnv) -> None:
    worker = _booted_worker(obs)
    token = credential(worker)
    lines = [
        {"number": 1, "text": "INFO gpu_worker.service: model tiny.en loaded in 0.21 s"},
        {"number": 2, "text": f"WARNING gpu_worker.client: sent Bearer {token} to http://x/y"},
    ]
    assert post_report(obs.client, worker, make_report(4, log=lines)).status_code == 200
    response = obs.client.get(f"/v1/workers/{worker.id}/diagnostics", headers=auth(ADMIN_TOKEN))
    assert response.status_code == 200
    body = response.get_json()
    assert body["worker"]["state"] == "ready"
    phases = body["lifecycle"]["phases"]
    assert phases["provision_seconds"] == 2.0
    assert phases["boot_seconds"] == 18.0
    assert phases["startup_seconds"] == 10.0
    assert phases["first_job_wait_seconds"] is None
    assert body["lifecycle"]["timestamps"]["ready_at"] is not None
    assert body["report"]["latest"]["sequence"] == 4
    assert body["report"]["age_seconds"] >= 0
    log = body["log"]["lines"]
    assert log[0].endswith("model tiny.en loaded in 0.21 s")
    assert token not in response.get_data(as_text=True)
    assert "http://x" not in log[1]
    assert "200 lines" in body["log"]["retention"]


HEX = "ab" * 32


def test_a_line_separator_splits_no_line_on_either_side(obs: ObsEnv) -> None:
    # The worker's and the control plane's redaction had drifted: only the control plane
    # turned U+2028/U+2029 into spaces. Both run gpu_worker/protocol/redaction.py now.
    worker = _booted_worker(obs)
    raw = "job_1 done\u2028FAKE ERROR injected\u2029and\x85more"
    sent = render_record(log_record(raw))  # what the worker puts in its tail
    assert len(sent.splitlines()) == 1 and "FAKE ERROR injected" in sent
    # An old worker's line, uncleaned, and the current worker's, through the report endpoint.
    lines = [{"number": 1, "text": raw}, {"number": 2, "text": sent}]
    assert post_report(obs.client, worker, make_report(1, log=lines)).status_code == 200
    response = obs.client.get(f"/v1/workers/{worker.id}/diagnostics", headers=auth(ADMIN_TOKEN))
    stored = response.get_json()["log"]["lines"]
    assert len(stored) == 2
    for line in stored:
        assert len(line.splitlines()) == 1, line
        assert not set(line) & set(LINE_BREAKS)


def test_the_control_plane_removes_what_an_old_worker_left(obs: ObsEnv) -> None:
    worker = _booted_worker(obs)
    token = credential(worker)
    text = f"sent {token} to redis://:pw@10.0.0.2:6379/0 then Bearer\x00{HEX[:20]} sig={HEX}"
    lines = [{"number": 1, "text": text}]
    assert post_report(obs.client, worker, make_report(1, log=lines)).status_code == 200
    response = obs.client.get(f"/v1/workers/{worker.id}/diagnostics", headers=auth(ADMIN_TOKEN))
    (stored,) = response.get_json()["log"]["lines"]
    for secret in (token, "pw@", "10.0.0.2", HEX[:20]):
        assert secret not in stored
