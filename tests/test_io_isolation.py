"""Reconcile and dispatch never wait behind slow peers (issue 21, §1): with every thread of the
I/O worker held by tarpitted URL fetches and dripping webhook receivers, an upload on an empty
fleet still gets a worker from the reconcile (on the control worker), runs and succeeds, and
`/readyz` stays 200, while the tarpits still hold their connections.

Before the `io` queue, fetches and webhooks ran on the control worker: this upload then waited
for the fetch deadline (300 s) with no worker. Real processes throughout: a control worker
(solo, as tests run it), an I/O worker (threads), the GPU worker the `local` provider starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.celery_config import RECONCILE, make_celery
from app.fleet.providers.local import LocalProvider
from tests.conftest import API_TOKEN, FIXTURES, OTHER_TOKEN, LiveApi, Proc, auth, wait_for
from tests.slow_peers import SlowPeer, slow_peer

IO_THREADS = 4  # tests/conftest.py io_worker


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    return {"MURMUR_LOCAL_STATE_DIR": str(tmp_path / "instances")}


@pytest.fixture()
def peer() -> Iterator[SlowPeer]:
    with slow_peer(drip_seconds=1.0) as p:
        yield p


@pytest.fixture()
def local_workers(live_api: LiveApi, tmp_path: Path) -> Iterator[None]:
    """Whatever worker the reconcile starts is deleted at the end, whatever happened."""
    yield
    provider = LocalProvider(live_api.settings, state_dir=tmp_path / "instances", term_grace=5)
    for instance in provider.list_by_tag(frozenset()):
        provider.delete(instance.instance_id, instance.resources)


def submit_url(live: LiveApi, url: str, token: str, **extra: str) -> str:
    response = requests.post(
        f"{live.url}/v1/jobs", json={"url": url, **extra}, headers=auth(token), timeout=30
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def status(live: LiveApi, job_id: str, token: str = API_TOKEN) -> dict[str, Any]:
    response = requests.get(f"{live.url}/v1/jobs/{job_id}", headers=auth(token), timeout=10)
    return dict(response.json())


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_upload_runs_while_every_io_thread_waits_on_a_slow_peer(
    live_api: LiveApi,
    control_worker: Proc,
    io_worker: Proc,
    peer: SlowPeer,
    local_workers: None,
) -> None:
    # Two URL jobs that fail at once, each with a webhook to a receiver that drips its answer
    # (another token: a token's own fetch bound is not what this is about)...
    for n in range(2):
        submit_url(
            live_api, f"{peer.url}/missing{n}.wav", OTHER_TOKEN, webhook_url=f"{peer.url}/hook"
        )
    wait_for(lambda: peer.open_hooks == 2, 60, "both webhooks to be waiting on the receiver")
    # ... and two URL jobs at tarpits: every I/O thread now waits on a peer.
    tarpitted = [submit_url(live_api, f"{peer.url}/tarpit{n}.wav", OTHER_TOKEN) for n in range(2)]
    wait_for(lambda: peer.open_tarpits == 2, 60, "both fetches to be held by the tarpit")
    assert peer.open_hooks + peer.open_tarpits == IO_THREADS

    response = requests.post(
        f"{live_api.url}/v1/jobs",
        files={"file": ("speech.wav", (FIXTURES / "speech-short.wav").read_bytes())},
        headers=auth(),
        timeout=30,
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert response.json()["status"] == "queued"  # an empty fleet: the reconcile must act

    celery = make_celery(live_api.settings)
    readyz: list[int] = []

    def done() -> bool:
        RECONCILE.send(celery)  # as beat would, every second
        readyz.append(requests.get(f"{live_api.url}/readyz", timeout=10).status_code)
        job = status(live_api, job_id)
        assert job["status"] not in ("failed", "cancelled"), job
        return job["status"] == "succeeded"

    try:
        wait_for(done, 240, "the upload to be transcribed", step=1.0)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\ncontrol worker:\n{control_worker.output()[-3000:]}"
            f"\nI/O worker:\n{io_worker.output()[-2000:]}"
        ) from None
    finally:
        celery.close()
    # The fetches were still held by the tarpit when the upload finished (their deadline is
    # 300 s): the reconcile and the dispatch did not wait for them.
    assert peer.open_tarpits == 2
    assert all(status(live_api, j, OTHER_TOKEN)["status"] == "queued" for j in tarpitted)
    assert readyz and set(readyz) == {200}
    # (The banner lists every registered task; a received one is logged as `name[id]`.)
    assert "murmur.control.fetch_audio[" not in control_worker.output()
    assert "murmur.control.deliver_webhook[" not in control_worker.output()
    assert "murmur.control.fetch_audio[" in io_worker.output()
