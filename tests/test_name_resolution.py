"""Resolving a submitted URL's host has a deadline (issue 21, §7): a resolver that never
answers costs a request a bounded wait and a clear `503 name_resolution_timeout`, never a held
thread, and the resolver threads it leaves behind are bounded per process.

The system resolver is replaced, in this test process only, by one that never answers for
hosts under `.hang.test` until the test ends (every other name resolves as usual).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app import urls
from app.errors import Refused
from app.models import Job
from tests.conftest import FIXTURES, auth, wait_for

HANGING = ".hang.test"


class HangingResolver:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(HANGING):
            with self._lock:
                self.waiting += 1
            self.release.wait()
            raise socket.gaierror(socket.EAI_AGAIN, "temporary failure")
        return self._real(host, *args, **kwargs)


@pytest.fixture()
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HangingResolver]:
    hanging = HangingResolver()
    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    monkeypatch.setattr(urls, "RESOLVE_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(urls, "_resolvers", threading.BoundedSemaphore(3))
    yield hanging
    hanging.release.set()  # the resolver threads left waiting end with the test


def answered(call: Callable[[], Any]) -> Any:
    """`call()`'s result (or its exception), from a thread: a request held for good fails the
    test instead of hanging CI."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert outcome, "the request is still waiting on the resolver"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def job_count(db: Any) -> int:
    with db.reader() as s:
        return len(s.query(Job.id).all())


def test_a_url_whose_host_never_resolves_is_503_not_a_held_request(
    client: Any, db: Any, resolver: HangingResolver
) -> None:
    response = answered(
        lambda: client.post(
            "/v1/jobs", json={"url": f"http://audio{HANGING}/talk.mp3"}, headers=auth()
        )
    )
    # The resolver has not answered (and never will, until the test ends): the request was
    # answered on its own deadline, not the resolver's.
    assert not resolver.release.is_set()
    assert response.status_code == 503, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "name_resolution_timeout"
    assert f"audio{HANGING}" in error["message"] and "url" in error["message"]
    assert response.headers["Retry-After"] == "5"
    assert job_count(db) == 0


def test_a_webhook_host_that_never_resolves_is_refused_the_same_way(
    client: Any, db: Any, resolver: HangingResolver
) -> None:
    response = answered(
        lambda: client.post(
            "/v1/jobs",
            data={
                "file": ((FIXTURES / "speech-short.wav").open("rb"), "a.wav"),
                "webhook_url": f"https://hooks{HANGING}/murmur",
            },
            headers=auth(),
        )
    )
    assert response.status_code == 503, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "name_resolution_timeout" and "webhook_url" in error["message"]
    assert job_count(db) == 0


def test_hung_resolutions_are_bounded_per_process_and_free_again_after(
    resolver: HangingResolver,
) -> None:
    for n in range(3):  # every resolver thread of the process waits on a hung name server
        with pytest.raises(Refused) as refused:
            answered(lambda n=n: urls.check_url(f"http://h{n}{HANGING}/a.wav"))
        assert refused.value.code == "name_resolution_timeout"
    wait_for(lambda: resolver.waiting == 3, 30, "three resolver threads to wait")
    # No fourth thread is started: a name that would resolve at once waits its deadline for
    # a resolver thread, and is refused the same way, never queued for ever.
    with pytest.raises(Refused) as refused:
        answered(lambda: urls.check_url("http://localhost/a.wav", allow_private=True))
    assert refused.value.code == "name_resolution_timeout"
    assert resolver.waiting == 3
    resolver.release.set()  # the name servers answer (with a failure) at last

    def resolves() -> urls.CheckedUrl | None:
        try:
            return urls.check_url("http://localhost/a.wav", allow_private=True)
        except Refused:
            return None

    checked = wait_for(resolves, 30, "the resolver threads to be freed")
    assert checked.addresses


def test_a_failing_resolver_is_still_invalid_url(resolver: HangingResolver) -> None:
    resolver.release.set()  # hung names now fail at once, as NXDOMAIN or SERVFAIL would
    with pytest.raises(Refused) as refused:
        urls.check_url(f"http://gone{HANGING}/a.wav")
    assert refused.value.code == "invalid_url" and "does not resolve" in refused.value.message
