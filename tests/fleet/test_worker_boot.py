"""From image to running worker: the profile's container by digest, and the cloud-init that runs it.

The user data is rendered for a real profile and read back the way the instance would: as
YAML cloud-config, the env file as Docker reads it, the unit checked by `systemd-analyze
verify` (in a scratch root with stand-ins for docker and the units it names), and the pull
script run by a real shell against a stand-in `docker`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from app.cli import main as murmur
from app.config import Settings, worker_image_problem
from app.credentials import InstanceCredential
from app.fleet import cloudinit
from app.fleet.catalog import SERVER_TYPES, server_device
from app.fleet.cloudinit import render_user_data, worker_environment
from gpu_worker.protocol.runtime import DEFAULT_DRAIN_TIMEOUT_SECONDS, EXIT_RUNTIME_MISMATCH
from gpu_worker.runtime import image_pull_seconds
from tests.fleet.conftest import L4, P100, WORKER_IMAGE
from tests.fleet.test_config import GROUPS, SECRETS, problems_of, profile

SIGNING_KEY = "boot-test-signing-key-" + "k" * 32
CONTROL_REDIS = "rediss://murmur-control:control-plane-password@broker.example.com:6380/0"
WORKER_BROKER = "rediss://murmur-worker-wrk_1:worker-own-password@broker.example.com:6380/0"
DIGEST = "sha256:" + "ab" * 32


def _settings() -> Settings:
    return Settings.model_validate(
        {
            "redis_url": CONTROL_REDIS,
            "api": {"public_url": "https://murmur.example.com"},
            "profiles": [L4, P100],
            "api_tokens": ["api-token-" + "a" * 32],
            "signing_key": SIGNING_KEY,
            "scrape_token": "scrape-token-" + "d" * 32,
            "scaleway_access_key": "SCWXXXXXXXXXXXXXXXXX",
            "scaleway_secret_key": "8f6e2d3c-1b2a-4c5d-9e8f-7a6b5c4d3e2f",
        }
    )


def _rendered(profile_name: str = "l4-par2") -> tuple[Settings, str, dict[str, Any]]:
    settings = _settings()
    profile = settings.profile(profile_name)
    env = worker_environment(settings, profile, "wrk_1", "inst-1", WORKER_BROKER)
    text = render_user_data(env, profile)
    return settings, text, yaml.safe_load(text)


def _files(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in config["write_files"]}


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of a systemd unit, each key with all its values in order (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def test_user_data_is_cloud_config_with_a_root_only_env_file() -> None:
    _, text, config = _rendered()
    assert text.startswith("#cloud-config\n")
    files = _files(config)
    env_file = files[cloudinit.ENV_FILE]
    assert (env_file["owner"], env_file["permissions"]) == ("root:root", "0600")
    assert files[cloudinit.UNIT_FILE]["permissions"] == "0644"
    assert files[cloudinit.PULL_SCRIPT]["permissions"] == "0755"
    assert config["runcmd"] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "murmur-worker.service"],
    ]
    # Docker reads an env file literally: KEY=value, no quotes.
    env = dict(line.split("=", 1) for line in env_file["content"].splitlines())
    assert env["MURMUR_BROKER_URL"] == WORKER_BROKER
    assert env["MURMUR_PROFILE"] == "l4-par2" and env["MURMUR_DEVICE"] == "cuda"
    assert float(env["MURMUR_DRAIN_TIMEOUT"]) == DEFAULT_DRAIN_TIMEOUT_SECONDS


def test_a_server_types_device_is_cuda_exactly_when_it_has_a_gpu() -> None:
    for stype in SERVER_TYPES.values():
        assert stype.device == ("cpu" if stype.gpu is None else "cuda")
        assert server_device(stype.name) == stype.device
    assert server_device("no-such-type") == "cpu"


def test_the_only_secrets_are_this_workers_own() -> None:
    settings, text, _ = _rendered()
    token = InstanceCredential.derive(SIGNING_KEY, "wrk_1", "inst-1").token
    assert token in text and "worker-own-password" in text
    for secret in (
        SIGNING_KEY,
        "control-plane-password",
        settings.reveal("scrape_token"),
        settings.reveal("scaleway_secret_key"),
        settings.reveal("scaleway_access_key"),
        settings.api_tokens[0].get_secret_value(),
    ):
        assert secret not in text


def test_the_unit_runs_the_container_by_digest_with_the_gpus_and_outlasts_the_drain() -> None:
    _, _, config = _rendered()
    unit = _unit(_files(config)[cloudinit.UNIT_FILE]["content"])
    service = unit["Service"]
    (start,) = service["ExecStart"]
    args = start.split()
    assert args[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert args[-1] == WORKER_IMAGE and "--gpus" in args and args[args.index("--gpus") + 1] == "all"
    assert f"{cloudinit.ENV_FILE}" in args and cloudinit.PULL_ENV_FILE in args
    stop_timeout = int(args[args.index("--stop-timeout") + 1])
    assert stop_timeout > DEFAULT_DRAIN_TIMEOUT_SECONDS
    assert int(service["TimeoutStopSec"][0]) > stop_timeout
    assert service["ExecStop"] == [f"/usr/bin/docker stop --time {stop_timeout} murmur-worker"]
    pull = [p for p in service["ExecStartPre"] if p.startswith(cloudinit.PULL_SCRIPT)]
    assert pull == [f"{cloudinit.PULL_SCRIPT} {cloudinit.PULL_ENV_FILE} {WORKER_IMAGE}"]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartPreventExitStatus"] == [str(EXIT_RUNTIME_MISMATCH)]
    assert "docker.service" in unit["Unit"]["Requires"][0]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    _, _, config = _rendered()
    root = tmp_path / "root"
    for path, file in _files(config).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file["content"])
        target.chmod(int(file["permissions"], 8))
    docker = root / "usr/bin/docker"
    docker.parent.mkdir(parents=True)
    docker.write_text("#!/bin/sh\n")
    docker.chmod(0o755)
    # Stand-ins for the units the worker's unit names, as the GPU OS image has them.
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    (units / "docker.service").write_text("[Service]\nExecStart=/usr/bin/docker\n")
    for target in ("sysinit.target", "basic.target", "multi-user.target", "shutdown.target",
                   "network-online.target"):  # fmt: skip
        (units / target).write_text("[Unit]\nDescription=stand-in\n")
    result = subprocess.run(
        [analyze, "verify", f"--root={root}", "murmur-worker.service"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # systemd warns, e.g. "ignoring", here


def test_the_pull_script_records_how_long_the_pull_took(tmp_path: Path) -> None:
    _, _, config = _rendered()
    script = tmp_path / "pull-worker-image"
    script.write_text(_files(config)[cloudinit.PULL_SCRIPT]["content"])
    script.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "docker-calls"
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nsleep 0.3\n')
    (bin_dir / "docker").chmod(0o755)
    out = tmp_path / "pull.env"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run([str(script), str(out), WORKER_IMAGE], check=True, env=env, timeout=30)
    assert calls.read_text() == f"pull --quiet {WORKER_IMAGE}\n"
    key, _, seconds = out.read_text().strip().partition("=")
    assert key == "MURMUR_IMAGE_PULL_SECONDS"
    assert 0.3 <= float(seconds) < 10
    assert image_pull_seconds({key: seconds}) == pytest.approx(float(seconds))

    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")  # the registry refused the pull
    out.unlink()
    failed = subprocess.run([str(script), str(out), WORKER_IMAGE], env=env, timeout=30)
    assert failed.returncode != 0 and not out.exists()


def test_the_worker_reads_the_pull_time_or_ignores_it() -> None:
    assert image_pull_seconds({"MURMUR_IMAGE_PULL_SECONDS": "12.3456"}) == 12.346
    for bad in ({}, {"MURMUR_IMAGE_PULL_SECONDS": "soon"}, {"MURMUR_IMAGE_PULL_SECONDS": "-1"}):
        assert image_pull_seconds(bad) is None


def test_a_profile_without_a_pinned_image_gets_no_user_data() -> None:
    settings = _settings()
    unpinned = settings.profile("l4-par2").model_copy(
        update={"worker_image": "rg.fr-par.scw.cloud/murmur/worker:latest"}
    )
    env = worker_environment(settings, unpinned, "wrk_1", "inst-1")
    with pytest.raises(ValueError, match="names a tag"):
        render_user_data(env, unpinned)


def test_an_env_value_on_two_lines_is_refused() -> None:
    settings = _settings()
    profile = settings.profile("l4-par2")
    env = {**worker_environment(settings, profile, "wrk_1", "inst-1"), "MURMUR_X": "a\nB=c"}
    with pytest.raises(ValueError, match="MURMUR_X"):
        render_user_data(env, profile)


# -- validate-config --------------------------------------------------------------------------

IMAGE_CASES = [
    ("no worker image", profile(worker_image=""), "required for the scaleway provider"),
    (
        "a tag",
        profile(worker_image="rg.fr-par.scw.cloud/murmur/worker:1.4"),
        "names a tag; pin the image by digest",
    ),
    (
        "a tag beside the digest",
        profile(worker_image=f"rg.fr-par.scw.cloud/murmur/worker:1.4@{DIGEST}"),
        "names a tag",
    ),
    (
        "no digest",
        profile(worker_image="rg.fr-par.scw.cloud/murmur/worker"),
        "has no digest",
    ),
    (
        "a short digest",
        profile(worker_image="rg.fr-par.scw.cloud/murmur/worker@sha256:abc"),
        "not an image reference by digest",
    ),
    (
        "a shell word",
        profile(worker_image=f"worker@{DIGEST} --privileged"),
        "not an image reference by digest",
    ),
]


@pytest.mark.parametrize(("case", "text", "expected"), IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
def test_validate_config_refuses_an_image_not_pinned_by_digest(
    tmp_path: Path, case: str, text: str, expected: str
) -> None:
    problems = problems_of(tmp_path, GROUPS + text)
    assert len(problems) == 1 and problems[0].startswith("profiles.gpu.worker_image: ")
    assert expected in problems[0]


@pytest.mark.parametrize(
    "image",
    [
        f"rg.fr-par.scw.cloud/murmur/worker@{DIGEST}",
        f"registry.example:5000/team/murmur-worker@{DIGEST}",
        f"murmur-worker@{DIGEST}",
    ],
)
def test_an_image_by_digest_is_accepted(tmp_path: Path, image: str) -> None:
    assert worker_image_problem(image) is None
    assert problems_of(tmp_path, GROUPS + profile(worker_image=image)) == []


def test_the_cli_names_the_profile_and_exits_non_zero(tmp_path: Path) -> None:
    path = tmp_path / "murmur.toml"
    path.write_text(GROUPS + profile(worker_image="rg.fr-par.scw.cloud/murmur/worker:latest"))
    result = CliRunner().invoke(
        murmur, ["validate-config"], env={**SECRETS, "MURMUR_CONFIG": str(path)}
    )
    assert result.exit_code != 0
    assert "profiles.gpu.worker_image:" in result.output and "names a tag" in result.output
