"""How every Murmur client of a `rediss://` broker verifies it: always, against a named CA.

Invariant: a `rediss://` connection made through these options requires the broker's
certificate (CERT_REQUIRED, host name checked) against the CA file given, or the URL's
`ssl_ca_certs`, or else the system's CA bundle. No URL query can turn that off: kombu treats
a `rediss://` URL without options as *no verification* (it only logs a warning), and both
kombu and redis-py let the URL's `ssl_*` query override options passed in code, so the query
is moved into the options here and `ssl_cert_reqs` / `ssl_check_hostname` are set last.
A `redis://` URL gets no TLS options (loopback, tests and the local demo).
Both the control plane (app/, tasks/) and the worker import this module.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

TLS_SCHEME = "rediss"
# Query options that name files (mutual TLS, CA): kept; the others are decided here.
_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_VERIFIED = ("required", "cert_required")


def is_tls(url: str) -> bool:
    return urlsplit(url).scheme == TLS_SCHEME


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """`url` without its `ssl_*` query options, and those options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if not k.startswith("ssl_")]
    options = {k: v for k, v in query if k.startswith("ssl_")}
    return urlunsplit(parts._replace(query=urlencode(kept))), options


def ssl_options(url: str, ca_certs: str | None = None) -> dict[str, Any] | None:
    """redis-py / kombu TLS options for `url`: None for redis://, verification for rediss://."""
    if not is_tls(url):
        return None
    _, query = split_url(url)
    options: dict[str, Any] = {k: query[k] for k in _FILE_OPTIONS if query.get(k)}
    if ca_certs:
        options["ssl_ca_certs"] = ca_certs
    options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    options["ssl_check_hostname"] = True
    return options


def celery_broker(url: str, ca_certs: str | None = None) -> dict[str, Any]:
    """Celery settings for this broker: `broker_url` and, for rediss://, `broker_use_ssl`."""
    options = ssl_options(url, ca_certs)
    if options is None:
        return {"broker_url": url}
    return {"broker_url": split_url(url)[0], "broker_use_ssl": options}


def verification_problem(url: str) -> str | None:
    """Why `url` asks for a TLS connection without verification, or None.

    The clients verify regardless (see the module docstring); a URL that says otherwise is
    refused by `murmur validate-config` so that what the operator wrote is what runs.
    """
    if not is_tls(url):
        return None
    _, query = split_url(url)
    reqs = query.get("ssl_cert_reqs")
    if reqs is not None and reqs.lower() not in _VERIFIED:
        return f"ssl_cert_reqs={reqs} turns certificate verification off; use required"
    if query.get("ssl_check_hostname", "true").lower() == "false":
        return "ssl_check_hostname=false skips the host name check"
    return None
