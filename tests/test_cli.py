"""The `murmur` command as a user runs it: submit with progress and wait, list jobs, validate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_TOKEN, FIXTURES, ROOT, LiveApi


def murmur(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_submit_wait_srt_and_jobs(live_api: LiveApi, start_worker: Any) -> None:
    start_worker()
    env = {**live_api.env, "MURMUR_URL": live_api.url, "MURMUR_API_TOKEN": API_TOKEN}
    done = murmur(
        ["submit", str(FIXTURES / "speech-short.wav"), "--wait", "--format", "srt", "--progress"],
        env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1\n00:00:0")
    assert "fox" in done.stdout.lower()
    assert "upload" in done.stderr  # the progress bar
    listed = murmur(["jobs"], env)
    assert listed.returncode == 0, listed.stderr
    assert "succeeded" in listed.stdout and "6.6s" in listed.stdout


def test_submit_reports_api_errors(live_api: LiveApi, tmp_path: Path) -> None:
    env = {**live_api.env, "MURMUR_URL": live_api.url, "MURMUR_API_TOKEN": API_TOKEN}
    bogus = tmp_path / "notes.wav"
    bogus.write_text("not audio at all " * 100)
    result = murmur(["submit", str(bogus)], env)
    assert result.returncode == 1
    assert "400 invalid_audio: the file is not audio that can be decoded" in result.stderr
    wrong = murmur(
        ["submit", str(FIXTURES / "speech-short.wav")], {**env, "MURMUR_API_TOKEN": "wrong-token"}
    )
    assert "401 unauthorized: invalid API token" in wrong.stderr


def test_validate_config_lists_every_problem(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        '[api]\nport = 99999\ncolour = "blue"\n\n'
        '[[profiles]]\nname = "a"\nprovider = "local"\nzone = "local"\n'
        'server_type = "local-cpu"\ncompute_type = "float16"\n'
    )
    env = {"PATH": "/usr/bin:/bin", "MURMUR_CONFIG": str(config)}
    result = murmur(["validate-config"], env, timeout=30)
    assert result.returncode == 1
    assert "api.port: Input should be less than or equal to 65535" in result.stderr
    assert "api.colour: unknown field" in result.stderr

    config.write_text(
        '[[profiles]]\nname = "a"\nprovider = "local"\nzone = "local"\n'
        'server_type = "local-cpu"\ncompute_type = "float16"\n'
    )
    result = murmur(["validate-config"], {**env, "MURMUR_API_TOKEN": "short"}, timeout=30)
    assert result.returncode == 1
    assert "profiles.a.compute_type: float16 cannot run on the CPU" in result.stderr
    assert "MURMUR_SIGNING_KEY: not set" in result.stderr
    assert "short" not in result.stderr


def test_validate_config_accepts_the_embedded_defaults() -> None:
    env = {"PATH": "/usr/bin:/bin", "MURMUR_API_TOKEN": API_TOKEN, "MURMUR_SIGNING_KEY": "k" * 40}
    result = murmur(["validate-config"], env, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "configuration OK: 1 profile(s): local-cpu"


def test_the_api_refuses_to_start_with_a_short_or_shared_scrape_token() -> None:
    base = {"PATH": "/usr/bin:/bin", "MURMUR_API_TOKEN": API_TOKEN, "MURMUR_SIGNING_KEY": "k" * 40}
    for scrape, rule in (
        ("scrape-me", "MURMUR_SCRAPE_TOKEN: must be at least 32 characters"),
        (API_TOKEN, "MURMUR_API_TOKEN and MURMUR_SCRAPE_TOKEN must be different credentials"),
    ):
        # Exits before gunicorn would start: nothing binds a port.
        result = murmur(["api"], {**base, "MURMUR_SCRAPE_TOKEN": scrape}, timeout=30)
        assert result.returncode == 1
        assert rule in result.stderr
        assert scrape not in result.stderr.replace(rule, "")
