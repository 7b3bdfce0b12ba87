"""Redis Sentinel settings: the app's redis-py client, Celery's `sentinel://` broker and the
broker cloud-init gives GPU workers all follow the primary through a real failover
(tests/deploy/redis_ha.py: one primary, one replica, three Sentinels on loopback)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.celery_config import make_celery
from app.config import ConfigError, load_settings
from app.fleet.cloudinit import worker_environment
from app.redis_primary import broker_transport_options, broker_url, redis_client
from gpu_worker.celery_app import celery_config as worker_celery_config
from gpu_worker.runtime import RuntimeProfileError, load_runtime_profile
from tests.conftest import SIGNING_KEY, wait_for
from tests.deploy.redis_ha import MASTER_NAME, RedisHA, needs_redis_server, redis_ha, sentinel_env


@pytest.fixture()
def ha(tmp_path: Path) -> Iterator[RedisHA]:
    with redis_ha(tmp_path / "redis") as running:
        yield running


def _fail_over(ha: RedisHA) -> int:
    old = ha.primary_port()
    assert old == ha.ports["primary"]
    ha.kill("primary")
    wait_for(lambda: ha.primary_port() not in (None, old), 60, "a new primary")
    return int(ha.primary_port() or 0)


def _replicated(ha: RedisHA, db: int) -> None:
    """Block until the replica acknowledged every write the primary took so far (WAIT)."""
    primary = redis.Redis(port=ha.ports["primary"], db=db)
    try:
        primary.set("murmur:drill:fence", "1")
        acked = primary.wait(1, 30_000)
    finally:
        primary.close()
    assert acked >= 1, "the replica did not acknowledge the writes within 30 s"


def _retry(action: object, seconds: float = 20) -> object:
    """Call `action` until it stops raising a Redis/kombu connection error (bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return action()  # type: ignore[operator]
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@needs_redis_server
def test_the_app_client_and_the_celery_broker_follow_a_failover(ha: RedisHA) -> None:
    settings = load_settings(env=sentinel_env(ha, db=3))
    client = redis_client(settings)
    client.set("murmur:drill", "before")
    celery = make_celery(settings)
    celery.send_task("murmur.drill", args=["before"], queue="drill")
    # Replication is asynchronous: a primary killed now could take both writes with it.
    # Wait until the replica acknowledged a write made after them (the stream is ordered).
    _replicated(ha, db=3)

    new_primary = _fail_over(ha)
    assert new_primary == ha.ports["replica"]

    # The same client object reaches the promoted replica, database 3, with the data.
    assert _retry(lambda: client.get("murmur:drill")) == b"before"
    _retry(lambda: client.set("murmur:drill", "after"))
    direct = redis.Redis(port=new_primary, db=3)
    assert direct.get("murmur:drill") == b"after"
    # Celery's producer re-resolves the primary too.
    _retry(lambda: celery.send_task("murmur.drill", args=["after"], queue="drill"))
    assert direct.llen("drill") == 2


def test_sentinel_settings_give_kombus_url_and_options() -> None:
    env = {
        "MURMUR_REDIS_URL": "redis://:pa%2Fss@ignored:6379/2",
        "MURMUR_REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2:26379,10.0.0.3:26380",
        "MURMUR_REDIS_MASTER_NAME": "mymaster",
    }
    settings = load_settings(env=env)
    assert broker_url(settings) == (
        "sentinel://:pa%2Fss@10.0.0.1:26379/2;sentinel://:pa%2Fss@10.0.0.2:26379/2;"
        "sentinel://:pa%2Fss@10.0.0.3:26380/2"
    )
    assert broker_transport_options(settings) == {"master_name": "mymaster"}
    conf = make_celery(settings).conf
    assert conf.broker_transport_options["master_name"] == "mymaster"
    assert conf.broker_transport_options["visibility_timeout"] == 4 * 3600
    # Without Sentinels nothing changes.
    plain = load_settings(env={"MURMUR_REDIS_URL": "redis://10.0.0.9:6379/0"})
    assert broker_url(plain) == "redis://10.0.0.9:6379/0"
    assert broker_transport_options(plain) == {}


@pytest.mark.parametrize("entry", ["nohost", "10.0.0.1:", ":26379", "10.0.0.1:99999", "h:x"])
def test_a_bad_sentinel_address_is_refused_with_its_value(entry: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={"MURMUR_REDIS_SENTINELS": f"10.0.0.1:26379,{entry}"})
    assert any("redis.sentinels" in p and "is not host:port" in p for p in caught.value.problems)


def test_tls_with_sentinel_is_refused_not_silently_dropped() -> None:
    # Every client built from Sentinel's answer talks plain TCP: a rediss:// URL beside
    # sentinels would lose its TLS without a word, so the configuration is refused.
    sentinels = {"MURMUR_REDIS_SENTINELS": "10.0.0.1:26379"}
    with pytest.raises(ConfigError) as caught:
        load_settings(env={**sentinels, "MURMUR_REDIS_URL": "rediss://:pw@ignored:6380/0"})
    assert any(p.startswith("redis_url: TLS (rediss://) is not") for p in caught.value.problems)
    assert "pw" not in str(caught.value.problems)
    # A broker of the workers' own (worker_broker_url) is not reached through Sentinel.
    worker = {**sentinels, "MURMUR_WORKER_BROKER_URL": "rediss://w:pw@broker.example:6380/0"}
    assert load_settings(env=worker).worker_broker_url == worker["MURMUR_WORKER_BROKER_URL"]


def test_workers_are_told_the_sentinels_and_the_master_name() -> None:
    env = {
        "MURMUR_REDIS_URL": "redis://127.0.0.1:6379/0",
        "MURMUR_REDIS_SENTINELS": "127.0.0.1:26379,127.0.0.1:26380",
        "MURMUR_REDIS_MASTER_NAME": MASTER_NAME,
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
    }
    settings = load_settings(env=env)
    profile = settings.profiles[0]
    told = worker_environment(settings, profile, "w-1", "i-1")
    assert told["MURMUR_BROKER_URL"] == broker_url(settings)
    assert told["MURMUR_BROKER_MASTER_NAME"] == MASTER_NAME
    runtime = load_runtime_profile(
        {**told, "MURMUR_MODEL": "tiny.en"}, model_names=["tiny.en"], require_identity=True
    )
    assert runtime.identity is not None
    conf = worker_celery_config(
        runtime.identity.broker_url.get_secret_value(),
        profile.queue,
        runtime.identity.broker_master_name,
    )
    assert conf["broker_transport_options"]["master_name"] == MASTER_NAME
    # A worker broker URL of its own (TLS, its own user) wins over the Sentinels.
    own = load_settings(env={**env, "MURMUR_WORKER_BROKER_URL": "rediss://broker:6380/0"})
    told = worker_environment(own, profile, "w-1", "i-1")
    assert told["MURMUR_BROKER_URL"] == "rediss://broker:6380/0"
    assert "MURMUR_BROKER_MASTER_NAME" not in told


def test_a_sentinel_broker_without_a_master_name_is_refused_by_the_worker() -> None:
    env = {
        "MURMUR_REDIS_URL": "redis://127.0.0.1:6379/0",
        "MURMUR_REDIS_SENTINELS": "127.0.0.1:26379",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
    }
    settings = load_settings(env=env)
    told = worker_environment(settings, settings.profiles[0], "w-1", "i-1")
    del told["MURMUR_BROKER_MASTER_NAME"]
    with pytest.raises(RuntimeProfileError) as caught:
        load_runtime_profile(
            {**told, "MURMUR_MODEL": "tiny.en"}, model_names=["tiny.en"], require_identity=True
        )
    assert "MURMUR_BROKER_MASTER_NAME: not set; a sentinel:// broker needs it" in str(caught.value)
