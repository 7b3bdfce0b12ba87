"""docker/compose.yaml, checked by parsing (no container engine here): pinned images, no
inline secret, a healthcheck and a restart policy everywhere, only TLS endpoints publish ports
(the edge's 80/443 and the broker's 6380), one beat, a TLS broker endpoint for the workers,
the broker running the repository's redis.conf, and every control-plane Redis URL read from
a secret file. Each rule is also shown to catch the mistake it is about, on a copy of the file
with that mistake made. The secret-generation commands of the file's header are run, and
the broker they configure is started with them and reached as compose's services would."""

from __future__ import annotations

import configparser
import copy
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from celery import Celery

from app.broker import redis_client
from app.celery_config import make_celery
from app.config import load_settings
from app.fleet.liveness import record_reconciled
from app.models import utcnow
from tests.conftest import ROOT
from tests.deploy.compose_secrets import generate, host_path, loopback, run_script, running_broker

COMPOSE = ROOT / "docker" / "compose.yaml"
REDIS_CONF = ROOT / "docker" / "redis" / "redis.conf"
EDGE = "edge"
BROKER = "redis"
# The only published ports: the TLS front (80 answers ACME and redirects to 443) and the
# broker's TLS port, which cloud workers reach.
PUBLISHED = {EDGE: {"80:80", "443:443"}, BROKER: {"6380:6380"}}
SECRETS_DIR = "/run/secrets/"
# An exact version (1.2.3, v2.55.1, 16.4-alpine, 0.10.13) or a digest; never a moving tag.
_PINNED_TAG = re.compile(r"^v?\d+(\.\d+)+([-_][a-z0-9.]+)*$")
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|_KEY_|AUTH|CREDENTIAL", re.IGNORECASE)
_URL_WITH_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s]*:[^/@\s]+@", re.IGNORECASE)


def _project_version() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg["metadata"]["version"]


def _load() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def _words(command: Any) -> list[str]:
    if command is None:
        return []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def _one_shot(name: str, services: dict[str, Any]) -> bool:
    """Run to completion and waited for by exit status (migrations): a healthcheck has no
    meaning there; its restart policy must still say `no`."""
    waited = any(
        isinstance(s.get("depends_on"), dict)
        and s["depends_on"].get(name, {}).get("condition") == "service_completed_successfully"
        for s in services.values()
    )
    return waited and str(services[name].get("restart")) == "no"


def image_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in doc["services"].items():
        image = service.get("image")
        if not image:
            problems.append(f"{name}: no image name, so nothing pins what runs")
            continue
        if "@sha256:" in image:
            continue
        repo, _, tag = image.rpartition(":")
        if not repo or "/" in tag:
            problems.append(f"{name}: {image} has no tag")
        elif not _PINNED_TAG.match(tag):
            problems.append(f"{name}: {image} is not pinned to an exact version")
        elif "build" in service and tag != _project_version():
            problems.append(f"{name}: built image {image} is not tagged {_project_version()}")
    return problems


def secret_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in doc["services"].items():
        env = service.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
        for key, value in env.items():
            text = "" if value is None else str(value)
            if _SECRET_NAME.search(key) and not key.endswith("_FILE") and "__FILE" not in key:
                problems.append(f"{name}: {key} passes a secret in the environment")
            if _URL_WITH_PASSWORD.search(text):
                problems.append(f"{name}: {key} holds a URL with a password")
            for var in re.findall(r"\$\{([A-Za-z0-9_]+)", text):
                if _SECRET_NAME.search(var):
                    problems.append(f"{name}: {key} interpolates the secret ${{{var}}}")
        for word in _words(service.get("command")):
            if _URL_WITH_PASSWORD.search(word) or re.search(r"password=|auth=", word, re.I):
                problems.append(f"{name}: its command line carries a secret")
    return problems


def health_problems(doc: dict[str, Any]) -> list[str]:
    services = doc["services"]
    problems = []
    for name, service in services.items():
        if not service.get("restart") and "restart_policy" not in service.get("deploy", {}):
            problems.append(f"{name}: no restart policy")
        if _one_shot(name, services):
            continue
        check = service.get("healthcheck")
        if not check or check.get("disable") or not check.get("test"):
            problems.append(f"{name}: no healthcheck")
    return problems


def port_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    for name, service in doc["services"].items():
        ports = {str(p) for p in service.get("ports") or []}
        allowed = PUBLISHED.get(name, set())
        if not allowed and ports:
            problems.append(
                f"{name}: publishes ports; only TLS endpoints ({sorted(PUBLISHED)}) may"
            )
        elif ports - allowed:
            problems.append(f"{name}: publishes {sorted(ports - allowed)}; only {sorted(allowed)}")
    return problems


def _secret_paths(service: dict[str, Any]) -> set[str]:
    """Where the service's compose secrets appear: /run/secrets/<target or name>."""
    paths = set()
    for entry in service.get("secrets") or []:
        target = entry if isinstance(entry, str) else entry.get("target", entry["source"])
        paths.add(target if target.startswith("/") else SECRETS_DIR + target)
    return paths


def _conf_paths(directive: str) -> list[str]:
    return [
        line.split()[1]
        for line in REDIS_CONF.read_text().splitlines()
        if line.split()[:1] == [directive]
    ]


def redis_problems(doc: dict[str, Any]) -> list[str]:
    """The broker runs docker/redis/redis.conf (TLS only, ACL file) with what it names."""
    service = doc["services"].get(BROKER)
    if service is None:
        return [f"no {BROKER} service"]
    problems = []
    script = " ".join(_words(service.get("command")))
    mounts = [str(v) for v in service.get("volumes") or []]
    confs = [
        m.split(":")[1] + "/redis.conf"
        for m in mounts
        if m.startswith("./redis:") and m.endswith(":ro")
    ]
    if not confs or f"redis-server {confs[0]}" not in script:
        problems.append(f"{BROKER}: does not run the repository's redis.conf (./redis, read-only)")
    if re.search(r"--(port|tls-port|aclfile|appendonly|maxmemory-policy)\b", script):
        problems.append(f"{BROKER}: overrides redis.conf on its command line")
    for path in _conf_paths("tls-cert-file") + _conf_paths("tls-key-file"):
        if path not in _secret_paths(service):
            problems.append(f"{BROKER}: redis.conf wants {path}, which no secret provides")
    aclfile = _conf_paths("aclfile")
    if (
        not aclfile
        or f"render-users-acl {SECRETS_DIR}" not in script
        or f"> {aclfile[0]}" not in script
    ):
        problems.append(f"{BROKER}: the ACL file is not rendered from a secret at start")
    test = " ".join(_words((service.get("healthcheck") or {}).get("test")))
    if "--tls" not in test or "--cacert" not in test:
        problems.append(f"{BROKER}: the healthcheck does not speak TLS")
    return problems


def _is_murmur(service: dict[str, Any]) -> bool:
    """A process of this repository's images: it reads Murmur's configuration."""
    return str(service.get("image", "")).startswith(("murmur-control:", "murmur-flower:"))


def control_redis_problems(doc: dict[str, Any]) -> list[str]:
    """Every control-plane client reaches the broker as murmur-control over verified TLS, with
    its URL (it holds the password) from a secret file or an env file under secrets/."""
    problems = []
    for name, service in doc["services"].items():
        env = service.get("environment") or {}
        words = _words(service.get("command"))
        if _is_murmur(service):
            secrets = _secret_paths(service)
            if "MURMUR_REDIS_URL" in env:
                problems.append(f"{name}: MURMUR_REDIS_URL is inline, not MURMUR_REDIS_URL_FILE")
            if env.get("MURMUR_REDIS_URL_FILE") not in secrets:
                problems.append(f"{name}: its Redis URL does not come from a secret file")
            if env.get("MURMUR_REDIS_CA_CERTS") not in secrets:
                problems.append(f"{name}: no broker CA (MURMUR_REDIS_CA_CERTS) from a secret")
        elif any(w.startswith("--broker-") for w in words):
            if any(w.startswith("--broker-url") for w in words):
                problems.append(f"{name}: the broker URL is on its command line")
            env_files = [str(f) for f in service.get("env_file") or []]
            if not env_files or not all(f.startswith("./secrets/") for f in env_files):
                problems.append(
                    f"{name}: its broker URL does not come from an env file in secrets/"
                )
            ca = [
                w.split("=", 2)[2]
                for w in words
                if w.startswith("--broker-ssl-option=ssl_ca_certs=")
            ]
            if (
                "--broker-ssl-option=ssl_cert_reqs=required" not in words
                or not ca
                or ca[0] not in _secret_paths(service)
            ):
                problems.append(f"{name}: does not verify the broker against its CA")
    return problems


def beat_problems(doc: dict[str, Any]) -> list[str]:
    beats = [
        name
        for name, service in doc["services"].items()
        if "beat" in _words(service.get("command"))
    ]
    problems = [] if len(beats) == 1 else [f"{len(beats)} beat services: {beats}"]
    for name in beats:
        replicas = doc["services"][name].get("deploy", {}).get("replicas", 1)
        if replicas != 1 or doc["services"][name].get("scale", 1) != 1:
            problems.append(f"{name}: more than one replica of beat")
    return problems


def broker_problems(doc: dict[str, Any]) -> list[str]:
    problems = []
    urls = {
        (service.get("environment") or {}).get("MURMUR_WORKER_BROKER_URL")
        for service in doc["services"].values()
        if isinstance(service.get("environment"), dict)
    } - {None}
    if not urls:
        problems.append("no MURMUR_WORKER_BROKER_URL: workers would get the internal broker URL")
    for url in urls:
        if not str(url).startswith("rediss://"):
            problems.append(f"worker broker endpoint is not TLS: {url}")
    return problems


RULES: list[Callable[[dict[str, Any]], list[str]]] = [
    image_problems,
    secret_problems,
    health_problems,
    port_problems,
    beat_problems,
    broker_problems,
    redis_problems,
    control_redis_problems,
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_compose_file_keeps_the_rule(rule: Callable[[dict[str, Any]], list[str]]) -> None:
    assert rule(_load()) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc["services"]
        for part in parents:
            node = node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return apply


def _second_beat(doc: dict[str, Any]) -> None:
    doc["services"]["beat-2"] = copy.deepcopy(doc["services"]["beat"])


@pytest.mark.parametrize(
    ("mistake", "rule", "expected"),
    [
        (_set("redis.image", "redis:latest"), image_problems, "redis: redis:latest is not pinned"),
        (_set("grafana.image", "grafana/grafana"), image_problems, "has no tag"),
        (_set("api.image", "murmur-control:local"), image_problems, "not pinned"),
        (
            _set("flower.environment.FLOWER_BASIC_AUTH", "ops:hunter2"),
            secret_problems,
            "flower: FLOWER_BASIC_AUTH passes a secret",
        ),
        (
            _set("api.environment.MURMUR_DATABASE_URL", "postgresql://murmur:pw@postgres/murmur"),
            secret_problems,
            "api: MURMUR_DATABASE_URL holds a URL with a password",
        ),
        (
            _set(
                "api.environment.MURMUR_DATABASE_URL",
                "postgresql://murmur:${POSTGRES_PASSWORD:?set it}@postgres:5432/murmur",
            ),
            secret_problems,
            "api: MURMUR_DATABASE_URL interpolates the secret ${POSTGRES_PASSWORD}",
        ),
        (
            _set("api.environment.MURMUR_API_TOKEN", "t" * 40),
            secret_problems,
            "api: MURMUR_API_TOKEN passes a secret",
        ),
        (_set("api.healthcheck", None), health_problems, "api: no healthcheck"),
        (_set("beat.restart", None), health_problems, "beat: no restart policy"),
        (_set("migrate.restart", None), health_problems, "migrate: no restart policy"),
        (_set("grafana.ports", ["127.0.0.1:3000:3000"]), port_problems, "grafana: publishes"),
        (_set("api.ports", ["8000:8000"]), port_problems, "api: publishes"),
        (_set("redis.ports", ["6380:6380", "6379:6379"]), port_problems, "redis: publishes ['6379"),
        (_set("edge.ports", ["80:80", "443:443", "2019:2019"]), port_problems, "edge: publishes"),
        (
            _set("redis.command", ["redis-server", "--appendonly", "yes"]),
            redis_problems,
            "does not run the repository's redis.conf",
        ),
        (_set("redis.secrets", ["redis_control_password"]), redis_problems, "which no secret"),
        (_set("redis.healthcheck.test", ["CMD", "redis-cli", "ping"]), redis_problems, "TLS"),
        (
            _set("api.environment.MURMUR_REDIS_URL", "redis://redis:6379/0"),
            control_redis_problems,
            "api: MURMUR_REDIS_URL is inline",
        ),
        (
            _set("flower.environment.MURMUR_REDIS_CA_CERTS", None),
            control_redis_problems,
            "flower: no broker CA",
        ),
        (
            _set("beat.secrets", ["database_url"]),
            control_redis_problems,
            "beat: its Redis URL does not come from a secret file",
        ),
        (
            _set("celery-exporter.command", ["--broker-url=rediss://redis:6380/0"]),
            control_redis_problems,
            "celery-exporter: the broker URL is on its command line",
        ),
        (
            _set("celery-exporter.env_file", ["./exporter.env"]),
            control_redis_problems,
            "celery-exporter: its broker URL does not come from an env file",
        ),
        (_second_beat, beat_problems, "2 beat services"),
        (_set("beat.deploy", {"replicas": 2}), beat_problems, "more than one replica"),
        (
            _set("api.environment.MURMUR_WORKER_BROKER_URL", "redis://broker:6379/0"),
            broker_problems,
            "not TLS",
        ),
    ],
)
def test_each_rule_catches_its_mistake(
    mistake: Callable[[dict[str, Any]], None],
    rule: Callable[[dict[str, Any]], list[str]],
    expected: str,
) -> None:
    doc = _load()
    mistake(doc)
    assert any(expected in problem for problem in rule(doc)), rule(doc)


def test_the_database_url_comes_from_its_secret_file(tmp_path: Path) -> None:
    """compose.yaml passes the database URL (it holds the password) as a secret file."""
    env = _load()["services"]["api"]["environment"]
    assert "MURMUR_DATABASE_URL" not in env
    secret = tmp_path / "database_url"
    secret.write_text("postgresql://murmur:s3cret@postgres:5432/murmur\n")
    settings = load_settings(env={"MURMUR_DATABASE_URL_FILE": str(secret)})
    assert settings.database_url == "postgresql://murmur:s3cret@postgres:5432/murmur"


def _exporter_ssl_options(service: dict[str, Any], doc: dict[str, Any], docker: Path) -> Any:
    """The exporter's --broker-ssl-option values, typed as it types them, host paths mapped."""
    options: dict[str, Any] = {}
    for word in _words(service["command"]):
        if word.startswith("--broker-ssl-option="):
            key, value = word.split("=", 2)[1:]
            if value.startswith(SECRETS_DIR):
                value = str(host_path(doc, "celery-exporter", value, docker))
            options[key] = int(value) if value.isnumeric() else value
    return options


def test_the_header_makes_every_secret_and_a_broker_compose_reaches(tmp_path: Path) -> None:
    """The header's commands, run as written, produce every file compose mounts, and a broker
    (repository redis.conf, TLS + ACL) that the control plane, the exporter and the
    healthcheck reach as compose configures them; a second run changes nothing."""
    secrets = generate(tmp_path, "broker.test.example")
    docker = tmp_path / "docker"
    doc = _load()
    for name, spec in doc["secrets"].items():
        assert (docker / spec["file"]).stat().st_size > 0, name
    for service in doc["services"].values():
        for env_file in service.get("env_file") or []:
            assert (docker / env_file).stat().st_size > 0
    assert secrets.stat().st_mode & 0o777 == 0o700
    assert (secrets / "redis-ca.key").stat().st_mode & 0o777 == 0o600
    before = {p.name: p.read_bytes() for p in secrets.iterdir()}

    url = (secrets / "redis_url").read_text().strip()
    password = (secrets / "redis_control_password").read_text().strip()
    assert url == f"rediss://murmur-control:{password}@redis:6380/0"
    assert (secrets / "celery_exporter.env").read_text() == f"CE_BROKER_URL={url}\n"
    san = subprocess.run(
        ["openssl", "x509", "-in", secrets / "redis-tls.crt", "-noout", "-ext", "subjectAltName"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for name in ("DNS:redis", "DNS:localhost", "IP Address:127.0.0.1", "DNS:broker.test.example"):
        assert name in san

    with running_broker(secrets, tmp_path) as port:
        # The control plane: settings from the secret files, as the services' env names them.
        api = doc["services"]["api"]["environment"]
        local_url = tmp_path / "redis_url"
        local_url.write_text(loopback(url, port) + "\n")
        ca = host_path(doc, "api", api["MURMUR_REDIS_CA_CERTS"], docker)
        settings = load_settings(
            env={"MURMUR_REDIS_URL_FILE": str(local_url), "MURMUR_REDIS_CA_CERTS": str(ca)}
        )
        client = redis_client(settings, socket_timeout=5)
        assert client.set("murmur:probe", "1") and client.get("murmur:probe") == b"1"
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("elsewhere")
        client.close()
        app = make_celery(settings)
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
        app.close()

        # The celery-exporter: its env file's URL and its SSL options, as it builds its app.
        exporter = doc["services"]["celery-exporter"]
        env_url = (docker / exporter["env_file"][0]).read_text().strip().split("=", 1)[1]
        probe = Celery(broker=loopback(env_url, port))
        probe.conf.broker_use_ssl = _exporter_ssl_options(exporter, doc, docker)
        with probe.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
        probe.close()

        # The healthcheck's shell line, with compose's paths and port mapped to this host.
        check = doc["services"][BROKER]["healthcheck"]["test"][1].replace("$$", "$")
        for path in set(re.findall(r"/run/secrets/[\w.-]+", check)):
            check = check.replace(path, str(host_path(doc, BROKER, path, docker)))
        run_script(check.replace("-p 6380", f"-p {port}"), tmp_path)
        wrong = check.replace("--user murmur-control", "--user default")
        with pytest.raises(AssertionError):
            run_script(wrong.replace("-p 6380", f"-p {port}"), tmp_path)

    generate(tmp_path, "broker.test.example")
    assert {p.name: p.read_bytes() for p in secrets.iterdir()} == before


def test_the_control_worker_healthcheck_is_the_control_planes_progress(tmp_path: Path) -> None:
    """Remote control is off, so `celery inspect ping` could never pass; the check runs as
    compose runs it (the control worker's broker URL and CA from its secrets) and fails once
    no reconcile made progress within fleet.reconcile_stale_seconds, or the broker refuses."""
    doc = _load()
    service = doc["services"]["control-worker"]
    check = _words(service["healthcheck"]["test"])
    assert check[:3] == ["CMD", "python", "-c"]
    secrets = generate(tmp_path, "broker.test.example")
    docker = tmp_path / "docker"
    env_spec = service["environment"]
    with running_broker(secrets, tmp_path) as port:
        url = tmp_path / "redis_url"
        url.write_text(loopback((secrets / "redis_url").read_text().strip(), port))
        env = {
            "PATH": os.environ["PATH"],
            "MURMUR_REDIS_URL_FILE": str(url),
            "MURMUR_REDIS_CA_CERTS": str(
                host_path(doc, "control-worker", env_spec["MURMUR_REDIS_CA_CERTS"], docker)
            ),
        }

        def healthy(**extra: str) -> bool:
            done = subprocess.run(
                [sys.executable, *check[2:]], env={**env, **extra}, cwd=ROOT,
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            return done.returncode == 0

        password = (secrets / "redis_control_password").read_text().strip()
        client = redis.Redis(
            host="localhost", port=port, ssl=True, username="murmur-control", password=password,
            ssl_ca_certs=str(secrets / "redis-ca.crt"),
        )  # fmt: skip
        assert healthy()  # nothing recorded yet: just started
        record_reconciled(client, utcnow() - timedelta(seconds=1000))
        assert not healthy()  # past the default 180 s
        record_reconciled(client, utcnow())
        assert healthy()
        wrong = tmp_path / "wrong_url"
        wrong.write_text(url.read_text().replace(password, "not-the-password"))
        assert not healthy(MURMUR_REDIS_URL_FILE=str(wrong))
        client.close()
