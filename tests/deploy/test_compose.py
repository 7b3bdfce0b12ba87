"""docker/compose.yaml, checked by parsing (no container engine here): pinned images, no
inline secret, a healthcheck and a restart policy everywhere, only the TLS front publishes
ports, one beat, and a TLS broker endpoint for the workers. Each rule is also shown to catch
the mistake it is about, on a copy of the file with that mistake made."""

from __future__ import annotations

import configparser
import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config import load_settings
from tests.conftest import ROOT

COMPOSE = ROOT / "docker" / "compose.yaml"
EDGE = "edge"
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
    return [
        f"{name}: publishes ports; only {EDGE} may"
        for name, service in doc["services"].items()
        if service.get("ports") and name != EDGE
    ]


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
