"""Redis high availability on loopback for tests: one primary, one replica, three Sentinels
(Debian's redis-server, `--sentinel`), on free ports in a temporary directory."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port, wait_for

MASTER_NAME = "murmur"

needs_redis_server = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server is not installed (Debian: apt-get install redis-server)",
)


@dataclass
class RedisHA:
    directory: Path
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def sentinels(self) -> list[str]:
        return [f"127.0.0.1:{self.ports[f'sentinel{i}']}" for i in range(3)]

    def primary_port(self) -> int | None:
        """The primary the Sentinels agree on now (None while they do not answer)."""
        answers = set()
        for entry in self.sentinels:
            port = int(entry.rsplit(":", 1)[1])
            try:
                client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
                addr = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                continue
            if addr:
                answers.add(int(addr[1]))
        return answers.pop() if len(answers) == 1 else None

    def kill(self, name: str) -> None:
        """SIGKILL: the host is lost, nothing is flushed or handed over."""
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)

    def name_of(self, port: int) -> str:
        return next(name for name, p in self.ports.items() if p == port)

    def start(self, name: str, args: list[str]) -> None:
        log = (self.directory / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            ["redis-server", *args], stdout=log, stderr=subprocess.STDOUT, cwd=self.directory
        )


def _server_args(port: int, directory: Path) -> list[str]:
    return [
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(directory),
        "--maxmemory-policy",
        "noeviction",
    ]


@contextmanager
def redis_ha(directory: Path, *, down_after_ms: int = 1000) -> Iterator[RedisHA]:
    directory.mkdir(parents=True, exist_ok=True)
    names = ["primary", "replica", "sentinel0", "sentinel1", "sentinel2"]
    ha = RedisHA(directory, {name: free_port() for name in names})
    try:
        primary, replica = ha.ports["primary"], ha.ports["replica"]
        (directory / "primary").mkdir(exist_ok=True)
        (directory / "replica").mkdir(exist_ok=True)
        ha.start("primary", _server_args(primary, directory / "primary"))
        ha.start(
            "replica",
            [
                *_server_args(replica, directory / "replica"),
                "--replicaof",
                "127.0.0.1",
                str(primary),
            ],
        )
        for i in range(3):
            conf = directory / f"sentinel{i}.conf"
            conf.write_text(
                f"port {ha.ports[f'sentinel{i}']}\n"
                "bind 127.0.0.1\n"
                f"dir {directory}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            ha.start(f"sentinel{i}", [str(conf), "--sentinel"])

        def replicating() -> bool:
            try:
                info = redis.Redis(port=replica, socket_timeout=1).info("replication")
            except redis.RedisError:
                return False
            return info.get("master_link_status") == "up"

        def sentinels_see_replica() -> bool:
            try:
                for entry in ha.sentinels:
                    port = int(entry.rsplit(":", 1)[1])
                    client = redis.Redis(port=port, socket_timeout=1)
                    if not client.sentinel_slaves(MASTER_NAME):
                        return False
                    if len(client.sentinel_sentinels(MASTER_NAME)) < 2:
                        return False
            except redis.RedisError:
                return False
            return ha.primary_port() == primary

        wait_for(replicating, 30, "the replica to sync", step=0.2)
        wait_for(sentinels_see_replica, 60, "the Sentinels to know each other", step=0.3)
        yield ha
    finally:
        for proc in ha.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in ha.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def sentinel_env(ha: RedisHA, db: int = 0) -> dict[str, str]:
    """The settings every Murmur process gets to find the primary through the Sentinels."""
    return {
        # Only the database number counts with Sentinels; the host is the primary of the day.
        "MURMUR_REDIS_URL": f"redis://127.0.0.1:{ha.ports['primary']}/{db}",
        "MURMUR_REDIS_SENTINELS": ",".join(ha.sentinels),
        "MURMUR_REDIS_MASTER_NAME": MASTER_NAME,
    }
