"""The alert on a profile whose workers never become ready: it exists, uses exposed metrics,
and (with promtool) fires on the series the collector writes — and only then."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.observability.conftest import ObsEnv
from tests.observability.test_ecosystem import metric_names_in
from tests.observability.test_metrics import samples, scrape

ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"
NAME = "MurmurProfileNotBooting"


def _rule() -> dict[str, object]:
    doc = yaml.safe_load(ALERTS.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == NAME]
    return rule


def test_the_rule_uses_metrics_every_scrape_exposes(obs: ObsEnv) -> None:
    rule = _rule()
    assert rule["labels"] == {"severity": "critical"}
    used = metric_names_in(str(rule["expr"]))
    # The count against the setting, or a hold after one boot failure the instance reported.
    assert used == {
        "murmur_fleet_profile_failed_boots",
        "murmur_fleet_max_failed_boots",
        "murmur_fleet_profile_held",
    }
    # No worker, no failed boot yet: the series exist anyway (0 and the setting).
    exposed = {name for name, _, _ in samples(scrape(obs))}
    assert used <= exposed


UNIT_TEST = """
rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'murmur_fleet_max_failed_boots{job="murmur"}'
        values: '3x10'
      - series: 'murmur_fleet_profile_failed_boots{job="murmur", profile="l4"}'
        values: '0 1 2 3 3 3 3 3 3 3 3'
      - series: 'murmur_fleet_profile_failed_boots{job="murmur", profile="p100"}'
        values: '0 1 2 2 2 2 2 2 2 2 2'
    alert_rule_test:
      - eval_time: 3m
        alertname: MurmurProfileNotBooting
        exp_alerts: []
      - eval_time: 5m
        alertname: MurmurProfileNotBooting
        exp_alerts:
          - exp_labels: {severity: critical, profile: l4}
            exp_annotations:
              summary: "No worker of profile l4 becomes ready"
              description: "DESCRIPTION"
"""


def test_promtool_fires_it_at_the_limit_only(tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    description = str(_rule()["annotations"]["description"]).replace("{{ $value }}", "3")  # type: ignore[index]
    (tmp_path / "test.yml").write_text(UNIT_TEST.replace("DESCRIPTION", description))
    run = subprocess.run(
        ["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, check=False
    )
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()
