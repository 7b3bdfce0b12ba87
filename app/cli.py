"""The `murmur` command: run the API, migrate, validate config, submit audio, list jobs."""

from __future__ import annotations

import io
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

import click
import requests
from tqdm import tqdm

from app.cli_errors import one_line_errors
from app.config import (
    ROLES,
    ConfigError,
    Settings,
    StartupRefused,
    check_settings,
    load_settings,
    storage_problems,
)
from app.models import FINISHED_STATES, JobStatus

DEFAULT_URL = "http://127.0.0.1:8000"


@click.group()
def main() -> None:
    """Murmur: self-hosted speech-to-text with an ephemeral GPU worker fleet."""


@main.command("validate-config")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML file (default: $MURMUR_CONFIG, else the embedded defaults).",
)
@click.option(
    "--role",
    type=click.Choice(ROLES),
    default="control",
    show_default=True,
    help="Which process's checks: control (the control worker: everything, provider keys "
    "included), api or beat (everything but the provider keys), worker (profiles only). "
    "Each process refuses to start on its role's problems.",
)
def validate_config(config_path: str | None, role: str) -> None:
    """Check the configuration and list every problem; exit 1 if there is any."""
    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        problems = exc.problems
    else:
        problems = check_settings(settings, role=role)
        if role in ("control", "api") and not storage_problems(settings):
            problems += _store_problems(settings)
    if problems:
        click.echo(f"configuration has {len(problems)} problem(s):", err=True)
        for problem in problems:
            click.echo(f"  - {problem}", err=True)
        sys.exit(1)
    names = ", ".join(p.name for p in settings.profiles)
    click.echo(f"configuration OK: {len(settings.profiles)} profile(s): {names}")


def _store_problems(settings: Settings) -> list[str]:
    """Whether the audio store is reachable and writable (an s3 bucket is asked over the
    network; the local directory is only looked at)."""
    if settings.storage.backend == "local":
        return []
    from app.storage import open_store

    return open_store(settings).problems()


@main.group()
def db() -> None:
    """Database schema commands."""


@db.command("upgrade")
@click.argument("revision", default="head")
@one_line_errors
def db_upgrade(revision: str) -> None:
    """Apply Alembic migrations to the configured database."""
    from app.migrate import upgrade

    settings = load_settings()
    upgrade(settings.database_url, revision)
    click.echo(f"database at {revision}")


@main.command("api")
@click.option("--workers", default=2, show_default=True, help="gunicorn worker processes")
@click.option(
    "--threads",
    default=8,
    show_default=True,
    help="threads per process, besides the api.sync_max_waiting ones for synchronous requests",
)
@one_line_errors
def api(workers: int, threads: int) -> None:
    """Serve the API under gunicorn on MURMUR_HOST:MURMUR_PORT."""
    settings = load_settings()
    # What `validate-config --role api` refuses (a short or shared token, a scaleway profile
    # without a pinned worker image...) stops the API here, not at the first job; so do wrong
    # S3 credentials or a missing bucket.
    problems = check_settings(settings, role="api")
    if not problems:
        problems = _store_problems(settings)
    if problems:
        click.echo(str(StartupRefused("API", problems, "api")), err=True)
        sys.exit(1)
    from app.migrate import configured_schema_problem

    schema = configured_schema_problem(settings.database_url)
    if schema is not None:
        click.echo(f"cannot start the API: {schema}", err=True)
        sys.exit(1)
    from app.server import gunicorn_args

    args = ["gunicorn", *gunicorn_args(settings, workers=workers, threads=threads)]
    os.execvp(args[0], args)  # noqa: S606 (replace this process with gunicorn)


def _client() -> tuple[str, dict[str, str]]:
    url = os.environ.get("MURMUR_URL", DEFAULT_URL).rstrip("/")
    token = os.environ.get("MURMUR_API_TOKEN", "").split(",")[0].strip()
    if not token:
        raise click.ClickException("set MURMUR_API_TOKEN to one of the API's tokens")
    return url, {"Authorization": f"Bearer {token}"}


def _fail_on_error(response: requests.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        if isinstance(body, dict) and "error" in body:
            err = body["error"]
            raise click.ClickException(f"{response.status_code} {err['code']}: {err['message']}")
        raise click.ClickException(f"HTTP {response.status_code}")
    return body


class _MultipartUpload:
    """A multipart body read from disk lazily, with a known length and a progress bar.

    Deliberately not an io class: requests would probe tell() and fall back to chunked encoding.
    """

    def __init__(self, path: Path, fields: dict[str, str], bar: tqdm) -> None:
        self.boundary = uuid.uuid4().hex
        head = b""
        for name, value in fields.items():
            head += (
                f'--{self.boundary}\r\nContent-Disposition: form-data; name="{name}"'
                f"\r\n\r\n{value}\r\n"
            ).encode()
        head += (
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        self._parts: list[IO[bytes]] = [
            io.BytesIO(head),
            path.open("rb"),
            io.BytesIO(f"\r\n--{self.boundary}--\r\n".encode()),
        ]
        self._length = len(head) + path.stat().st_size + len(self._parts[2].getvalue())  # type: ignore[attr-defined]
        self._bar = bar

    def __len__(self) -> int:
        return self._length

    def read(self, size: int = -1) -> bytes:
        out = b""
        while self._parts and (size < 0 or len(out) < size):
            chunk = self._parts[0].read(-1 if size < 0 else size - len(out))
            if not chunk:
                self._parts.pop(0).close()
                continue
            out += chunk
        self._bar.update(len(out))
        return out


@main.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait for the transcript and print it.")
@click.option(
    "--format",
    "fmt",
    default="txt",
    show_default=True,
    type=click.Choice(["json", "verbose_json", "txt", "srt", "vtt", "tsv"]),
)
@click.option("--language", default=None, help="ISO 639-1 code, e.g. en.")
@click.option("--words", is_flag=True, help="Ask for word timestamps.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait with --wait.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bars on stderr (default: when stderr is a terminal).",
)
@one_line_errors
def submit(
    file: Path,
    wait: bool,
    fmt: str,
    language: str | None,
    words: bool,
    timeout: float,
    progress: bool | None,
) -> None:
    """Upload FILE as a transcription job (and with --wait, print its transcript)."""
    url, headers = _client()
    fields = {"word_timestamps": "true" if words else "false"}
    if language:
        fields["language"] = language
    with tqdm(
        total=file.stat().st_size,
        unit="B",
        unit_scale=True,
        desc="upload",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    ) as bar:
        body = _MultipartUpload(file, fields, bar)
        response = requests.post(
            f"{url}/v1/jobs",
            data=body,
            timeout=(5, 600),
            headers={
                **headers,
                "Content-Type": f"multipart/form-data; boundary={body.boundary}",
                "Content-Length": str(len(body)),
            },
        )
    job = _fail_on_error(response)
    if not wait:
        click.echo(json.dumps(job, indent=2))
        return
    job = _wait(url, headers, job["id"], timeout, progress)
    if job["status"] != JobStatus.SUCCEEDED:
        err = job.get("error") or {}
        raise click.ClickException(
            f"job {job['id']} {job['status']}: {err.get('message', 'no transcript')}"
        )
    response = requests.get(
        f"{url}/v1/jobs/{job['id']}/transcript", params={"format": fmt}, headers=headers, timeout=30
    )
    if response.status_code >= 400:
        _fail_on_error(response)
    click.echo(response.text.rstrip("\n"))


def _wait(
    url: str, headers: dict[str, str], job_id: str, timeout: float, progress: bool | None
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with tqdm(
        desc=f"{job_id} queued",
        bar_format="{desc} {elapsed}",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    ) as bar:
        while True:
            job: dict[str, Any] = _fail_on_error(
                requests.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=30)
            )
            bar.set_description_str(f"{job_id} {job['status']}")
            bar.update(0)
            if job["status"] in FINISHED_STATES:
                return job
            if time.monotonic() > deadline:
                raise click.ClickException(f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(0.25)


@main.command("jobs")
@click.option("--status", default=None, help="Only jobs in this state.")
@click.option("--limit", default=20, show_default=True)
@one_line_errors
def jobs(status: str | None, limit: int) -> None:
    """List your most recent jobs."""
    url, headers = _client()
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    page = _fail_on_error(
        requests.get(f"{url}/v1/jobs", params=params, headers=headers, timeout=30)
    )
    click.echo(f"{'id':<37} {'status':<10} {'duration':>8}  {'created':<20} text")
    for job in page["data"]:
        duration = f"{job['duration_seconds']:.1f}s" if job["duration_seconds"] else "-"
        text = (job.get("text") or "")[:40]
        click.echo(
            f"{job['id']:<37} {job['status']:<10} {duration:>8}  "
            f"{(job['created_at'] or '')[:19]:<20} {text}"
        )


def _register_domain_commands() -> None:
    from app.fleet.cli import fleet_command, smoke_command

    main.add_command(fleet_command, "fleet")
    main.add_command(smoke_command, "smoke")


_register_domain_commands()
if __name__ == "__main__":
    main()
