"""The worker's Celery settings and task: what the protocol asks, and the drain hand-back."""

from __future__ import annotations

import pytest
from celery.exceptions import Reject

from gpu_worker.celery_app import celery_config, make_celery
from gpu_worker.jobs import DrainDeadlineExceeded, Outcome
from gpu_worker.protocol.broker import TRANSCRIBE_TASK


def test_settings_follow_the_protocol():
    conf = celery_config("redis://127.0.0.1:6379/0", "transcribe.l4-fp16")

    assert conf["task_acks_late"] is True
    assert conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["worker_concurrency"] == 1
    assert conf["worker_pool"] == "solo"
    assert conf["worker_send_task_events"] is True
    assert conf["task_send_sent_event"] is True
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is True
    assert conf["task_ignore_result"] is True
    assert conf["result_backend"] is None
    # Above the longest job (4 h of audio is the API's limit) and equal to the control
    # plane's, since the shortest visibility timeout on a Redis wins.
    assert conf["broker_transport_options"]["visibility_timeout"] == 4 * 3600
    assert conf["task_queues"] == {"transcribe.l4-fp16": {}}
    assert conf["task_routes"] == {TRANSCRIBE_TASK: {"queue": "transcribe.l4-fp16"}}


def test_the_task_runs_the_job_by_id():
    seen = []

    def run_job(job_id):
        seen.append(job_id)
        return Outcome.NOT_CLAIMABLE

    app = make_celery("redis://127.0.0.1:1/0", "transcribe.p", run_job)
    task = app.tasks[TRANSCRIBE_TASK]

    assert task.run("job_1") == "not_claimable"
    assert seen == ["job_1"]
    assert task.acks_late is True
    assert task.reject_on_worker_lost is True


def test_a_drain_deadline_rejects_the_message_with_requeue():
    def run_job(job_id):
        raise DrainDeadlineExceeded()

    task = make_celery("redis://127.0.0.1:1/0", "transcribe.p", run_job).tasks[TRANSCRIBE_TASK]

    with pytest.raises(Reject) as caught:
        task.run("job_1")
    assert caught.value.requeue is True


def _task(run_job, **kw):
    return make_celery("redis://127.0.0.1:1/0", "transcribe.p", run_job, **kw).tasks[
        TRANSCRIBE_TASK
    ]


def test_a_retired_worker_hands_the_message_back_and_stops():
    from gpu_worker.client import ControlPlaneError

    stopped = []

    def run_job(job_id):
        raise ControlPlaneError("POST claim: 403 worker_retired", status=403, code="worker_retired")

    task = _task(run_job, on_retired=lambda: stopped.append(True))
    with pytest.raises(Reject) as caught:
        task.run("job_1")
    assert caught.value.requeue is True
    assert stopped == [True]


def test_an_unreachable_control_plane_is_retried_then_handed_back(monkeypatch):
    from celery.exceptions import Retry

    from gpu_worker.celery_app import MAX_RETRIES, RETRY_BACKOFF_MAX_SECONDS
    from gpu_worker.client import ControlPlaneUnavailable

    def run_job(job_id):
        raise ControlPlaneUnavailable("connection refused")

    task = _task(run_job)
    countdowns = []

    def fake_retry(exc, countdown):
        countdowns.append(countdown)
        return Retry(exc=exc, when=countdown)

    monkeypatch.setattr(task, "retry", fake_retry)
    for retries in range(MAX_RETRIES):
        task.push_request(retries=retries)
        try:
            with pytest.raises(Retry):
                task.run("job_1")
        finally:
            task.pop_request()
    assert len(countdowns) == MAX_RETRIES
    assert all(0 < c <= RETRY_BACKOFF_MAX_SECONDS for c in countdowns)
    task.push_request(retries=MAX_RETRIES)
    try:
        with pytest.raises(Reject) as caught:
            task.run("job_1")
    finally:
        task.pop_request()
    assert caught.value.requeue is True


def test_other_control_plane_errors_propagate():
    from gpu_worker.client import ControlPlaneError

    def run_job(job_id):
        raise ControlPlaneError("claim: unexpected answer", status=200)

    with pytest.raises(ControlPlaneError):
        _task(run_job).run("job_1")
