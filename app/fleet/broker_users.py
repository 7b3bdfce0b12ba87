"""Each worker's own Redis ACL user: created before its server, deleted when it is retired,
re-created whenever the broker lost it.

A worker's user may consume its profile's queue, keep that queue's in-flight messages under
the queue's own `unacked*` keys (gpu_worker/protocol/broker.py) and publish Celery events —
never the control queue, another profile's queue or in-flight messages, remote control
(`celery.pidbox`: workers and the control worker run without it), the control plane's own keys
or other workers' snapshots (see docs/deploy-workers.md, "Broker TLS and users").
Its password is derived, never drawn nor stored: HMAC-SHA256 of the signing key under the
label "broker" of "<db>:<worker id>" (app/credentials.py, `broker_password`). It travels only
in that worker's user data and in the `ACL SETUSER` command; no log line, metric or error
message carries it. ACL users are server-wide, so names carry the broker's database number
(`murmur-worker-db<N>-<worker id>`): deployments on other databases of the same Redis server
never touch each other's users.

Invariants:
- a user named `user_name(<worker id>, db)` exists only while its worker row is not deleted;
  `sweep` (every reconcile) removes any other user with this database's prefix;
- ACL users live only in the Redis server's memory: a broker restart (crash included) or a
  Sentinel failover (the replica never had them) loses them all. Every reconcile therefore
  re-creates, with the same name, password and rules, the user of each live worker (a state
  of LIVE_WORKER_STATES, not deleted) of a profile that uses one and has none, and logs each
  at WARNING. A worker whose connection dropped reconnects with the URL it already holds and
  consumes again from the next reconcile on. A re-created user whose row was deleted
  meanwhile is deleted again before the sweep returns;
- the password follows the signing key: after a key rotation a re-created user has a
  password the running workers do not know. That rotation revokes every running worker's
  instance credential anyway, and the fleet replaces them all (docs/operations.md,
  "Signing key"); their successors get passwords of the new key.

The control plane's own Redis user must be allowed `ACL SETUSER | DELUSER | USERS`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from sqlalchemy import select

from app.config import Profile, Settings
from app.credentials import broker_password
from app.fleet.providers.base import ProviderError
from app.models import LIVE_WORKER_STATES, Worker
from app.observability import record_broker_user_recreated
from app.services import Services
from gpu_worker.protocol.broker import unacked_keys

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
    # consuming a queue, acks_late bookkeeping and restoring the queue's unacked messages
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
    # events
    "publish",
)


def enabled(settings: Settings, profile: Profile) -> bool:
    """Whether workers of this profile get their own broker user.

    On by default for workers on another machine (their user data would otherwise carry the
    one shared broker password); off by default for the local provider, whose subprocesses
    share this machine and the demo's default Redis user.
    """
    configured = settings.fleet.worker_broker_users
    return profile.provider != "local" if configured is None else configured


def worker_acl_rules(queue: str, db: int) -> list[str]:
    """The ACL SETUSER rules (after on/password) of a worker consuming `queue` on `db`."""
    keys = [
        queue,
        f"{queue}{_PRIORITY_SEPARATOR}*",
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
        # This queue's in-flight messages (task name and job id, nothing secret) wait here
        # until acknowledged; only its own consumers read or restore them.
        *unacked_keys(queue).values(),
        # kombu >= 5.7 keeps deadlines of expiring bindings and sweeps overdue tables of the
        # events fanout exchange.
        "_kombu.binding_deadlines",
        "_kombu.binding.celeryev",
        "_kombu.binding_permanent.celeryev",
    ]
    channels = [f"/{db}.celeryev/*"]  # events only: publishing on celery.pidbox is refused
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


def user_prefix(db: int) -> str:
    """The names of this database's worker users start with it (ACL users are server-wide)."""
    return f"{USER_PREFIX}db{db}-"


def user_name(worker_id: str, db: int) -> str:
    return f"{user_prefix(db)}{worker_id}"


def broker_db(url: str) -> int:
    """The database number of a redis:// or rediss:// URL (kombu names channels after it)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def _acl(client: redis.Redis, *args: str) -> Any:
    return client.execute_command("ACL", *args)  # type: ignore[no-untyped-call]


def create_user(
    client: redis.Redis, base_url: str, queue: str, worker_id: str, signing_key: str
) -> BrokerUser:
    """Create (or reset) the worker's user, with the password derived from `signing_key`.

    The same arguments always give the same user: re-creating it lets the worker's URL in."""
    db = broker_db(base_url)
    user = BrokerUser(user_name(worker_id, db), broker_password(signing_key, db, worker_id))
    # `reset` first: a user left by an earlier attempt keeps no old password or rule.
    _acl(
        client,
        "SETUSER",
        user.name,
        "reset",
        "on",
        f">{user.password}",
        *worker_acl_rules(queue, db),
    )
    return user


def delete_user(client: redis.Redis, base_url: str, worker_id: str) -> None:
    """Remove the worker's user; Redis also closes every connection it authenticated."""
    _acl(client, "DELUSER", user_name(worker_id, broker_db(base_url)))


def list_users(client: redis.Redis, base_url: str) -> list[str]:
    """The worker ids that have a user on this broker database."""
    prefix = user_prefix(broker_db(base_url))
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _acl(client, "USERS")]
    return [n[len(prefix) :] for n in names if n.startswith(prefix)]


def sweep(
    client: redis.Redis, base_url: str, users: Iterable[str], keep: Iterable[str]
) -> list[str]:
    """Delete the users of `users` (worker ids) not in `keep`; the ids deleted.

    `users` must be read before `keep`: a worker provisioned in between has a row in `keep`
    or a user missing from `users`, never a listed user without its row (deleted as stale)."""
    wanted = set(keep)
    stale = [worker_id for worker_id in users if worker_id not in wanted]
    if stale:
        db = broker_db(base_url)
        _acl(client, "DELUSER", *(user_name(w, db) for w in stale))
        log.info("fleet: removed %d broker user(s) of retired workers", len(stale))
    return stale


class BrokerUserError(ProviderError):
    """The worker's broker user could not be created: no server is created without it."""


def in_use(settings: Settings) -> bool:
    return any(enabled(settings, p) for p in settings.profiles)


def provision_user(svc: Services, profile: Profile, worker_id: str) -> BrokerUser | None:
    """Create the worker's user when its profile uses one; None when it does not."""
    if not enabled(svc.settings, profile):
        return None
    key = svc.settings.reveal("signing_key")
    if not key:
        raise BrokerUserError("broker: no signing key to derive the worker's Redis password from")
    try:
        return create_user(svc.redis, _base_url(svc.settings), profile.queue, worker_id, key)
    except redis.RedisError as exc:
        # The reason names the failure, never the command (it carries the password).
        raise BrokerUserError(
            f"broker: cannot create the worker's Redis user ({type(exc).__name__}); "
            "the control plane's Redis user needs ACL rights (docs/deploy-workers.md)"
        ) from None


def worker_broker_url(settings: Settings, user: BrokerUser | None) -> str | None:
    return None if user is None else user.url(_base_url(settings))


def retire_user(svc: Services, worker_id: str) -> None:
    """Delete the worker's user (if any) now that its instance is gone or never came."""
    if not in_use(svc.settings):
        return
    try:
        delete_user(svc.redis, _base_url(svc.settings), worker_id)
    except redis.RedisError as exc:  # the sweep of the next reconcile tries again
        log.warning(
            "fleet: cannot delete worker %s's broker user: %s", worker_id, type(exc).__name__
        )


def sweep_users(svc: Services) -> list[str]:
    """Remove the users of workers that are deleted or unknown (crash, lost teardown), and
    re-create those of live workers the broker lost (`restore_users`); the ids removed."""
    if not in_use(svc.settings):
        return []
    base_url = _base_url(svc.settings)
    try:
        users = list_users(svc.redis, base_url)  # first: see `sweep`
        with svc.db.session() as s:
            rows = s.execute(
                select(Worker.id, Worker.profile, Worker.state).where(Worker.deleted_at.is_(None))
            ).all()
        removed = sweep(svc.redis, base_url, users, [row.id for row in rows])
        live = [(row.id, row.profile) for row in rows if row.state in LIVE_WORKER_STATES]
        restore_users(svc, base_url, users, live)
        return removed
    except redis.RedisError as exc:
        log.warning("fleet: cannot sweep broker users: %s", type(exc).__name__)
        return []


def restore_users(
    svc: Services, base_url: str, users: Iterable[str], live: Sequence[tuple[str, str]]
) -> list[str]:
    """Re-create the user of each live worker (id, profile name) missing from `users`.

    `users` was listed before the rows in `live` were read: a user created in between (a
    worker being provisioned) is reset to the same password and rules, which changes
    nothing. A worker retired in between has its row deleted before its user (app.fleet.
    apply), so the re-read below sees it and its user is deleted again. The ids re-created.
    """
    have = set(users)
    missing = [
        (worker_id, profile)
        for worker_id, name in live
        if worker_id not in have and (profile := _profile(svc.settings, name)) is not None
    ]
    if not missing:
        return []
    key = svc.settings.reveal("signing_key")
    if not key:
        log.warning("fleet: no signing key: cannot re-create %d broker user(s)", len(missing))
        return []
    for worker_id, profile in missing:
        create_user(svc.redis, base_url, profile.queue, worker_id, key)
        log.warning(
            "fleet: re-created worker %s's broker user (the broker had lost it: "
            "restart or failover)",
            worker_id,
        )
        record_broker_user_recreated(svc.redis, profile.name)  # murmur_broker_users_recreated
    restored = [worker_id for worker_id, _ in missing]
    with svc.db.session() as s:
        retired = set(
            s.scalars(
                select(Worker.id).where(Worker.id.in_(restored), Worker.deleted_at.is_not(None))
            )
        )
    if retired:
        _acl(svc.redis, "DELUSER", *(user_name(w, broker_db(base_url)) for w in retired))
    return [worker_id for worker_id in restored if worker_id not in retired]


def _profile(settings: Settings, name: str) -> Profile | None:
    """The worker's profile if it is configured and gives its workers a user of their own."""
    try:
        profile = settings.profile(name)
    except KeyError:
        return None
    return profile if enabled(settings, profile) else None


def _base_url(settings: Settings) -> str:
    return settings.worker_broker_url or settings.redis_url
