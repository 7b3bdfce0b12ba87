"""The bounds on open event streams over real HTTP (app/jobs/stream_limits.py): per token a
clear 429, per process a clear 503, another token unaffected, and a client that disconnects
mid-stream gives back what its stream held (no worker needed: the job stays queued)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from tests.conftest import API_TOKEN, FIXTURES, OTHER_TOKEN, LiveApi, auth, wait_for


@pytest.fixture()
def live_api_env(tmp_path: Path) -> dict[str, str]:
    return {
        "MURMUR_STREAMS_PER_TOKEN": "2",
        "MURMUR_STREAM_MAX_OPEN": "3",
        "MURMUR_STREAM_HEARTBEAT_SECONDS": "1",
    }


def _job(live: LiveApi, token: str) -> str:
    with (FIXTURES / "speech-short.wav").open("rb") as fh:
        answer = requests.post(
            f"{live.url}/v1/jobs", headers=auth(token), files={"file": fh}, timeout=30
        )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _open(live: LiveApi, job_id: str, token: Any = None) -> requests.Response:
    return requests.get(
        f"{live.url}/v1/jobs/{job_id}/events",
        headers=auth(token) if token else auth(),
        stream=True,
        timeout=30,
    )


def _first_event(response: requests.Response) -> str:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    lines: Iterator[str] = response.iter_lines(decode_unicode=True)
    for line in lines:
        if line.startswith("event: "):
            return line.removeprefix("event: ")
    raise AssertionError("the stream ended without an event")


def _leases(client: redis.Redis) -> int:
    return sum(int(client.zcard(key)) for key in client.scan_iter("murmur:streams:*"))


def test_streams_are_bounded_per_token_and_per_process(
    live_api: LiveApi, clean_redis: redis.Redis
) -> None:
    mine, theirs = _job(live_api, API_TOKEN), _job(live_api, OTHER_TOKEN)
    with ExitStack() as held:
        for _ in range(2):
            assert _first_event(held.enter_context(_open(live_api, mine))) == "status"
        refused = _open(live_api, mine)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_streams"
        assert refused.headers["Retry-After"]
        # Another token has its own bound; the process's bound (3) is the next limit.
        assert _first_event(held.enter_context(_open(live_api, theirs, OTHER_TOKEN))) == "status"
        full = _open(live_api, theirs, OTHER_TOKEN)
        assert full.status_code == 503
        assert full.json()["error"]["code"] == "stream_capacity_exhausted"
        assert _leases(clean_redis) == 3
    # Every client left: their streams end at the next look at the socket, and give back
    # their slots and leases.
    wait_for(lambda: _leases(clean_redis) == 0, 15, "the leases to be released")
    for _ in range(3):  # the slots are free again too
        with _open(live_api, mine) as again:
            assert _first_event(again) == "status"
        wait_for(lambda: _leases(clean_redis) == 0, 15, "the lease to be released")


def test_a_stream_of_another_tokens_job_is_not_found(live_api: LiveApi) -> None:
    theirs = _job(live_api, OTHER_TOKEN)
    answer = _open(live_api, theirs)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "job_not_found"


def test_a_bad_last_event_id_is_a_clear_400(live_api: LiveApi) -> None:
    job_id = _job(live_api, API_TOKEN)
    answer = requests.get(
        f"{live_api.url}/v1/jobs/{job_id}/events",
        headers={**auth(), "Last-Event-ID": "not-an-id"},
        timeout=30,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_last_event_id"


def test_a_queued_job_sends_its_status_and_heartbeats(live_api: LiveApi) -> None:
    job_id = _job(live_api, API_TOKEN)
    with _open(live_api, job_id) as response:
        lines = response.iter_lines(decode_unicode=True)
        head = [next(lines) for _ in range(6)]
        assert head[0] == "retry: 3000"
        assert head[2].startswith("id: ") and head[3] == "event: status"
        assert json.loads(head[4].removeprefix("data: ")) == {"status": "queued"}
        # Nothing happens to a queued job with no worker: a comment keeps proxies from
        # closing the idle stream.
        assert next(line for line in lines if line) == ": heartbeat"
