"""Run docker/compose.yaml's header commands (the secrets, the broker's CA and certificate) in
a temporary directory, and start the broker they configure: redis-server with the
repository's docker/redis/redis.conf, TLS only, its ACL file rendered by render-users-acl from
the generated control password. Only the paths and the port differ from the container.

Invariants: the header is run as written by `sh` (only `docker compose up` is left out: no
container engine here); a container path (/run/secrets/<name>) is mapped to the host file
compose would mount there, through the service's secrets and the top-level `secrets:` table.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from tests.conftest import ROOT

COMPOSE = ROOT / "docker" / "compose.yaml"
REDIS_DIR = ROOT / "docker" / "redis"
COMPOSE_UP = "docker compose up -d"
SECRETS_DIR = "/run/secrets/"


def header_commands(text: str | None = None) -> list[str]:
    """The header's commands (`#   ...` lines; continuation lines joined, shell comments
    left out), in order."""
    text = COMPOSE.read_text() if text is None else text
    commands: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("#   "):
            continue
        body = line[4:]
        if not pending and body.lstrip().startswith("#"):
            continue  # a shell comment between commands
        pending = f"{pending}\n{body}" if pending else body
        if not body.endswith("\\"):
            commands.append(pending)
            pending = ""
    return commands


def run_script(script: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["sh", "-euc", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, f"{script[:200]!r} failed: {done.stderr[-2000:]}"
    return done.stdout


def generate(where: Path, broker_host: str) -> Path:
    """Run the header (but `docker compose up`) from `where`; return where/docker/secrets."""
    commands = header_commands()
    assert commands[-1] == COMPOSE_UP, commands[-1]
    (where / "docker").mkdir(exist_ok=True)
    script = "\n".join(commands[:-1]).replace(
        "MURMUR_BROKER_HOST=broker.example.org", f"MURMUR_BROKER_HOST={broker_host}"
    )
    run_script(script, where)
    return where / "docker" / "secrets"


def host_path(doc: dict[str, Any], service: str, container_path: str, docker_dir: Path) -> Path:
    """The host file compose mounts at `container_path` (/run/secrets/...) in `service`."""
    for entry in doc["services"][service].get("secrets") or []:
        source = entry if isinstance(entry, str) else entry["source"]
        target = entry if isinstance(entry, str) else entry.get("target", source)
        if SECRETS_DIR + target == container_path:
            return docker_dir / doc["secrets"][source]["file"]
    raise KeyError(f"{service} mounts no secret at {container_path}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback(url: str, port: int) -> str:
    """compose's `redis:6380` in a broker URL, as this host reaches the test's broker."""
    assert "@redis:6380/" in url, "the control plane's URL names the compose service redis:6380"
    return url.replace("@redis:6380/", f"@localhost:{port}/")


@contextmanager
def running_broker(secrets: Path, workdir: Path) -> Iterator[int]:
    """redis-server with docker/redis/redis.conf and the generated certificate, key, CA and
    ACL file (rendered as compose's redis command does); yields its TLS port."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed"
    acl = subprocess.run(
        [REDIS_DIR / "render-users-acl", secrets / "redis_control_password"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    (workdir / "redis-users.acl").write_text(acl)
    port = free_port()
    proc = subprocess.Popen(
        [binary, REDIS_DIR / "redis.conf", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", secrets / "redis-tls.crt", "--tls-key-file", secrets / "redis-tls.key",
         "--tls-ca-cert-file", secrets / "redis-ca.crt", "--aclfile", workdir / "redis-users.acl",
         "--dir", workdir, "--appendonly", "no", "--save", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    password = (secrets / "redis_control_password").read_text().strip()
    client = redis.Redis(
        host="localhost", port=port, ssl=True, ssl_ca_certs=str(secrets / "redis-ca.crt"),
        username="murmur-control", password=password, socket_timeout=5,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"redis-server exited: {out[-2000:]}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
