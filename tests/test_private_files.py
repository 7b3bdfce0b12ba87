"""The database, the audio and the local secrets are created owner-only, whatever the umask.

Also what `make up` says about the API token: a token the operator supplied is never printed.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.config import Settings
from app.db import Database
from app.migrate import upgrade
from app.storage import LocalAudioStore
from scripts import stack
from tests.conftest import FIXTURES, auth


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def umask_022() -> Iterator[None]:
    """The usual umask, under which plain creation gives 0644 files and 0755 directories."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_sqlite_database_and_its_wal_files_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "new-var" / "murmur.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    db = Database(url)
    try:
        with db.session() as s:
            s.execute(
                text("INSERT INTO profile_state (name, consecutive_stockouts) VALUES ('p', 0)")
            )
        wal_files = [Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert all(p.exists() for p in wal_files)
        assert mode(path.parent) == 0o700
        assert mode(path) == 0o600
        for extra in wal_files:
            assert mode(extra) == 0o600, extra
    finally:
        db.dispose()


def test_an_existing_readable_database_is_tightened(tmp_path: Path, umask_022: None) -> None:
    path = tmp_path / "murmur.db"
    wal = tmp_path / "murmur.db-wal"
    for created in (path, wal):
        created.touch()
        created.chmod(0o644)  # as every earlier version created them
    db = Database(f"sqlite:///{path}")
    try:
        # Checked before the first connection: SQLite removes the -wal file on its last close.
        assert mode(path) == 0o600
        assert mode(wal) == 0o600
        db.ping()
    finally:
        db.dispose()
    assert mode(path) == 0o600


def test_audio_directory_and_files_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    store = LocalAudioStore(tmp_path / "deep" / "audio")
    assert mode(tmp_path / "deep") == 0o700
    assert mode(store.root) == 0o700
    assert mode(store.root / ".staging") == 0o700
    store.copy_in(io.BytesIO(b"RIFF...."), "k.audio")
    assert mode(store.root / "k.audio") == 0o600


def test_an_existing_readable_audio_directory_is_tightened(tmp_path: Path, umask_022: None) -> None:
    root = tmp_path / "audio"
    (root / ".staging").mkdir(parents=True)
    root.chmod(0o755)
    LocalAudioStore(root)
    assert mode(root) == 0o700 and mode(root / ".staging") == 0o700


def test_uploaded_audio_is_owner_only(client: Any, settings: Settings, umask_022: None) -> None:
    response = client.post(
        "/v1/jobs",
        data={"file": (io.BytesIO((FIXTURES / "speech-short.wav").read_bytes()), "a.wav")},
        headers=auth(),
        content_type="multipart/form-data",
    )
    assert response.status_code == 202
    stored = list(Path(settings.storage_path).glob("*.audio"))
    assert len(stored) == 1 and mode(stored[0]) == 0o600
    assert mode(Path(settings.storage_path)) == 0o700


@pytest.fixture()
def dev_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    var = tmp_path / "var"
    monkeypatch.setattr(stack, "VAR", var)
    monkeypatch.setattr(stack, "SECRETS_FILE", var / "dev-secrets.env")
    for name in ("MURMUR_API_TOKEN", "MURMUR_SIGNING_KEY", "MURMUR_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"{name}_FILE", raising=False)
    monkeypatch.delenv("MURMUR_ADMIN_TOKEN", raising=False)
    return var


def test_dev_secrets_file_is_owner_only(dev_var: Path, umask_022: None) -> None:
    env = stack.dev_environment()
    secrets_file = dev_var / "dev-secrets.env"
    assert mode(dev_var) == 0o700
    assert mode(secrets_file) == 0o600
    assert f"MURMUR_API_TOKEN={env['MURMUR_API_TOKEN']}\n" in secrets_file.read_text()


def test_an_existing_readable_secrets_file_is_tightened(dev_var: Path, umask_022: None) -> None:
    dev_var.mkdir()
    secrets_file = dev_var / "dev-secrets.env"
    # Every secret already there: nothing is generated, so nothing is rewritten.
    secrets_file.write_text("".join(f"{name}={'t' * 40}\n" for name in stack._DEV_SECRETS))
    secrets_file.chmod(0o644)
    assert stack.dev_environment()["MURMUR_API_TOKEN"] == "t" * 40
    assert mode(secrets_file) == 0o600


def test_make_up_prints_a_generated_token_and_where_it_is_kept(dev_var: Path) -> None:
    env = stack.dev_environment()
    token = env["MURMUR_API_TOKEN"]
    lines = stack.api_token_notice(env, os.environ, "http://127.0.0.1:8000")
    assert token in lines[0]
    assert str(dev_var / "dev-secrets.env") in lines[0]


@pytest.mark.parametrize("how", ["value", "file"])
def test_make_up_never_prints_a_token_the_operator_supplied(
    dev_var: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str
) -> None:
    supplied = "operator-token-" + "z" * 32
    # Two tokens, as MURMUR_API_TOKEN allows: the hint uses the first.
    if how == "value":
        monkeypatch.setenv("MURMUR_API_TOKEN", f"{supplied},second-" + "y" * 32)
    else:
        token_file = tmp_path / "token"
        token_file.write_text(f"{supplied}, second-{'y' * 32}\n")
        monkeypatch.setenv("MURMUR_API_TOKEN_FILE", str(token_file))
    env = stack.dev_environment()
    lines = stack.api_token_notice(env, os.environ, "http://127.0.0.1:8000")
    printed = "\n".join(lines)
    assert supplied not in printed
    assert "the one you supplied" in printed
    # The curl hint works as printed, in the operator's shell, wherever the token came from.
    header = lines[1].split('-H "', 1)[1].split('" -F', 1)[0]
    shown = subprocess.run(
        ["bash", "-c", f'printf %s "{header}"'], env=os.environ, capture_output=True, text=True
    )
    assert shown.stdout == f"Authorization: Bearer {supplied}", shown.stderr
    # Nothing was generated for it either.
    secrets_file = dev_var / "dev-secrets.env"
    assert "MURMUR_API_TOKEN=" not in (secrets_file.read_text() if secrets_file.exists() else "")


def test_stack_logs_are_owner_only(tmp_path: Path, umask_022: None) -> None:
    logs = tmp_path / "var" / "logs"
    supervisor = stack.Stack(dict(os.environ), echo=(), logs=logs)
    supervisor.start("api", [sys.executable, "-c", "print('hello')"])
    try:
        deadline = time.monotonic() + 10
        log = logs / "api.log"
        while time.monotonic() < deadline and "hello" not in (
            log.read_text() if log.exists() else ""
        ):
            time.sleep(0.05)
        assert "hello" in log.read_text()
    finally:
        supervisor.stop()
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
