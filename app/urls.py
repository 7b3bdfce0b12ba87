"""Safety checks for URLs the service will fetch (audio inputs) or call (webhooks): no SSRF.

A URL must be http(s), carry no credentials, and every address its host resolves to must be
public. Fetches pin the connection to an address checked here, so a DNS answer that changes
between the check and the connect (rebinding) cannot reach an internal host.

Name resolution has a deadline: the system resolver (getaddrinfo, which cannot be interrupted)
runs on a thread of its own, at most `RESOLVER_THREADS` of them per process, and a caller
waits for its answer (or for a free resolver thread) `RESOLVE_TIMEOUT_SECONDS` at most, then
is refused `name_resolution_timeout` (503, Retry-After). So a host whose name servers never
answer holds no request thread past the deadline, and the resolver threads it leaves waiting
are bounded per process; they end when the system resolver gives up on its own.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter

from app.errors import Refused
from app.inputs import check_text


@dataclass(frozen=True)
class CheckedUrl:
    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


# How long a URL check waits for the resolver, and how many resolutions may wait at once in a
# process (the ones past their deadline included).
RESOLVE_TIMEOUT_SECONDS = 5.0
RESOLVER_THREADS = 8
_resolvers = threading.BoundedSemaphore(RESOLVER_THREADS)

AddrInfo = tuple[Any, Any, Any, Any, Any]


def _too_slow(field: str, host: str, seconds: float) -> Refused:
    return Refused(
        "name_resolution_timeout",
        f"{field}: resolving the host {host} took longer than {seconds:g} s; retry later",
    )


def resolve(host: str, port: int, *, field: str = "url") -> list[AddrInfo]:
    """`socket.getaddrinfo(host, port)` for stream sockets, within the resolve deadline."""
    seconds = RESOLVE_TIMEOUT_SECONDS
    deadline = time.monotonic() + seconds
    threads = _resolvers
    if not threads.acquire(timeout=seconds):
        raise _too_slow(field, host, seconds)
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # handed to the caller, if it still waits
            outcome["error"] = exc
        finally:
            threads.release()
            done.set()

    threading.Thread(target=run, name="resolve", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise _too_slow(field, host, seconds)
    if "error" in outcome:
        raise outcome["error"]
    return list(outcome["infos"])


# IPv6 prefixes that carry an IPv4 address inside: judge them by that address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and (ip in _NAT64 or ip in _IPV4_COMPATIBLE):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return embedded.is_global and not embedded.is_multicast
    return ip.is_global and not ip.is_multicast


def check_url(url: str, *, field: str = "url", allow_private: bool = False) -> CheckedUrl:
    """Validate the URL's shape and resolve its host; refuse it (`invalid_url`) with the reason,
    or `name_resolution_timeout` when the resolver does not answer in time."""
    if not isinstance(url, str) or len(url) > 2048:
        raise Refused("invalid_url", f"{field} must be a string of at most 2048 characters")
    check_text(url, field)  # a NUL or lone surrogate would reach the resolver and the database
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Refused("invalid_url", f"{field} is not a valid URL") from exc
    if parts.scheme not in ("http", "https"):
        raise Refused(
            "invalid_url", f"{field} must use http or https, not {parts.scheme or 'nothing'}"
        )
    if parts.username is not None or parts.password is not None:
        raise Refused("invalid_url", f"{field} must not contain credentials")
    host = parts.hostname
    if not host:
        raise Refused("invalid_url", f"{field} has no host")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = resolve(host, port, field=field)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused("invalid_url", f"{field}: the host {host} does not resolve") from exc
    addresses = tuple(sorted({str(info[4][0]) for info in infos}))
    if not allow_private:
        for address in addresses:
            if not _is_public(address):
                raise Refused(
                    "forbidden_url",
                    f"{field} points to a private, loopback or link-local address",
                )
    return CheckedUrl(url=url, host=host, port=port, addresses=addresses)


class _PinnedAdapter(HTTPAdapter):
    """Connects to one pre-checked address while keeping the URL's host for TLS and Host.

    The request goes to the IP itself (so no second DNS answer can redirect it), with the
    original host in the Host header, in TLS SNI and in certificate verification.
    """

    def __init__(self, checked: CheckedUrl) -> None:
        self._checked = checked
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self._checked.host
        kwargs["assert_hostname"] = self._checked.host
        super().init_poolmanager(*args, **kwargs)

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        parts = urlsplit(request.url or "")
        address = self._checked.addresses[0]
        literal = f"[{address}]" if ":" in address else address
        request.headers["Host"] = parts.netloc
        request.url = urlunsplit(parts._replace(netloc=f"{literal}:{self._checked.port}"))
        return super().send(request, *args, **kwargs)


@contextmanager
def pinned_session(checked: CheckedUrl) -> Iterator[requests.Session]:
    """A requests session that will only connect to the checked address and follows no redirect."""
    session = requests.Session()
    session.max_redirects = 0
    session.trust_env = False  # no proxy from the environment, no .netrc credentials
    adapter = _PinnedAdapter(checked)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    try:
        yield session
    finally:
        session.close()
