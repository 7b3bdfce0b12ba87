"""docs/operations.md, run: every command of its `sh` blocks, in order, with its effect checked.

The guide is read into commands (continuation lines joined, shell comments dropped); the test
walks them with `step(pattern)`: the next command must match the pattern (so a command added
to the guide fails here until this test runs it and checks what it does), is run, and the
test asserts its effect. Everything runs on loopback: redis-server with the repository's
redis.conf (TLS, ACL) configured by the guide's own secret commands, a throw-away PostgreSQL
database, `murmur api` (gunicorn) from the virtualenv.

No container engine runs here. `docker compose exec|run SERVICE CMD` runs CMD on this host
with SERVICE's environment from docker/compose.yaml, its container paths mapped to the files
compose would mount (/run/secrets/<name>, the config file, the audio volume), the compose
names `redis`/`postgres` mapped to the loopback servers (and in the postgres service, the
user and database `murmur` to the test server's user and throw-away database); the other
`docker compose` commands are checked by parsing the file (the services exist, can be built
or scaled) and by starting, stopping or restarting the test's own API process.
`$MURMUR_URL` is the API on http://127.0.0.1:<port> (the TLS front is
tests/deploy/test_caddy.py's).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import requests
import yaml
from alembic import command
from celery import Celery
from sqlalchemy import select, text, update

from app.broker import redis_client
from app.config import Settings, load_settings
from app.credentials import InstanceCredential, sign_audio_url
from app.db import Database
from app.fleet import broker_users
from app.jobs.delivery import sign_webhook
from app.jobs.retention import sweep_expired_audio
from app.migrate import alembic_config, head_revision
from app.models import Job, ProfileState, Worker, WorkerState, utcnow
from app.services import utc_clock
from app.storage import LocalAudioStore
from tests.conftest import FIXTURES, ROOT, Proc, free_port, start_process, wait_for
from tests.deploy.compose_secrets import header_commands, host_path, running_broker

GUIDE = ROOT / "docs" / "operations.md"
COMPOSE = ROOT / "docker" / "compose.yaml"
AUDIO = FIXTURES / "speech-short.wav"
VENV_BIN = Path(sys.executable).parent
# What each image can run (the control image: Murmur, Celery, tar; redis; postgres).
IMAGE_COMMANDS = {
    "murmur-control": {"murmur", "celery", "tar"},
    "murmur-flower": {"murmur", "celery"},
    "redis": {"sh", "redis-cli"},
    "postgres": {"pg_dump", "pg_restore", "psql"},
}
# The services this test runs itself (the others are checked by parsing only).
RUN_HERE = {"redis", "postgres", "migrate", "api"}


def guide_sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading, commands) per `## ` section: each `sh` block's commands, in order."""
    sections: list[tuple[str, list[str]]] = []
    in_block = False
    pending = ""
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line[3:].strip(), []))
        elif line.strip() == "```sh":
            in_block = True
        elif line.strip() == "```" and in_block:
            in_block = False
            assert not pending, f"a command ends with a backslash: {pending!r}"
        elif in_block:
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending = f"{pending}\n{line}" if pending else line
            if not line.endswith("\\"):
                assert sections, "a command before the first section"
                sections[-1][1].append(pending)
                pending = ""
    return sections


def test_the_guide_is_read_as_expected() -> None:
    """The reader keeps every command and nothing else (a check of the check)."""
    sample = "# T\n## A\n```sh\n# note\nfoo \\\n  --bar   # x\n\nbaz\n```\n## B\n```toml\nx\n```\n"
    assert guide_sections(sample) == [("A", ["foo \\\n  --bar   # x", "baz"]), ("B", [])]
    commands = [c for _, cs in guide_sections(GUIDE.read_text()) for c in cs]
    in_text = GUIDE.read_text().count("\n```sh\n")
    assert in_text >= 10 and len(commands) > in_text


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        if env.get(name):
            return env[name]
        assert op != ":?", f"compose would refuse to start: {arg}"
        return arg if op == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


@dataclass
class Stack:
    """The host the guide's commands run on: its docker/ directory and loopback services."""

    root: Path
    db_server: str
    db_name: str
    doc: dict[str, Any] = field(default_factory=lambda: yaml.safe_load(COMPOSE.read_text()))
    env: dict[str, str] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)
    redis_port: int | None = None
    api: Proc | None = None
    api_port: int = field(default_factory=free_port)
    stopped: set[str] = field(default_factory=set)
    started: bool = False

    def __post_init__(self) -> None:
        self.docker.mkdir(parents=True)
        self.loopback.mkdir()
        # The guide runs in docker/ of a checkout: the parts of one it reads.
        shutil.copytree(ROOT / "config", self.root / "config")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MURMUR_", "SCW_", "CE_", "PG", "REDISCLI"))
        }

    @property
    def docker(self) -> Path:
        return self.root / "docker"

    @property
    def secrets(self) -> Path:
        return self.docker / "secrets"

    @property
    def loopback(self) -> Path:
        return self.root / "loopback"

    @property
    def config(self) -> Path:
        return self.root / "murmur.toml"

    @property
    def audio(self) -> Path:
        return self.root / "audio"

    @property
    def db_url(self) -> str:
        return f"{self.db_server.rsplit('/', 1)[0]}/{self.db_name}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    # -- what compose would mount -------------------------------------------------------

    def _secret_file(self, service: str, path: str) -> str:
        """A secret as the service sees it; the two URLs name compose hosts, so the test
        gives the loopback equivalent (same user and password for Redis)."""
        source = host_path(self.doc, service, path, self.docker)
        if source.name == "database_url":
            target = self.loopback / "database_url"
            target.write_text(self.db_url + "\n")
            return str(target)
        if source.name == "redis_url":
            url = source.read_text().strip()
            assert url.startswith("rediss://murmur-control:") and url.endswith("@redis:6380/0")
            target = self.loopback / "redis_url"
            target.write_text(url.replace("@redis:6380/", f"@localhost:{self.redis_port}/"))
            return str(target)
        return str(source)

    def _map_paths(self, service: str, text: str) -> str:
        for path in set(re.findall(r"/run/secrets/[\w.-]+", text)):
            text = text.replace(path, self._secret_file(service, path))
        text = text.replace("/etc/murmur/murmur.toml", str(self.config))
        return text.replace("/var/lib/murmur/audio", str(self.audio))

    def service_env(self, service: str) -> dict[str, str]:
        spec = self.doc["services"][service]
        env = {**self.env, "PATH": f"{VENV_BIN}:{self.env.get('PATH', '')}"}
        for key, value in (spec.get("environment") or {}).items():
            env[key] = self._map_paths(service, _interpolate(str(value), self.env))
        if service == "postgres":
            env.update(PGHOST="127.0.0.1", PGPORT=str(psycopg.conninfo.conninfo_to_dict(
                self.db_server).get("port") or 5432))  # fmt: skip
        if str(spec.get("image", "")).startswith("murmur-control"):
            # control.Dockerfile listens on 0.0.0.0:8000; here, loopback on a free port.
            env.update(MURMUR_HOST="127.0.0.1", MURMUR_PORT=str(self.api_port))
        return env

    def settings(self, service: str) -> Settings:
        return load_settings(env=self.service_env(service))

    # -- the processes compose would run ------------------------------------------------

    def start_broker(self) -> None:
        self.redis_port = self.stack.enter_context(running_broker(self.secrets, self.root))

    def start_api(self) -> None:
        spec = self.doc["services"]["api"]
        words = [str(w) for w in spec["command"]]
        assert words[:2] == ["murmur", "api"]
        words[words.index("--workers") + 1] = "1"  # two shared cores here
        env = self.service_env("api")
        self.api = start_process([str(VENV_BIN / words[0]), *words[1:]], env, self.root / "api.log")
        api = self.api

        def up() -> bool:
            if api.popen.poll() is not None:
                raise AssertionError(f"the API exited:\n{api.output()[-3000:]}")
            try:
                return requests.get(f"{self.url}/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 30, "the API to answer", step=0.1)

    def stop_api(self) -> None:
        if self.api is not None:
            self.api.stop()
            self.api = None

    def compose(self, cmd: str) -> subprocess.CompletedProcess[str] | None:
        """A `docker compose` command: run its in-container part, or check it by parsing."""
        words = shlex.split(cmd.split("<")[0].split(">")[0])
        assert words[:2] == ["docker", "compose"], cmd
        verb, args = words[2], words[3:]
        services = self.doc["services"]
        if verb in ("exec", "run"):
            return self._exec(verb, cmd)
        names = [a for i, a in enumerate(args) if not a.startswith("-")
                 and (i == 0 or args[i - 1] != "--scale")]  # fmt: skip
        for i, arg in enumerate(args):
            if arg == "--scale":  # SERVICE=N: a service that may run several times
                name, _, count = args[i + 1].partition("=")
                assert name in services and count.isdigit(), cmd
                assert "container_name" not in services[name] and not services[name].get("ports")
        for name in names:
            assert name in services, f"{cmd}: no service {name}"
        if verb == "build":
            for spec in services.values():
                if "build" in spec:
                    context = COMPOSE.parent / spec["build"]["context"]
                    assert (context / spec["build"]["dockerfile"]).is_file()
            return None
        if verb == "up":
            assert "-d" in args, "up runs detached"
            if not self.started:
                self.start_broker()
                self._migrate()
                self.start_api()
                self.started = True
            elif not names or "api" in names:
                self.stop_api()
                self._migrate()  # `up` runs migrate first: api depends on its completion
                self.start_api()
            self.stopped.clear()
            return None
        if verb in ("restart", "stop", "start"):
            assert names, f"{cmd}: name the services"
            if "api" in names and verb in ("restart", "stop"):
                self.stop_api()
            if "api" in names and verb in ("restart", "start"):
                self.start_api()
            if verb == "stop":
                self.stopped |= set(names)
            else:
                self.stopped -= set(names)
            return None
        raise AssertionError(f"no translation for {cmd}")

    def _migrate(self) -> None:
        words = [str(w) for w in self.doc["services"]["migrate"]["command"]]
        self.sh(shlex.join(words), self.service_env("migrate"))

    def _exec(self, verb: str, cmd: str) -> subprocess.CompletedProcess[str]:
        # `docker compose exec [-T] SERVICE CMD…` / `run --rm [--no-deps] [-T] SERVICE [CMD…]`
        m = re.match(r"docker compose (exec|run)((?: -{1,2}[\w-]+)*) ([\w-]+)(?: (.*))?$", cmd,
                     re.S)  # fmt: skip
        assert m, cmd
        service, rest = m.group(3), m.group(4) or ""
        spec = self.doc["services"][service]
        if verb == "exec":
            assert self.started and service not in self.stopped, f"{service} is not running"
        else:
            assert "--rm" in m.group(2), "run leaves no container behind"
        if not rest:
            rest = shlex.join(str(w) for w in spec["command"])
        image = str(spec["image"]).split(":")[0].split("/")[-1]
        first = shlex.split(rest.split("<")[0].split(">")[0])[0]
        assert first in IMAGE_COMMANDS[image], f"{service} ({image}) has no {first}"
        rest = self._map_paths(service, rest)
        if service == "redis":
            rest = rest.replace("-p 6380", f"-p {self.redis_port}")
        if service == "postgres":
            rest = rest.replace("-U murmur", "-U postgres").replace(
                "-d murmur", f"-d {self.db_name}"
            )
        return self.sh(rest, self.service_env(service))

    def sh(
        self, script: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=self.docker, capture_output=True,
            text=True, timeout=60, env=env or self.env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{script[:300]!r} exited {done.returncode}: {done.stderr[-3000:]}"
        )
        return done

    def run(self, cmd: str) -> subprocess.CompletedProcess[str] | None:
        if cmd == "cd docker":
            assert self.docker.is_dir()
            return None
        if cmd.startswith("export "):
            done = self.sh(f"{cmd}\nenv -0", self.env)
            exported = dict(line.split("=", 1) for line in done.stdout.split("\0") if "=" in line)
            self.env.update({k: v for k, v in exported.items() if k.startswith("MURMUR_")})
            # This host's stand-ins: the config file here, the API without the TLS front.
            self.env["MURMUR_CONFIG_FILE"] = str(self.config)
            if "MURMUR_URL" in self.env:
                self.env["MURMUR_URL"] = self.url
            return None
        if cmd.startswith("docker compose "):
            return self.compose(cmd)
        return self.sh(cmd)


class Walk:
    """The guide's commands, consumed in order by `step`."""

    def __init__(self, stack: Stack, sections: list[tuple[str, list[str]]] | None = None) -> None:
        self.stack = stack
        self.sections = guide_sections(GUIDE.read_text()) if sections is None else sections
        self.section = ""
        self.pending: list[str] = []

    def enter(self, heading: str) -> None:
        assert not self.pending, f"{self.section}: commands not run: {self.pending}"
        title, commands = self.sections.pop(0)
        assert title == heading, f"expected section {heading!r}, the guide has {title!r}"
        self.section, self.pending = title, list(commands)

    def step(self, pattern: str) -> subprocess.CompletedProcess[str] | None:
        assert self.pending, f"{self.section}: no command left for {pattern!r}"
        cmd = self.pending.pop(0)
        assert re.fullmatch(pattern, cmd, re.S), f"{self.section}: {cmd!r} !~ {pattern!r}"
        return self.stack.run(cmd)

    def out(self, pattern: str) -> str:
        done = self.step(pattern)
        assert done is not None
        return done.stdout

    def finish(self) -> None:
        assert not self.pending, f"{self.section}: commands not run: {self.pending}"
        assert not self.sections, f"sections not run: {[t for t, _ in self.sections]}"


def test_a_command_the_walk_does_not_expect_fails_it(tmp_path: Path) -> None:
    """A command added to, changed in or left out of the guide fails the walk."""
    host = Stack(tmp_path, "postgresql://postgres@127.0.0.1:5432/postgres", "unused")
    sections = [("A", ["echo one", "echo added"]), ("B", ["echo two"])]
    walk = Walk(host, [(t, list(c)) for t, c in sections])
    walk.enter("A")
    assert walk.out(r"echo one") == "one\n"
    with pytest.raises(AssertionError, match="commands not run"):
        walk.enter("B")  # "echo added" was never run
    walk = Walk(host, [(t, list(c)) for t, c in sections])
    walk.enter("A")
    walk.step(r"echo one")
    with pytest.raises(AssertionError, match="!~"):
        walk.step(r"echo two")  # the guide's next command is not the one expected
    walk = Walk(host, [("A", ["echo one"]), ("B", ["echo two"])])
    walk.enter("A")
    walk.step(r"echo one")
    with pytest.raises(AssertionError, match="sections not run"):
        walk.finish()


@pytest.fixture()
def stack(tmp_path: Path, postgres_server: str) -> Iterator[Stack]:
    name = f"murmur_ops_{os.getpid()}_{free_port()}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    host = Stack(tmp_path, postgres_server, name)
    try:
        yield host
    finally:
        host.stop_api()
        host.stack.close()
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _tokens(stack: Stack) -> list[str]:
    return (stack.secrets / "api_tokens").read_text().strip().split(",")


def _submit(stack: Stack, token: str) -> str:
    with AUDIO.open("rb") as f:
        r = requests.post(f"{stack.url}/v1/jobs", headers=_auth(token), files={"file": f},
                          timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _status(stack: Stack, path: str, token: str) -> int:
    return requests.get(f"{stack.url}{path}", headers=_auth(token), timeout=10).status_code


def _heartbeat(stack: Stack, key: str) -> int:
    cred = InstanceCredential.derive(key, "wrk_ops", "inst_ops")
    return requests.post(f"{stack.url}/internal/workers/wrk_ops/inst_ops/heartbeat",
                         headers=_auth(cred.token), timeout=10).status_code  # fmt: skip


def _control(stack: Stack, password: str) -> redis.Redis:
    return redis.Redis(
        host="localhost", port=stack.redis_port, ssl=True, socket_timeout=5,
        ssl_ca_certs=str(stack.secrets / "redis-ca.crt"), username="murmur-control",
        password=password,
    )  # fmt: skip


def _can_log_in(stack: Stack, password: str) -> bool:
    client = _control(stack, password)
    try:
        return bool(client.ping())
    except redis.AuthenticationError:
        return False
    finally:
        client.close()


def db_job(db: Database, job_id: str) -> Job:
    with db.reader() as ses:
        job = ses.get(Job, job_id)
        assert job is not None
        ses.expunge(job)
        return job


def _read(path: Path) -> str:
    return path.read_text().strip()


def test_every_command_of_the_operations_guide(stack: Stack) -> None:  # noqa: PLR0915
    walk = Walk(stack)
    s = stack.secrets

    # ---- Deploy with compose: the compose header's commands, then up ----------------------
    walk.enter("Deploy with compose")
    header = header_commands()
    assert header[-1] == "docker compose up -d"
    assert walk.pending[: len(header) - 1] == header[:-1], (
        "the guide's secrets differ from compose.yaml's"
    )
    for cmd in header[:-1]:
        walk.step(re.escape(cmd))
    assert s.stat().st_mode & 0o777 == 0o700
    for name, spec in stack.doc["secrets"].items():
        assert (stack.docker / spec["file"]).stat().st_size > 0, name
    assert stack.env["MURMUR_BROKER_HOST"] == "broker.example.org"

    assert not stack.config.exists()
    walk.step(r'cp \.\./config/murmur\.example\.toml "\$MURMUR_CONFIG_FILE"')
    assert stack.config.read_text() == (ROOT / "config" / "murmur.example.toml").read_text()
    assert "configuration OK: 2 profile(s): l4-par2, p100-par1" in walk.out(
        r"docker compose run --rm --no-deps control-worker murmur validate-config"
    )
    walk.step(r"docker compose up -d")
    assert stack.redis_port is not None and stack.api is not None
    walk.step(r"export MURMUR_URL=https://\$MURMUR_DOMAIN")
    assert (
        walk.out(r"printf .*\| curl -sK - -o /dev/null -w .* \"\$MURMUR_URL/v1/jobs\"") == "200\n"
    )
    first_token = _tokens(stack)[0]
    assert len(_tokens(stack)) == 1

    # ---- Profiles and provisioning ---------------------------------------------------------
    walk.enter("Configure profiles and enable provisioning")
    stack.env.update(NEW_SCW_ACCESS_KEY="SCWOPSGUIDE000000001", NEW_SCW_SECRET_KEY="1" * 36)
    walk.step(r"printf '%s\\n' \"\$NEW_SCW_ACCESS_KEY\" > secrets/scw_access_key")
    walk.step(r"printf '%s\\n' \"\$NEW_SCW_SECRET_KEY\" > secrets/scw_secret_key")
    assert "configuration OK" in walk.out(
        r"docker compose run --rm --no-deps control-worker murmur validate-config"
    )
    walk.step(r"docker compose restart control-worker beat api")
    control = stack.settings("control-worker")
    assert control.reveal("scaleway_access_key") == "SCWOPSGUIDE000000001"
    assert control.reveal("scaleway_secret_key") == "1" * 36
    # Only the control worker holds them.
    assert stack.settings("api").scaleway_access_key is None
    assert stack.settings("beat").scaleway_secret_key is None

    # ---- Rotate credentials ----------------------------------------------------------------
    walk.enter("Rotate credentials")
    old_job = _submit(stack, first_token)
    walk.step(r"cp secrets/api_tokens secrets/api_tokens\.old")
    walk.step(r"printf '%s,%s\\n' .* > secrets/api_tokens")
    new_token, kept = _tokens(stack)
    assert kept == first_token and new_token != first_token
    walk.step(r"docker compose restart api")
    assert walk.out(r"printf .*cut -d, -f1 secrets/api_tokens.*/v1/jobs\"") == "200\n"
    assert _status(stack, "/v1/jobs", first_token) == 200  # the overlap
    assert _status(stack, f"/v1/jobs/{old_job}", new_token) == 404  # jobs belong to their token
    walk.step(r"cut -d, -f1 secrets/api_tokens > secrets/api_tokens\.new && cat .*")
    walk.step(r"rm secrets/api_tokens\.new secrets/api_tokens\.old")
    assert _tokens(stack) == [new_token] and sorted(p.name for p in s.glob("api_tokens*")) == [
        "api_tokens"
    ]
    walk.step(r"docker compose restart api")
    assert _status(stack, "/v1/jobs", first_token) == 401
    assert _status(stack, "/v1/jobs", new_token) == 200
    assert _status(stack, f"/v1/jobs/{old_job}", new_token) == 404

    # Signing key: a worker's credential and an audio URL of the old key are refused.
    old_key = _read(s / "signing_key")
    assert _heartbeat(stack, old_key) == 403  # accepted credential, no such worker row
    audio_query = sign_audio_url(old_key, old_job, "wrk_ops", 1, 600)
    walk.step(r"openssl rand -hex 32 > secrets/signing_key")
    new_key = _read(s / "signing_key")
    assert new_key != old_key
    walk.step(r"docker compose restart api control-worker beat")
    assert _heartbeat(stack, old_key) == 401
    assert _heartbeat(stack, new_key) == 403
    r = requests.get(f"{stack.url}/internal/audio/{old_job}?{audio_query}", timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_signature"
    assert stack.settings("control-worker").reveal("signing_key") == new_key

    old_scrape = _read(s / "scrape_token")
    assert _status(stack, "/metrics", old_scrape) == 200
    walk.step(r"openssl rand -hex 32 > secrets/scrape_token")
    walk.step(r"docker compose restart api")
    assert walk.out(r"printf .*secrets/scrape_token.*/metrics\"") == "200\n"
    assert _status(stack, "/metrics", old_scrape) == 401

    old_admin = _read(s / "admin_token")
    walk.step(r"openssl rand -hex 32 > secrets/admin_token")
    walk.step(r"docker compose restart api")
    assert _status(stack, "/v1/fleet", old_admin) == 401
    assert _status(stack, "/v1/fleet", _read(s / "admin_token")) == 200

    old_webhook = _read(s / "webhook_secret")
    walk.step(r"openssl rand -hex 32 > secrets/webhook_secret")
    walk.step(r"docker compose restart io-worker api")
    secret = stack.settings("io-worker").reveal("webhook_secret")
    assert secret == _read(s / "webhook_secret") != old_webhook
    assert sign_webhook(secret, 1, b"{}") != sign_webhook(old_webhook, 1, b"{}")

    walk.step(r"docker compose restart control-worker")  # Scaleway keys (written above)
    assert stack.settings("control-worker").reveal("scaleway_access_key") == "SCWOPSGUIDE000000001"

    # Redis: the control password, with an overlap.
    old_password = _read(s / "redis_control_password")
    walk.step(r"cp secrets/redis_control_password secrets/redis_control_password\.old")
    walk.step(r"openssl rand -hex 32 > secrets/redis_control_password\.new")
    new_password = _read(s / "redis_control_password.new")
    assert not _can_log_in(stack, new_password)
    assert (
        walk.out(
            r"docker compose exec -T redis sh -c .*ACL SETUSER murmur-control \"#.*"
            r"< secrets/redis_control_password\.new"
        )
        == "OK\n"
    )
    assert _can_log_in(stack, old_password) and _can_log_in(stack, new_password)
    walk.step(r"cat secrets/redis_control_password\.new > secrets/redis_control_password")
    walk.step(r"echo .* > secrets/redis_url")
    walk.step(r"echo .* > secrets/celery_exporter\.env")
    assert new_password in _read(s / "redis_url") and new_password in _read(
        s / "celery_exporter.env"
    )
    walk.step(r"docker compose restart api control-worker io-worker beat flower")
    assert _status(stack, "/v1/jobs", new_token) == 200
    for service in ("api", "control-worker", "io-worker", "beat", "flower"):
        client = redis_client(stack.settings(service), socket_timeout=5)
        assert client.ping()
        client.close()
    walk.step(r"docker compose up -d --force-recreate celery-exporter")
    exporter = stack.doc["services"]["celery-exporter"]
    url = _read(stack.docker / exporter["env_file"][0]).split("=", 1)[1]
    probe = Celery(broker=url.replace("@redis:6380/", f"@localhost:{stack.redis_port}/"))
    probe.conf.broker_use_ssl = {
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": str(s / "redis-ca.crt"),
    }
    with probe.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
    probe.close()
    assert (
        walk.out(
            r"docker compose exec -T redis sh -c .*ACL SETUSER murmur-control \"!.*"
            r"< secrets/redis_control_password\.old"
        )
        == "OK\n"
    )
    assert not _can_log_in(stack, old_password) and _can_log_in(stack, new_password)
    walk.step(r"rm secrets/redis_control_password\.old secrets/redis_control_password\.new")
    render = ROOT / "docker" / "redis" / "render-users-acl"
    acl = subprocess.run(
        [render, s / "redis_control_password"], capture_output=True, text=True, check=True
    ).stdout
    assert acl.count("#") == 1 and _read(s / "redis_control_password") not in acl

    # Redis: a worker's user, listed and cut off.
    admin = _control(stack, new_password)
    control_url = f"rediss://localhost:{stack.redis_port}/0"
    user = broker_users.create_user(
        admin, control_url, "transcribe.l4-par2", "wrk_leaked", _read(s / "signing_key")
    )
    assert user.name == "murmur-worker-db0-wrk_leaked"
    assert (
        "murmur-worker-db0-wrk_leaked"
        in walk.out(r"docker compose exec -T redis sh -c .*ACL USERS'").split()
    )
    assert (
        walk.out(r"docker compose exec -T redis sh -c .*ACL DELUSER murmur-worker-db0-wrk_leaked'")
        == "1\n"
    )
    users = admin.acl_users()
    assert user.name not in {u.decode() if isinstance(u, bytes) else u for u in users}  # type: ignore[union-attr]
    admin.close()

    # ---- Back up and restore; retention ------------------------------------------------------
    walk.enter("Back up and restore; retention")
    job = _submit(stack, new_token)
    db = Database(stack.db_url)
    with db.reader() as ses:
        key = ses.execute(select(Job.audio_key).where(Job.id == job)).scalar_one()
    assert key is not None
    audio = stack.audio / key
    original = audio.read_bytes()
    walk.step(r"mkdir -p -m 700 backup   # .*")
    assert (stack.docker / "backup").stat().st_mode & 0o777 == 0o700
    walk.step(
        r"docker compose exec -T postgres pg_dump -U murmur -d murmur -Fc > backup/murmur\.dump"
    )
    walk.step(
        r"docker compose exec -T api tar -C /var/lib/murmur/audio -cf - \. > backup/audio\.tar"
    )
    assert (stack.docker / "backup" / "murmur.dump").stat().st_size > 0
    # The loss: every job row and every audio file.
    with db.session() as ses:
        ses.execute(text("DELETE FROM jobs"))
    for path in stack.audio.rglob("*"):
        if path.is_file():
            path.unlink()
    assert _status(stack, f"/v1/jobs/{job}", new_token) == 404
    walk.step(r"docker compose stop api control-worker beat")
    assert stack.api is None
    walk.step(
        r"docker compose exec -T postgres pg_restore -U murmur -d murmur --clean --if-exists "
        r"< backup/murmur\.dump"
    )
    walk.step(
        r"docker compose run --rm --no-deps -T api tar -C /var/lib/murmur/audio -xf - "
        r"< backup/audio\.tar"
    )
    walk.step(r"docker compose start api control-worker beat")
    r = requests.get(f"{stack.url}/v1/jobs/{job}", headers=_auth(new_token), timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    assert audio.read_bytes() == original
    assert audio.stat().st_mode & 0o777 == 0o600

    # Retention: an hour, applied by the control worker's sweep.
    with db.session() as ses:
        ses.execute(update(Job).where(Job.id == job).values(
            status="succeeded", finished_at=utcnow() - timedelta(hours=2)))  # fmt: skip
    walk.step(
        r"sed -i 's/\^audio_seconds = \.\*/audio_seconds = 3600\.0/' \"\$MURMUR_CONFIG_FILE\""
    )
    assert "configuration OK" in walk.out(
        r"docker compose run --rm --no-deps control-worker murmur validate-config"
    )
    walk.step(r"docker compose restart control-worker beat api")
    control = stack.settings("control-worker")
    assert control.retention.audio_seconds == 3600
    assert sweep_expired_audio(db, LocalAudioStore(control.storage_path), control, utc_clock()) == 1
    assert not audio.exists()

    # ---- Upgrade while jobs run --------------------------------------------------------------
    walk.enter("Upgrade, with migrations, while jobs run")
    # A job running on a worker through the real calls: a ready l4-par2 worker (as the fleet
    # records one) gets the upload at once (a Celery message over TLS), claims it and fetches
    # its audio with the signed URL; its result arrives after the upgrade. Then the database goes
    # back to the older release's schema, the job's row with it, as it was before the upgrade.
    worker = Worker(profile="l4-par2", provider="scaleway", instance_id="inst-upgrade",
                    state=WorkerState.READY.value, requested_at=utcnow(), created_at=utcnow(),
                    ready_at=utcnow(), last_seen_at=utcnow())  # fmt: skip
    with db.session() as ses:
        ses.add(worker)
    running = _submit(stack, new_token)
    assert db_job(db, running).status == "dispatched"
    cred = InstanceCredential.derive(_read(s / "signing_key"), worker.id, "inst-upgrade")
    calls = f"{stack.url}/internal/workers/{worker.id}/inst-upgrade/jobs/{running}"
    r = requests.post(f"{calls}/claim", headers=_auth(cred.token), timeout=10)
    assert r.status_code == 200, r.text
    audio_url = r.json()["job"]["audio_url"].replace(
        stack.settings("api").api.public_url, stack.url
    )
    assert requests.get(audio_url, timeout=10).content == AUDIO.read_bytes()
    command.downgrade(alembic_config(stack.db_url), "0004_failure_counts")  # the older release
    with db.reader() as ses:  # the older schema: read with SQL, not the current model
        status = ses.execute(text("SELECT status FROM jobs WHERE id = :id"), {"id": running})
        assert status.scalar_one() == "running"
    walk.step(r"docker compose build")
    walk.step(r"docker compose run --rm migrate")
    with db.reader() as ses:
        version = ses.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    assert version == head_revision()
    assert db_job(db, running).status == "running"
    assert _status(stack, f"/v1/jobs/{running}", new_token) == 200  # served during the upgrade
    walk.step(r"docker compose up -d")
    result = {"transcript": {"text": "hello", "segments": [{"start": 0, "end": 1,
              "text": "hello"}]}, "processing_seconds": 1.0}  # fmt: skip
    r = requests.post(f"{calls}/result", headers=_auth(cred.token), json=result, timeout=10)
    assert r.status_code == 200 and r.json() == {"stored": True}, r.text
    r = requests.get(f"{stack.url}/v1/jobs/{running}", headers=_auth(new_token), timeout=10)
    assert r.json()["status"] == "succeeded"

    # ---- Scale out -----------------------------------------------------------------------------
    walk.enter("Scale out, and lose a host")
    walk.step(
        r"sed -i 's/\^max_hourly_eur = \.\*/max_hourly_eur = 20\.0/' \"\$MURMUR_CONFIG_FILE\""
    )
    assert "configuration OK" in walk.out(
        r"docker compose run --rm --no-deps control-worker murmur validate-config"
    )
    walk.step(r"docker compose restart control-worker beat api")
    assert stack.settings("control-worker").budget.max_hourly_eur == 20.0
    walk.step(r"docker compose up -d --scale control-worker=2")
    worker = stack.doc["services"]["control-worker"]
    assert "container_name" not in worker and not worker.get("ports")
    assert "beat" not in " ".join(str(w) for w in worker["command"])

    # ---- Every profile out of stock ----------------------------------------------------------
    walk.enter("Every profile out of stock")
    until = utcnow() + timedelta(minutes=10)
    with db.session() as ses:
        for name in ("l4-par2", "p100-par1"):
            ses.add(ProfileState(name=name, backoff_until=until, consecutive_stockouts=2,
                                 last_error="out of stock"))  # fmt: skip
    fleet = walk.out(r"docker compose exec control-worker murmur fleet")
    lines = {line.split()[0]: line for line in fleet.splitlines() if line.strip()}
    for name in ("l4-par2", "p100-par1"):
        assert (
            until.strftime("%Y-%m-%d") in lines[name] or until.strftime("%H:%M") in lines[name]
        ), fleet
    # The job submitted before the token rotation, which no worker ran.
    assert "waiting jobs: 1 " in fleet, fleet
    held = walk.out(r"printf .*secrets/scrape_token.*/metrics\" \| grep .*")
    for name in ("l4-par2", "p100-par1"):
        assert f'murmur_fleet_profile_held{{profile="{name}",reason="backoff"}} 1.0' in held, held
    db.dispose()
    walk.finish()
