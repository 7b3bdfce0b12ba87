"""MurmurControlPlaneStalled fires on a stale or missing reconcile, and only then (promtool)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMETHEUS = Path(__file__).resolve().parents[2] / "docker" / "prometheus"


def _rule() -> dict[str, Any]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    return next(r for r in rules if r.get("alert") == "MurmurControlPlaneStalled")


def _case(series: list[dict[str, str]], fires: bool) -> dict[str, object]:
    alert: dict[str, object] = {"eval_time": "5m", "alertname": "MurmurControlPlaneStalled"}
    if fires:
        rule = _rule()
        alert["exp_alerts"] = [
            {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
        ]
    else:
        alert["exp_alerts"] = []
    return {"interval": "1m", "input_series": series, "alert_rule_test": [alert]}


UP = {"series": 'up{job="murmur", instance="api:8000"}', "values": "1x10"}
BOUND = {"series": "murmur_fleet_reconcile_stale_seconds", "values": "180x10"}


def test_the_alert_fires_when_reconciles_stop_and_stays_quiet_while_they_run(
    tmp_path: Path,
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            # Reconciles complete every few seconds: the age stays small.
            _case(
                [UP, BOUND, {"series": "murmur_fleet_reconcile_age_seconds", "values": "3x10"}],
                fires=False,
            ),
            # The control worker died: the age grows past the bound and stays there.
            _case(
                [UP, BOUND, {"series": "murmur_fleet_reconcile_age_seconds", "values": "60+60x10"}],
                fires=True,
            ),
            # No reconcile ever completed while Murmur itself is scraped.
            _case([UP, BOUND], fires=True),
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
