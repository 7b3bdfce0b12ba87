"""Safety checks for URLs the service will fetch (audio inputs) or call (webhooks): no SSRF.

A URL must be http(s), carry no credentials, and every address its host resolves to must be
public. Fetches pin the connection to an address checked here, so a DNS answer that changes
between the check and the connect (rebinding) cannot reach an internal host.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter

from app.errors import ApiError


@dataclass(frozen=True)
class CheckedUrl:
    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


def _is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def check_url(url: str, *, field: str = "url", allow_private: bool = False) -> CheckedUrl:
    """Validate the URL's shape and resolve its host; raise ApiError 400 with the reason."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ApiError(400, "invalid_url", f"{field} must be a string of at most 2048 characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ApiError(400, "invalid_url", f"{field} is not a valid URL") from exc
    if parts.scheme not in ("http", "https"):
        raise ApiError(
            400, "invalid_url", f"{field} must use http or https, not {parts.scheme or 'nothing'}"
        )
    if parts.username is not None or parts.password is not None:
        raise ApiError(400, "invalid_url", f"{field} must not contain credentials")
    host = parts.hostname
    if not host:
        raise ApiError(400, "invalid_url", f"{field} has no host")
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ApiError(400, "invalid_url", f"{field}: the host {host} does not resolve") from exc
    addresses = tuple(sorted({str(info[4][0]) for info in infos}))
    if not allow_private:
        for address in addresses:
            if not _is_public(address):
                raise ApiError(
                    400,
                    "forbidden_url",
                    f"{field} points to a private, loopback or link-local address",
                )
    return CheckedUrl(url=url, host=host, port=port, addresses=addresses)


# Pinning swaps the resolver for the duration of one send; the lock keeps threads apart.
_resolver_lock = threading.Lock()


class _PinnedAdapter(HTTPAdapter):
    """Connects to one pre-checked address while keeping the URL's host for TLS and Host."""

    def __init__(self, address: str) -> None:
        self._address = address
        super().__init__(max_retries=0)

    def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        original = socket.getaddrinfo

        def pinned(host, port, *a, **kw):  # type: ignore[no-untyped-def]
            return original(self._address, port, *a, **kw)

        with _resolver_lock:
            socket.getaddrinfo = pinned
            try:
                return super().send(request, *args, **kwargs)
            finally:
                socket.getaddrinfo = original


@contextmanager
def pinned_session(checked: CheckedUrl) -> Iterator[requests.Session]:
    """A requests session that will only connect to the checked address and follows no redirect."""
    session = requests.Session()
    session.max_redirects = 0
    adapter = _PinnedAdapter(checked.addresses[0])
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    try:
        yield session
    finally:
        session.close()
