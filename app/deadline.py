"""A deadline on a whole outbound HTTP exchange, which per-read timeouts cannot give.

requests' read timeout bounds each socket read, not the exchange: a server that sends one byte
per read timeout (in its headers or its body) holds the caller for as long as it likes, and
`iter_content` returns only once a whole chunk or the end has arrived, so a deadline checked
between chunks never runs (issue 10 review, M3 and M4).

`exchange_deadline(session, seconds)` watches every socket the session connects while it is
entered. When the time is up it shuts those sockets down, so a blocked read returns at once and
the exchange fails; `Deadline.fired` tells the caller that this was the reason.

Invariants:
- No read on a watched socket blocks past the deadline by more than `_REPEAT_SECONDS`: the
  watchdog shuts the sockets down, and repeats while the exchange runs, so a socket connected
  just after the first shot is reached too. A TLS handshake in progress is bounded by the
  per-read timeout only (the socket is watched once connected, TLS included).
- A body cut short by the watchdog is never taken as complete: callers check `fired` after
  reading, since a response without a length just looks as if it ended.
- Shutting down a socket that has since been closed fails harmlessly (the socket object no
  longer holds a descriptor), so the watchdog never touches a descriptor reused elsewhere.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

# How often the watchdog shoots again after the deadline while the exchange is still running.
_REPEAT_SECONDS = 0.5


class Deadline:
    """Shuts down the sockets it watches once `seconds` have passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)

    def watch(self, connection: Any) -> None:
        """Watch the socket `connection` opens: kept here, not read from the connection when
        the time comes, because http.client hands a closing response's socket to the response
        and forgets it (`connection.sock` is None while the body is still being read)."""
        connect = connection.connect

        def connect_and_watch() -> None:
            connect()
            with self._lock:
                self._sockets.append(connection.sock)

        connection.connect = connect_and_watch

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.fired = True
        while True:
            with self._lock:
                sockets = list(self._sockets)
            for sock in sockets:
                with contextlib.suppress(OSError):  # closed already
                    sock.shutdown(socket.SHUT_RDWR)
            if self._done.wait(_REPEAT_SECONDS):
                return


def _watched_pools(deadline: Deadline) -> dict[str, type[HTTPConnectionPool]]:
    """Connection pool classes that hand every connection they open to `deadline`."""

    class WatchedPool(HTTPConnectionPool):
        def _new_conn(self) -> Any:
            connection = super()._new_conn()
            deadline.watch(connection)
            return connection

    class WatchedHttpsPool(HTTPSConnectionPool):
        def _new_conn(self) -> Any:
            connection = super()._new_conn()
            deadline.watch(connection)
            return connection

    return {"http": WatchedPool, "https": WatchedHttpsPool}


@contextmanager
def exchange_deadline(session: requests.Session, seconds: float) -> Iterator[Deadline]:
    """Bound everything the session does inside the block (connect, TLS, headers, body).

    Enter it before the session's first request: pools it opened earlier are not watched.
    """
    deadline = Deadline(seconds)
    for adapter in session.adapters.values():
        if isinstance(adapter, HTTPAdapter):
            adapter.poolmanager.pool_classes_by_scheme = _watched_pools(deadline)
    deadline.start()
    try:
        yield deadline
    finally:
        deadline.stop()
