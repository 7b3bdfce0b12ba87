"""How a `murmur` command answers a dependency it cannot use: one line on stderr, exit 1.

A missing database, a broker that refuses the connection or the certificate, an API that
is not listening, a configuration that does not load: an operator needs what failed and
where, not a traceback. Nothing secret is printed: URLs are shown without their password,
and the driver's text goes through the same redaction as worker log lines.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click

from app.config import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def one_line(exc: BaseException, secrets: tuple[str, ...] = ()) -> str:
    """The exception's text on one line, without secrets, URLs or tokens."""
    from gpu_worker.protocol.redaction import clean_log_line

    text = str(exc) or type(exc).__name__
    return clean_log_line(" ".join(text.split()), secrets)


def database_where(url: str) -> str:
    """The database an operator configured, without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(an unparsable database URL)"


def broker_where(url: str, sentinels: Sequence[str] = ()) -> str:
    """The broker's address (host:port, or its Sentinels), never its credentials."""
    if sentinels:
        return "Sentinels " + ", ".join(sentinels)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{parts.hostname or '?'}:{port or 6379}"


def _settings_secrets() -> tuple[str, ...]:
    """Passwords of the configured URLs, so a driver that echoes one cannot print it."""
    try:
        from app.config import load_settings

        settings = load_settings()
    except Exception:  # noqa: BLE001 - only a redaction aid; the URL text is redacted anyway
        return ()
    found = []
    for url in (settings.database_url, settings.redis_url, settings.worker_broker_url or ""):
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            found.append(password)
    return tuple(found)


def fail(message: str) -> None:
    click.echo(f"murmur: {message}", err=True)
    sys.exit(1)


def one_line_errors(command: F) -> F:
    """Turn an unreachable database, broker or API, or a bad configuration, into one line."""
    import redis
    import requests
    from sqlalchemy.exc import DBAPIError

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConfigError as exc:
            click.echo("configuration problems:\n  - " + "\n  - ".join(exc.problems), err=True)
            sys.exit(1)
        except DBAPIError as exc:
            from app.config import load_settings

            try:
                where = database_where(load_settings().database_url)
            except ConfigError:
                where = "the database"
            cause = exc.orig if exc.orig is not None else exc
            fail(f"cannot use the database {where}: {one_line(cause, _settings_secrets())}")
        except redis.RedisError as exc:
            fail(f"cannot reach the broker: {one_line(exc, _settings_secrets())}")
        except requests.ConnectionError as exc:
            import os

            url = os.environ.get("MURMUR_URL", "http://127.0.0.1:8000")
            fail(
                f"cannot reach the API at {broker_where(url) if '@' in url else url}: "
                f"{one_line(exc)} (is MURMUR_URL right, is the API running?)"
            )
        except requests.Timeout as exc:
            fail(f"the API did not answer in time: {one_line(exc)}")

    return wrapper  # type: ignore[return-value]
