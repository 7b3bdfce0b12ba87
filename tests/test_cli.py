"""The `murmur` command as a user runs it, against a real API: submit files and URLs with
every job option, wait, fetch transcripts, cancel, purge, list jobs; one-line errors; shell
completion; validate the configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.models import Job
from tests.conftest import API_TOKEN, FIXTURES, OTHER_TOKEN, ROOT, LiveApi, free_port
from tests.serving import serving_audio


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


@pytest.fixture
def audio_url() -> Iterator[str]:
    """A loopback server (URL jobs may name private addresses under live_api) serving
    speech-short.wav."""
    with serving_audio((FIXTURES / "speech-short.wav").read_bytes()) as url:
        yield url


def client_env(live_api: LiveApi) -> dict[str, str]:
    """The API's address by MURMUR_URL, and a token of its, as a user of the CLI sets them."""
    return {**live_api.env, "MURMUR_URL": live_api.url, "MURMUR_API_TOKEN": API_TOKEN}


def assert_one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    """The command failed with exactly one line on stderr, `murmur: ...` holding `expected`."""
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("murmur: ") and expected in lines[0], lines[0]


@pytest.mark.slow
def test_submit_file_and_url_wait_transcript_jobs_purge(
    live_api: LiveApi, start_worker: Any, io_worker: Any, audio_url: str
) -> None:
    start_worker()
    env = client_env(live_api)
    done = murmur(
        ["submit", str(FIXTURES / "speech-short.wav"), "--wait", "--format", "srt", "--progress"],
        env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1\n00:00:0")
    assert "fox" in done.stdout.lower()
    assert "upload" in done.stderr  # the progress bar

    # A URL: fetched by the I/O worker, then transcribed like an upload.
    by_url = murmur(["submit", audio_url, "--wait", "--format", "json"], env)
    assert by_url.returncode == 0, by_url.stderr
    assert "fox" in json.loads(by_url.stdout)["text"].lower()

    listed = murmur(["jobs"], env)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert len(rows) == 2
    for row in rows:
        # The text column holds the start of each transcript (a listing leaves text out).
        assert "succeeded" in row and "6.6s" in row and "fox" in row.lower(), row
    newest, oldest = (row.split()[0] for row in rows)

    vtt = murmur(["transcript", oldest, "--format", "vtt"], env)
    assert vtt.returncode == 0, vtt.stderr
    assert vtt.stdout.startswith("WEBVTT") and "fox" in vtt.stdout.lower()
    shown = json.loads(murmur(["show", newest], env).stdout)
    assert shown["source"] == "url" and shown["status"] == "succeeded"

    cancel = murmur(["cancel", newest], env)
    assert_one_line(cancel, "409 job_finished")
    purged = murmur(["purge", newest], env)
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.strip() == f"{newest} purged"
    assert_one_line(murmur(["transcript", newest], env), "404 job_not_found")
    assert len(murmur(["jobs"], env).stdout.splitlines()) == 2  # the header and one job


@pytest.mark.slow
def test_submit_options_cancel_and_purge_without_a_worker(
    live_api: LiveApi, tmp_path: Path
) -> None:
    # The address from MURMUR_HOST/MURMUR_PORT as `murmur api` serves on (a wildcard host
    # is called on the loopback), the token from a file.
    token_file = tmp_path / "token"
    token_file.write_text(f"{API_TOKEN},{OTHER_TOKEN}\n")
    env = {
        **live_api.env,
        "MURMUR_HOST": "0.0.0.0",  # noqa: S104
        "MURMUR_PORT": live_api.url.rsplit(":", 1)[1],
        "MURMUR_API_TOKEN": "",
        "MURMUR_API_TOKEN_FILE": str(token_file),
    }
    env.pop("MURMUR_URL", None)
    options = ["--task", "translate", "--language", "de", "--model", "base"]
    options += ["--prompt", "Guten Morgen, Frau M\u00fcller.", "--words"]
    submitted = murmur(["submit", str(FIXTURES / "speech-short.wav"), *options], env)
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert (job["task"], job["language"], job["model"], job["word_timestamps"]) == (
        "translate",
        "de",
        "base",
        True,
    )
    assert job["status"] == "queued"  # no worker: it waits
    with live_api.db.session() as s:
        row = s.get(Job, job["id"])
        assert row is not None and row.prompt == "Guten Morgen, Frau M\u00fcller."

    assert_one_line(murmur(["transcript", job["id"]], env), "409 job_not_finished")
    assert_one_line(murmur(["purge", job["id"]], env), "409 job_not_finished")
    cancelled = murmur(["cancel", job["id"]], env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"{job['id']} cancelled"
    assert murmur(["purge", job["id"]], env).returncode == 0
    assert_one_line(murmur(["show", job["id"]], env), "404 job_not_found")

    # Diarization and a model no profile serves: the fields reach the API, which refuses.
    speech = str(FIXTURES / "speech-short.wav")
    diarize = ["submit", speech, "--diarize", "--min-speakers", "2", "--max-speakers", "3"]
    assert_one_line(murmur(diarize, env), "400 diarization_unavailable")
    assert_one_line(murmur(["submit", speech, "--model", "tiny.en"], env), "400 model_not_found")
    models = murmur(["models"], env)
    assert models.returncode == 0, models.stderr
    assert "base" in models.stdout.split()


@pytest.mark.slow
def test_client_errors_are_one_line(live_api: LiveApi, tmp_path: Path) -> None:
    env = client_env(live_api)
    bogus = tmp_path / "notes.wav"
    bogus.write_text("not audio at all " * 100)
    assert_one_line(
        murmur(["submit", str(bogus)], env),
        "400 invalid_audio: the file is not audio that can be decoded",
    )
    speech = str(FIXTURES / "speech-short.wav")
    wrong = murmur(["submit", speech], {**env, "MURMUR_API_TOKEN": "wrong-token"})
    assert_one_line(wrong, "401 unauthorized: invalid API token")
    assert "wrong-token" not in wrong.stderr

    # Nothing listens on the port: where it looked, why, and what moves it.
    nobody = f"http://127.0.0.1:{free_port()}"
    for args in (["jobs"], ["submit", speech], ["cancel", "x"]):
        unreachable = murmur(args, {**env, "MURMUR_URL": nobody})
        assert_one_line(unreachable, f"cannot reach the API at {nobody}: Connection refused")
        assert "MURMUR_URL" in unreachable.stderr
    with_password = murmur(["jobs"], {**env, "MURMUR_URL": nobody.replace("//", "//u:s3cret@")})
    assert_one_line(with_password, f"cannot reach the API at {nobody}")
    assert "s3cret" not in with_password.stderr

    no_token = {k: v for k, v in env.items() if not k.startswith("MURMUR_API_TOKEN")}
    assert_one_line(murmur(["jobs"], no_token), "no API token: set MURMUR_API_TOKEN")
    missing = murmur(["jobs"], {**no_token, "MURMUR_API_TOKEN_FILE": str(tmp_path / "none")})
    assert_one_line(missing, "cannot read MURMUR_API_TOKEN_FILE")
    assert_one_line(murmur(["submit", str(tmp_path / "absent.wav")], env), "no such file")


@pytest.mark.slow
def test_shell_completion_as_click_offers_it(live_api: LiveApi) -> None:
    env = client_env(live_api)
    script = murmur([], {**env, "_MURMUR_COMPLETE": "bash_source"})
    assert script.returncode == 0, script.stderr
    assert "_murmur_completion" in script.stdout and "complete " in script.stdout

    def complete(words: str) -> list[str]:
        answer = murmur(
            [],
            {
                **env,
                "_MURMUR_COMPLETE": "bash_complete",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
            },
        )
        assert answer.returncode == 0, answer.stderr
        return [line.split(",", 1)[1] for line in answer.stdout.splitlines()]

    assert {"submit", "transcript", "cancel", "purge", "jobs"} <= set(complete("murmur "))
    assert complete("murmur submit x --for") == ["--format"]
    job = json.loads(murmur(["submit", str(FIXTURES / "speech-short.wav")], env).stdout)
    # A JOB argument completes to the caller's job ids, read from the API.
    assert complete("murmur cancel ") == [job["id"]]
    assert complete(f"murmur transcript {job['id'][:8]}") == [job["id"]]


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
