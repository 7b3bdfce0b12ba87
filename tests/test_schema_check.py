"""A database nobody migrated (a new file, a typo in a SQLite path, an upgrade whose
`murmur db upgrade` was skipped) is named as such: /readyz fails its database check, and the
API and the Celery workers refuse to start, instead of answering 500 on a missing table. A
later release's schema is served on (its migrations only add), and a database that does not
answer is left to /readyz."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from app import create_app
from app.cli import main
from app.db import Database
from app.factory import ApiCannotStart
from app.migrate import database_schema_problem, head_revision, upgrade
from tests.conftest import (
    API_TOKEN,
    REDIS_URL,
    SIGNING_KEY,
    free_port,
    make_settings,
    throwaway_database,
)

ROOT = Path(__file__).resolve().parents[1]
UPGRADE = "run `murmur db upgrade`"


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it: a new SQLite file's path, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/murmur.db"
        return
    with throwaway_database(request.getfixturevalue("postgres_server"), "murmur_schema") as url:
        yield url


def _database_check(url: str, tmp_path: Path) -> tuple[int, str]:
    settings = make_settings(url, REDIS_URL, tmp_path)
    db = Database(url)
    try:
        response = create_app(settings, db=db).test_client().get("/readyz")
        return response.status_code, response.get_json()["checks"]["database"]
    finally:
        db.dispose()


def _set_version(url: str, revision: str) -> None:
    db = Database(url)
    try:
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    finally:
        db.dispose()


def test_readyz_fails_until_the_schema_is_this_releases(empty_url: str, tmp_path: Path) -> None:
    status, check = _database_check(empty_url, tmp_path)
    assert (status, check) == (503, f"failed: no Murmur schema; {UPGRADE}")

    upgrade(empty_url, "0005_audio_expiry")  # an older release's schema
    status, check = _database_check(empty_url, tmp_path)
    assert status == 503
    assert check == (
        f"failed: schema at 0005_audio_expiry, this release needs {head_revision()}; {UPGRADE}"
    )

    upgrade(empty_url)
    assert _database_check(empty_url, tmp_path)[1] == "ok"

    # A later release migrated it: this one keeps serving while the new one rolls out.
    _set_version(empty_url, "0099_from_a_later_release")
    assert _database_check(empty_url, tmp_path)[1] == "ok"


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return {
        "MURMUR_CONFIG": str(ROOT / "config" / "local.toml"),
        "MURMUR_DATABASE_URL": url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": API_TOKEN,
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
    }


def test_the_api_refuses_to_start_on_a_database_nobody_migrated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    typo = tmp_path / "vra" / "murmur.db"  # an operator's typo for var/
    env = _env(tmp_path, f"sqlite:///{typo}")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expected = f"cannot start the API: the database sqlite:///{typo}: no Murmur schema; {UPGRADE}"
    with pytest.raises(ApiCannotStart) as refused:
        create_app()
    assert str(refused.value) == expected

    result = CliRunner().invoke(main, ["api"], env=env)
    assert result.exit_code == 1
    assert result.stderr.strip() == expected

    upgrade(env["MURMUR_DATABASE_URL"])
    create_app()  # the same start, migrated: no refusal


def test_the_refusal_names_a_postgresql_database_without_its_password(
    postgres_server: str, tmp_path: Path
) -> None:
    with throwaway_database(postgres_server, "murmur_schema") as empty:
        # The test server trusts local connections: any password is accepted, none shown.
        url = empty.replace("postgres@", "postgres:hunter2secret@", 1)
        assert "hunter2secret" in url
        result = CliRunner().invoke(main, ["api"], env=_env(tmp_path, url))
    assert result.exit_code == 1
    assert "postgres:***@" in result.stderr and f"no Murmur schema; {UPGRADE}" in result.stderr
    assert "hunter2secret" not in result.output


def test_a_database_that_does_not_answer_is_left_to_readyz() -> None:
    db = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/murmur")
    try:
        assert database_schema_problem(db) is None
    finally:
        db.dispose()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("queue", "process"), [("control", "control worker"), ("io", "Celery worker")]
)
def test_a_celery_worker_refuses_to_start_on_an_older_schema(
    queue: str, process: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/murmur.db"
    upgrade(url, "0006_job_routing_options")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MURMUR_", "SCW_"))}
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-Q", queue, "--pool", "solo"],
        cwd=ROOT,
        env={**env, **_env(tmp_path, url)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"cannot start the {process}: the database {url}: schema at 0006_job_routing_options, "
        f"this release needs {head_revision()}; {UPGRADE}"
    ) in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
