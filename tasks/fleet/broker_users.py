"""Each worker's own Redis ACL user: created before its server, deleted when it is retired.

A worker's user may consume its profile's queue and touch only the few shared keys kombu's
Redis transport needs for acks_late delivery (`unacked*`), remote control (`celery.pidbox`)
and events (the `celeryev` channels) — never the control queue, another profile's queue, the
control plane's own keys or other workers' snapshots (see docs/deploy-workers.md, "Broker
TLS and users").
Its password is random, is never stored by the control plane, and travels only in that
worker's user data. Invariant: a user named `USER_PREFIX + <worker id>` exists only while its
worker row is not deleted; `sweep` (every reconcile) removes any other user with the prefix.
The control plane's own Redis user must be allowed `ACL SETUSER | DELUSER | USERS`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from sqlalchemy import select

from app.config import Profile, Settings
from app.models import Worker
from tasks.fleet.services import FleetServices
from tasks.providers.base import ProviderError

log = logging.getLogger("murmur.fleet")

USER_PREFIX = "murmur-worker-"

# kombu puts a message of priority > 0 on `<queue>\x06\x16<step>` (its priority separator).
_PRIORITY_SEPARATOR = "\x06\x16"

# What a Celery 5 worker with kombu's Redis transport sends, as found by running one under
# this user and reading `ACL LOG` (tests/fleet/test_broker_users.py keeps it so).
WORKER_COMMANDS = (
    # connection set-up and health checks
    "ping",
    "select",
    "info",
    "client|setname",
    # consuming a queue, acks_late bookkeeping and restoring unacked messages
    "brpop",
    "lpush",
    "rpush",
    "llen",
    "hset",
    "hget",
    "hdel",
    "zadd",
    "zrem",
    "zrevrangebyscore",
    "zrange",
    "set",
    "get",
    "del",
    "multi",
    "exec",
    "watch",
    "unwatch",
    # redis-py's lock (kombu's restore mutex) releases through a Lua script
    "evalsha",
    "script|load",
    "script|exists",
    # kombu's binding-expiry scripts
    "time",
    "zrangebyscore",
    "exists",
    # queue bindings
    "sadd",
    "smembers",
    "srem",
    # events and remote control
    "publish",
    "subscribe",
    "psubscribe",
    "unsubscribe",
    "punsubscribe",
)


def enabled(settings: Settings, profile: Profile) -> bool:
    """Whether workers of this profile get their own broker user.

    On by default for workers on another machine (their user data would otherwise carry the
    one shared broker password); off by default for the local provider, whose subprocesses
    share this machine and the demo's default Redis user.
    """
    configured = settings.fleet.worker_broker_users
    return profile.provider != "local" if configured is None else configured


def worker_acl_rules(queue: str, db: int, worker_id: str) -> list[str]:
    """The ACL SETUSER rules (after on/password) of a worker consuming `queue` on `db`.

    The worker's Celery hostname is `<worker id>@<instance id>` (gpu_worker/service.py), which
    names its own remote-control queue `<hostname>.celery.pidbox`.
    """
    keys = [
        queue,
        f"{queue}{_PRIORITY_SEPARATOR}*",
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
        # Shared by every consumer of this broker: in-flight messages (task name and job id,
        # nothing secret) wait here until acknowledged.
        "unacked",
        "unacked_index",
        "unacked_mutex",
        # Remote control (`celery inspect`, Flower): the broadcast binding and the replies.
        "_kombu.binding.celery.pidbox",
        "_kombu.binding.reply.celery.pidbox",
        "_kombu.binding_permanent.celery.pidbox",
        "_kombu.binding_permanent.reply.celery.pidbox",
        "*.reply.celery.pidbox",
        # kombu >= 5.7 keeps deadlines of expiring bindings (pidbox, events) and sweeps
        # overdue tables of those fanout exchanges.
        "_kombu.binding_deadlines",
        "_kombu.binding.celeryev",
        "_kombu.binding_permanent.celeryev",
        f"{worker_id}@*.celery.pidbox",
        f"{worker_id}@*.celery.pidbox{_PRIORITY_SEPARATOR}*",
    ]
    # PSUBSCRIBE is allowed only for a pattern written exactly as in the rules.
    channels = [f"/{db}.celeryev/*", f"/{db}.celery.pidbox", f"/{db}.celery.pidbox/*"]
    return [
        "resetkeys",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in WORKER_COMMANDS),
        *(f"~{key}" for key in keys),
        *(f"&{channel}" for channel in channels),
    ]


@dataclass(frozen=True)
class BrokerUser:
    """A worker's broker user; `password` is only ever written into that worker's user data."""

    name: str
    password: str

    def url(self, base_url: str) -> str:
        """`base_url` (scheme, host, port, db, options) with this user's name and password."""
        parts = urlsplit(base_url)
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        netloc = f"{quote(self.name, safe='')}:{quote(self.password, safe='')}@{host}{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def __repr__(self) -> str:  # never print the password
        return f"BrokerUser(name={self.name!r})"


def user_name(worker_id: str) -> str:
    return f"{USER_PREFIX}{worker_id}"


def broker_db(url: str) -> int:
    """The database number of a redis:// or rediss:// URL (kombu names channels after it)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def _acl(client: redis.Redis, *args: str) -> Any:
    return client.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


def create_user(client: redis.Redis, base_url: str, queue: str, worker_id: str) -> BrokerUser:
    """Create (or reset) the worker's user with a fresh random password."""
    user = BrokerUser(user_name(worker_id), secrets.token_hex(32))
    # `reset` first: a user left by an earlier attempt keeps no old password or rule.
    _acl(
        client,
        "SETUSER",
        user.name,
        "reset",
        "on",
        f">{user.password}",
        *worker_acl_rules(queue, broker_db(base_url), worker_id),
    )
    return user


def delete_user(client: redis.Redis, worker_id: str) -> None:
    """Remove the worker's user; Redis also closes every connection it authenticated."""
    _acl(client, "DELUSER", user_name(worker_id))


def sweep(client: redis.Redis, keep: Iterable[str]) -> list[str]:
    """Delete every worker user whose worker id is not in `keep`; the ids deleted."""
    wanted = set(keep)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _acl(client, "USERS")]
    stale = [n[len(USER_PREFIX) :] for n in names if n.startswith(USER_PREFIX)]
    stale = [worker_id for worker_id in stale if worker_id not in wanted]
    if stale:
        _acl(client, "DELUSER", *(user_name(w) for w in stale))
        log.info("fleet: removed %d broker user(s) of retired workers", len(stale))
    return stale


class BrokerUserError(ProviderError):
    """The worker's broker user could not be created: no server is created without it."""


def in_use(settings: Settings) -> bool:
    return any(enabled(settings, p) for p in settings.profiles)


def provision_user(svc: FleetServices, profile: Profile, worker_id: str) -> BrokerUser | None:
    """Create the worker's user when its profile uses one; None when it does not."""
    if not enabled(svc.settings, profile):
        return None
    try:
        return create_user(svc.redis, _base_url(svc.settings), profile.queue, worker_id)
    except redis.RedisError as exc:
        # The reason names the failure, never the command (it carries the password).
        raise BrokerUserError(
            f"broker: cannot create the worker's Redis user ({type(exc).__name__}); "
            "the control plane's Redis user needs ACL rights (docs/deploy-workers.md)"
        ) from None


def worker_broker_url(settings: Settings, user: BrokerUser | None) -> str | None:
    return None if user is None else user.url(_base_url(settings))


def retire_user(svc: FleetServices, worker_id: str) -> None:
    """Delete the worker's user (if any) now that its instance is gone or never came."""
    if not in_use(svc.settings):
        return
    try:
        delete_user(svc.redis, worker_id)
    except redis.RedisError as exc:  # the sweep of the next reconcile tries again
        log.warning(
            "fleet: cannot delete worker %s's broker user: %s", worker_id, type(exc).__name__
        )


def sweep_users(svc: FleetServices) -> list[str]:
    """Remove the users of workers that are deleted or unknown (crash, lost teardown)."""
    if not in_use(svc.settings):
        return []
    with svc.db.session() as s:
        keep = list(s.scalars(select(Worker.id).where(Worker.deleted_at.is_(None))))
    try:
        return sweep(svc.redis, keep)
    except redis.RedisError as exc:
        log.warning("fleet: cannot sweep broker users: %s", type(exc).__name__)
        return []


def _base_url(settings: Settings) -> str:
    return settings.worker_broker_url or settings.redis_url
