"""Every control-plane process refuses to start on what `murmur validate-config` refuses for
it (here: a scaleway profile whose worker image is not pinned by digest), with one message
and a non-zero exit, instead of failing at the first job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app import create_app
from app.cli import main
from app.config import StartupRefused
from tests.conftest import API_TOKEN, REDIS_URL, SIGNING_KEY, free_port

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "@sha256:" + "0" * 64
PROBLEM = "profiles.l4-par2.worker_image: 'rg.fr-par.scw.cloud/murmur/worker:latest' names a tag"


@pytest.fixture()
def unpinned_env(tmp_path: Path) -> dict[str, str]:
    """The example configuration with its first profile's worker image named by a tag; every
    other setting valid, so the image is the one problem of the API and beat roles."""
    example = (ROOT / "config" / "murmur.example.toml").read_text()
    pinned = f'worker_image = "rg.fr-par.scw.cloud/murmur/worker{DIGEST}"'
    assert pinned in example
    config = tmp_path / "murmur.toml"
    config.write_text(
        example.replace(pinned, 'worker_image = "rg.fr-par.scw.cloud/murmur/worker:latest"', 1)
    )
    return {
        "MURMUR_CONFIG": str(config),
        "MURMUR_DATABASE_URL": f"sqlite:///{tmp_path}/murmur.db",
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_PUBLIC_URL": "https://murmur.example.com",
        "MURMUR_WORKER_BROKER_URL": "rediss://worker:pw@broker.example.com:6380/0",
        "MURMUR_API_TOKEN": API_TOKEN,
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_SCRAPE_TOKEN": "scrape-token-" + "s" * 32,
        "MURMUR_PORT": str(free_port()),
    }


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MURMUR_", "SCW_"))}
    return {**env, **extra}


def test_validate_config_reports_the_problem_for_the_api_role(
    unpinned_env: dict[str, str],
) -> None:
    result = CliRunner().invoke(main, ["validate-config", "--role", "api"], env=unpinned_env)
    assert result.exit_code == 1
    assert "1 problem(s)" in result.output and PROBLEM in result.output


def test_create_app_refuses_what_validate_config_refuses(
    unpinned_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in unpinned_env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StartupRefused) as refused:
        create_app()
    assert str(refused.value).startswith("cannot start the API: 1 configuration problem(s)")
    assert PROBLEM in str(refused.value)


def test_murmur_api_refuses_with_one_message(unpinned_env: dict[str, str]) -> None:
    result = CliRunner().invoke(main, ["api"], env=unpinned_env)
    assert result.exit_code == 1
    assert "cannot start the API" in result.output and PROBLEM in result.output
    assert "Traceback" not in result.output


def _start(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=_clean_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "process"),
    [
        (["gunicorn", "--workers", "1", "app:create_app()"], "API"),
        (["celery", "-A", "tasks", "worker", "-Q", "control", "--pool", "solo"], "control worker"),
        (["celery", "-A", "tasks", "beat"], "beat"),
    ],
    ids=["gunicorn", "control-worker", "beat"],
)
def test_each_process_refuses_to_start(
    args: list[str], process: str, unpinned_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**unpinned_env, "SCW_ACCESS_KEY": "SCWXXXXXXXXXXXXXXXXX", "SCW_SECRET_KEY": "x" * 36}
    if args[0] == "gunicorn":
        args = [*args[:-1], "--bind", f"127.0.0.1:{unpinned_env['MURMUR_PORT']}", args[-1]]
    if args[-1] == "beat":
        args = [*args, "--schedule", str(tmp_path / "beat-schedule")]
    done = _start(args, env)
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"cannot start the {process}: 1 configuration problem(s)" in done.stderr
    assert PROBLEM in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_the_local_stack_refuses_before_starting_anything(unpinned_env: dict[str, str]) -> None:
    from scripts.stack import running_stack

    with pytest.raises(SystemExit) as refused, running_stack(unpinned_env, echo=()):
        pytest.fail("the stack started")
    assert PROBLEM in str(refused.value.code)
