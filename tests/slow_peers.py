"""Peers that hold a connection as long as they like, on 127.0.0.1: what a hostile client points
URL jobs and webhooks at (issue 21). Used by tests/test_io_isolation.py and
bench/peer_isolation.py.

One server, three paths:
- `GET /tarpit…`: the status line, then one header byte every `drip_seconds`, for ever (until
  the client gives up or the server closes): a URL fetch waits on it until its deadline;
- `GET /missing…`: `404` at once, so a URL job fails fast and fires its webhook;
- `POST /hook…`: reads the request, then answers one byte of its status line every
  `drip_seconds`: a webhook attempt waits on it until its deadline.

`open_tarpits` and `open_hooks` count the connections held right now.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class SlowPeer:
    def __init__(self, drip_seconds: float = 10.0) -> None:
        self.drip_seconds = drip_seconds
        self.open_tarpits = 0
        self.open_hooks = 0
        self.hooks_seen = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, name="slow-peer", daemon=True)
        accept.start()
        self._threads.append(accept)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            serve = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            serve.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                method, path = (line.split(" ") + ["", ""])[:2]
                if method == "GET" and path.startswith("/missing"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                elif method == "GET" and path.startswith("/tarpit"):
                    self._drip(conn, b"HTTP/1.1 200 OK\r\n", b"X", "open_tarpits")
                elif method == "POST" and path.startswith("/hook"):
                    with self._lock:
                        self.hooks_seen += 1
                    self._drip(conn, b"", b"HTTP/1.1 200 OK\r\n", "open_hooks")
                else:
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                return

    def _drip(self, conn: socket.socket, first: bytes, drip: bytes, counter: str) -> None:
        """Send `first`, then `drip` one byte per interval, until the client hangs up."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)
        try:
            if first:
                conn.sendall(first)
            i = 0
            while not self._closing.is_set():
                # Readable means the client closed (or reset): it is counted out at once.
                readable, _, _ = select.select([conn], [], [], self.drip_seconds)
                if readable and not conn.recv(4096):
                    return
                conn.sendall(drip[i % len(drip) : i % len(drip) + 1])
                i += 1
        except OSError:
            pass  # the client gave up (its deadline), as it should
        finally:
            with self._lock:
                setattr(self, counter, getattr(self, counter) - 1)

    def close(self) -> None:
        self._closing.set()
        with suppress(OSError):
            self._listener.close()


@contextmanager
def slow_peer(drip_seconds: float = 10.0) -> Iterator[SlowPeer]:
    peer = SlowPeer(drip_seconds)
    try:
        yield peer
    finally:
        peer.close()
