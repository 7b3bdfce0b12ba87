"""Prometheus, alert, Grafana and compose files: they parse, and they only use real metrics."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.observability.conftest import ObsEnv
from tests.observability.test_metrics import populate, samples, scrape

DOCKER = ROOT / "docker"
PROMETHEUS = DOCKER / "prometheus"

# PromQL words that look like metric names: aggregations, functions, operators.
_PROMQL = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
}


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr
    )  # grouping label lists
    names = re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", expr)
    return {n for n in names if n.lower() not in _PROMQL}


def test_the_expression_parser_finds_metric_names() -> None:
    expr = (
        'sum by (profile) (rate(a_total{x="y, z"}[5m])) > on(job) group_left() '
        "(3 * b_seconds) unless max(c) and bool d"
    )
    assert metric_names_in(expr) == {"a_total", "b_seconds", "c", "d"}


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside a collapsed row (Grafana nests them there)."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard_exprs() -> list[str]:
    exprs = []
    for path in sorted((DOCKER / "grafana" / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard["panels"]):
            exprs += [t["expr"] for t in panel.get("targets", [])]
    return exprs


def test_panels_inside_collapsed_rows_are_checked_too() -> None:
    row = {"type": "row", "collapsed": True, "panels": [{"targets": [{"expr": "x_total"}]}]}
    found = [t["expr"] for p in _panels([{"targets": []}, row]) for t in p.get("targets", [])]
    assert found == ["x_total"]


@pytest.fixture()
def exposed(obs: ObsEnv) -> set[str]:
    """Every sample name a populated scrape exposes."""
    populate(obs)
    return {name for name, _, _ in samples(scrape(obs))}


def test_alerts_cover_the_operational_risks() -> None:
    names = {rule["alert"] for rule in _alerts()}
    assert {
        "MurmurWorkerStale",
        "MurmurJobWaitTooLong",
        "MurmurBudgetNearCap",
        "MurmurProvisioningFailing",
        "MurmurLeakedInstance",
    } <= names
    for rule in _alerts():
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_alerts_and_dashboards_only_use_exposed_metrics(exposed: set[str]) -> None:
    used = set()
    for expr in [rule["expr"] for rule in _alerts()] + _dashboard_exprs():
        used |= metric_names_in(expr)
    ours = {name for name in used if name.startswith("murmur_")}
    assert ours, "no Murmur metric referenced at all"
    assert ours <= exposed, f"not exposed: {sorted(ours - exposed)}"
    # Anything else is Prometheus' own `up`.
    assert used - ours <= {"up"}


def test_the_dashboard_shows_what_operators_asked_for() -> None:
    exprs = " ".join(_dashboard_exprs())
    for metric in (
        "murmur_queue_jobs",
        "murmur_queue_oldest_wait_seconds",
        "murmur_workers",
        "murmur_gpu_utilization_ratio",
        "murmur_gpu_memory_used_bytes",
        "murmur_fleet_cost_euros_per_hour",
        "murmur_job_duration_seconds_bucket",
    ):
        assert metric in exprs


def _dashboard_panels() -> list[dict[str, Any]]:
    found = []
    for path in sorted((DOCKER / "grafana" / "dashboards").glob("*.json")):
        found += [p for p in _panels(json.loads(path.read_text())["panels"]) if p.get("targets")]
    return found


def test_every_lifecycle_timing_has_a_panel_of_its_own() -> None:
    # Each documented worker timing (docs/observability.md) is on the dashboard, and the
    # start-up panel shows start-up only (teardown is not a step of starting).
    plotted = {
        panel["title"]: set().union(*(metric_names_in(t["expr"]) for t in panel["targets"]))
        for panel in _dashboard_panels()
    }
    everywhere = set().union(*plotted.values())
    for metric in (
        "provision",
        "boot",
        "startup",
        "image_pull",
        "first_job_wait",
        "teardown",
    ):
        assert f"murmur_worker_{metric}_seconds_bucket" in everywhere, metric
    startup = next(names for title, names in plotted.items() if "start-up" in title)
    assert startup == {"murmur_worker_boot_seconds_bucket", "murmur_worker_startup_seconds_bucket"}


def test_a_panel_of_seconds_has_the_unit_seconds() -> None:
    for panel in _dashboard_panels():
        names = set().union(*(metric_names_in(t["expr"]) for t in panel["targets"]))
        if names and all(n.endswith(("_seconds", "_seconds_bucket")) for n in names):
            assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]


def test_prometheus_scrapes_murmur_with_a_token_file_and_never_workers() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"murmur", "celery-exporter", "flower"}
    murmur = jobs["murmur"]
    assert murmur["authorization"]["credentials_file"] == "/run/secrets/scrape_token"
    assert "credentials" not in murmur["authorization"]
    assert "bearer_token" not in murmur and "bearer_token_file" not in murmur
    assert murmur["static_configs"] == [{"targets": ["api:8000"]}]


def test_promtool_accepts_the_config_and_the_rules(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    rules = subprocess.run(
        ["promtool", "check", "rules", str(PROMETHEUS / "alerts.yml")],
        capture_output=True,
        check=False,
    )
    assert rules.returncode == 0, rules.stdout.decode() + rules.stderr.decode()
    # promtool opens the credentials file: point it at a stand-in.
    token = tmp_path / "scrape_token"
    token.write_text("x" * 40)
    config = (PROMETHEUS / "prometheus.yml").read_text()
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/run/secrets/scrape_token", str(token))
    )
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def test_compose_runs_the_stack_with_pinned_images_and_secrets() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {
        "redis",
        "postgres",
        "api",
        "control-worker",
        "beat",
        "flower",
        "celery-exporter",
        "prometheus",
        "grafana",
    } <= set(services)
    for name, service in services.items():
        if "image" in service and "build" not in service:
            image = service["image"]
            assert ":" in image and not image.endswith(":latest"), f"{name}: {image} is not pinned"
    assert services["celery-exporter"]["image"].startswith("danihodovic/celery-exporter:")
    for name in ("api", "control-worker", "beat"):
        assert services[name]["build"]["dockerfile"] == "docker/control.Dockerfile"
        assert services[name]["environment"]["MURMUR_SCRAPE_TOKEN_FILE"] == (
            "/run/secrets/scrape_token"
        )
    # Flower's UI keeps basic auth, from a config file mounted as a secret (not the env).
    assert "--conf=/run/secrets/flowerconfig" in services["flower"]["command"]
    assert "flowerconfig" in services["flower"]["secrets"]
    assert "scrape_token" in services["prometheus"]["secrets"]
    # Provider keys only where instances are created and deleted.
    holders = {n for n, s in services.items() if "scw_secret_key" in s.get("secrets", [])}
    assert holders == {"control-worker"}


def test_the_control_image_runs_as_a_non_root_user() -> None:
    dockerfile = (DOCKER / "control.Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert "requirements/control.txt" in dockerfile
    users = re.findall(r"^USER (\S+)$", dockerfile, flags=re.MULTILINE)
    assert users and users[-1] != "root"
