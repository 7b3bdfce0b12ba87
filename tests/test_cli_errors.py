"""`murmur` commands meet a database, broker or API they cannot use with one line on stderr
and a non-zero exit, never a traceback or a silent `-`."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.migrate import upgrade
from tests.conftest import API_TOKEN, REDIS_URL, SIGNING_KEY, free_port

CONFIG = str(Path(__file__).resolve().parents[1] / "config" / "local.toml")


def _one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _env(tmp_path: Path, **over: str) -> dict[str, str]:
    return {
        "MURMUR_CONFIG": CONFIG,
        "MURMUR_DATABASE_URL": f"sqlite:///{tmp_path}/murmur.db",
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": API_TOKEN,
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        **over,
    }


def test_db_upgrade_on_a_missing_postgres_database(tmp_path: Path, postgres_server: str) -> None:
    url = postgres_server.rsplit("/", 1)[0] + "/murmur_no_such_database"
    result = CliRunner().invoke(
        main, ["db", "upgrade"], env=_env(tmp_path, MURMUR_DATABASE_URL=url)
    )
    assert result.exit_code == 1
    line = _one_line_error(result.stderr)
    assert line.startswith("murmur: cannot use the database postgresql")
    assert "murmur_no_such_database" in line and "does not exist" in line


def test_db_upgrade_on_an_unreachable_database(tmp_path: Path) -> None:
    url = f"postgresql://murmur:hunter2secret@127.0.0.1:{free_port()}/murmur"
    result = CliRunner().invoke(
        main, ["db", "upgrade"], env=_env(tmp_path, MURMUR_DATABASE_URL=url)
    )
    assert result.exit_code == 1
    line = _one_line_error(result.stderr)
    assert line.startswith("murmur: cannot use the database postgresql://murmur:***@127.0.0.1")
    assert "hunter2secret" not in result.output


def test_fleet_on_an_unreachable_database(tmp_path: Path) -> None:
    url = f"postgresql://murmur:hunter2secret@127.0.0.1:{free_port()}/murmur"
    result = CliRunner().invoke(main, ["fleet"], env=_env(tmp_path, MURMUR_DATABASE_URL=url))
    assert result.exit_code == 1
    assert _one_line_error(result.stderr).startswith("murmur: cannot use the database")
    assert "hunter2secret" not in result.output


def test_db_upgrade_on_a_bad_configuration(tmp_path: Path) -> None:
    env = _env(tmp_path, MURMUR_CONFIG=str(tmp_path / "missing.toml"))
    result = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert result.exit_code == 1
    assert "missing.toml: cannot read" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["jobs"], ["submit", "samples/welcome.wav"]])
def test_client_commands_with_no_api_listening(tmp_path: Path, command: list[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    command = [str(root / c) if c.startswith("samples/") else c for c in command]
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, command, env=_env(tmp_path, MURMUR_URL=url))
    assert result.exit_code == 1
    line = _one_line_error(result.stderr)
    assert line.startswith(f"murmur: cannot reach the API at {url}")


def test_fleet_warns_and_fails_when_nothing_listens_on_the_broker(tmp_path: Path) -> None:
    env = _env(tmp_path, MURMUR_REDIS_URL=f"redis://:brokerpw@127.0.0.1:{free_port()}/0")
    upgrade(env["MURMUR_DATABASE_URL"])
    result = CliRunner().invoke(main, ["fleet"], env=env)
    assert result.exit_code == 1
    # What the database holds is still shown...
    assert "local-cpu" in result.stdout and "(no workers)" in result.stdout
    # ... with a warning naming the broker, never its password.
    line = _one_line_error(result.stderr)
    assert line.startswith("warning: cannot reach the broker at redis://127.0.0.1:")
    assert "brokerpw" not in result.output


@pytest.fixture()
def untrusted_tls_port(tmp_path: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 whose self-signed certificate no configured CA signed."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                context.wrap_socket(conn, server_side=True).close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_fleet_warns_when_the_brokers_certificate_is_not_trusted(
    tmp_path: Path, untrusted_tls_port: int
) -> None:
    env = _env(tmp_path, MURMUR_REDIS_URL=f"rediss://127.0.0.1:{untrusted_tls_port}/0")
    upgrade(env["MURMUR_DATABASE_URL"])
    result = CliRunner().invoke(main, ["fleet"], env=env)
    assert result.exit_code == 1
    line = _one_line_error(result.stderr)
    assert line.startswith(
        f"warning: cannot reach the broker at rediss://127.0.0.1:{untrusted_tls_port}"
    )
    assert "CERTIFICATE_VERIFY_FAILED" in line or "certificate verify failed" in line
