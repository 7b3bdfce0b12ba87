"""The `murmur` command: run the API, migrate, validate config; and as the API's client, submit
audio (files and URLs), wait for, fetch, cancel and purge jobs, list jobs and models.

Shell completion is Click's: `eval "$(_MURMUR_COMPLETE=bash_source murmur)"` (zsh_source,
fish_source for those shells); JOB arguments complete to your recent job ids."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem
from tqdm import tqdm

from app import cli_follow
from app.cli_client import ApiClient, CliError, MultipartUpload
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
from app.jobs.formats import FORMATS
from app.models import FINISHED_STATES, JobStatus


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


# The client commands: what the API does, from a shell (app/cli_client.py: address, token,
# errors). Every option maps to one field of POST /v1/jobs (docs/api.md).


def _complete_job_ids(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Shell completion of a JOB argument: the caller's recent job ids (nothing if the API
    does not answer within 2 s, or no token is set)."""
    try:
        client = ApiClient.from_env()
        page = client.json("GET", "/v1/jobs", params={"limit": 50}, timeout=(2, 2))
    except click.ClickException:
        return []
    return [
        CompletionItem(job["id"], help=f"{job['status']} {job.get('filename') or ''}".strip())
        for job in page.get("data", [])
        if str(job.get("id", "")).startswith(incomplete)
    ]


def _progress_bar(progress: bool | None, **kwargs: Any) -> tqdm:
    return tqdm(file=sys.stderr, disable=None if progress is None else not progress, **kwargs)


def _job_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The job's fields the options set (None: left to the API's default)."""
    fields = {name: value for name, value in options.items() if value is not None}
    for flag in ("diarize", "word_timestamps"):
        if not fields.get(flag):
            fields.pop(flag, None)
    return fields


def _create_job(
    client: ApiClient,
    source: str,
    fields: dict[str, Any],
    idempotency_key: str | None,
    progress: bool | None,
) -> dict[str, Any]:
    """POST /v1/jobs: a URL as JSON, a file as a streamed multipart upload; the job."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    if source.startswith(("http://", "https://")):
        job: dict[str, Any] = client.json(
            "POST", "/v1/jobs", json={"url": source, **fields}, headers=headers
        )
        return job
    path = Path(source)
    if not path.is_file():
        raise CliError(f"{source}: no such file (give a file, or an http:// or https:// URL)")
    form = {name: ("true" if value is True else str(value)) for name, value in fields.items()}
    total = path.stat().st_size
    with _progress_bar(progress, total=total, unit="B", unit_scale=True, desc="upload") as bar:
        body = MultipartUpload(path, form, bar.update)
        try:
            job = client.json(
                "POST",
                "/v1/jobs",
                data=body,
                headers={
                    **headers,
                    "Content-Type": body.content_type,
                    "Content-Length": str(len(body)),
                },
            )
        finally:
            body.close()
    return job


def _wait(client: ApiClient, job_id: str, timeout: float, progress: bool | None) -> dict[str, Any]:
    """Poll the job until it ends (bounded by `timeout` seconds); the ended job."""
    deadline = time.monotonic() + timeout
    with _progress_bar(progress, desc=f"{job_id} queued", bar_format="{desc} {elapsed}") as bar:
        while True:
            job: dict[str, Any] = client.json("GET", f"/v1/jobs/{job_id}", timeout=(5, 30))
            bar.set_description_str(f"{job_id} {job['status']}")
            bar.update(0)
            if job["status"] in FINISHED_STATES:
                return job
            if time.monotonic() > deadline:
                raise CliError(
                    f"job {job_id} still {job['status']} after {timeout:g} s; it goes on: "
                    f"murmur transcript {job_id} once it has succeeded"
                )
            time.sleep(0.25)


def _print_transcript(client: ApiClient, job_id: str, fmt: str) -> None:
    response = client.request(
        "GET", f"/v1/jobs/{job_id}/transcript", params={"format": fmt}, timeout=(5, 60)
    )
    click.echo(response.text.rstrip("\n"))


def _require_success(job: dict[str, Any]) -> None:
    """An ended job that did not succeed is the command's error (exit status 1)."""
    if job["status"] != JobStatus.SUCCEEDED:
        err = job.get("error") or {}
        raise CliError(f"job {job['id']} {job['status']}: {err.get('message', 'no transcript')}")


def _after_submit(
    client: ApiClient,
    job: dict[str, Any],
    *,
    wait: bool,
    fmt: str,
    timeout: float,
    progress: bool | None,
    follow: bool = False,
) -> None:
    """What `submit` shows once the job exists: the job itself; with --follow its segments as
    they come and its progress (app/cli_follow.py); with --wait its transcript at the end."""
    if follow:
        job = cli_follow.follow(
            client, job["id"], timeout=timeout, progress=progress, print_segments=not wait
        )
    elif not wait:
        click.echo(json.dumps(job, indent=2))
        return
    else:
        job = _wait(client, job["id"], timeout, progress)
    _require_success(job)
    if wait:
        _print_transcript(client, job["id"], fmt)


_FORMAT = click.Choice([f for f in FORMATS if f != "text"])


@main.command("submit")
@click.argument("source", type=click.Path(dir_okay=False, allow_dash=False))
@click.option("--wait", is_flag=True, help="Wait for the transcript and print it.")
@click.option(
    "--follow",
    is_flag=True,
    help="Print the segments as they are transcribed, with the job's progress and ETA on "
    "stderr; exit with the job's outcome (with --wait: the progress, then the transcript).",
)
@click.option(
    "--format",
    "fmt",
    default="txt",
    show_default=True,
    type=_FORMAT,
    help="The transcript's format with --wait.",
)
@click.option(
    "--task",
    type=click.Choice(["transcribe", "translate"]),
    default=None,
    help="translate: an English transcript of speech in any language (default: transcribe).",
)
@click.option("--language", default=None, help="ISO 639-1 code, e.g. en (default: detected).")
@click.option(
    "--model",
    default=None,
    help="A model `murmur models` lists (default: the first profile's that can).",
)
@click.option("--diarize", is_flag=True, help="Name the speakers (a profile that diarizes).")
@click.option("--min-speakers", type=click.IntRange(1), default=None, help="With --diarize.")
@click.option("--max-speakers", type=click.IntRange(1), default=None, help="With --diarize.")
@click.option(
    "--prompt", default=None, help="Text that precedes the audio: names, spellings, style."
)
@click.option("--words", "word_timestamps", is_flag=True, help="Ask for word timestamps.")
@click.option("--webhook-url", default=None, help="POSTed the job's summary when it ends.")
@click.option(
    "--idempotency-key", default=None, help="A retry with the same key gets the same job."
)
@click.option(
    "--timeout", default=600.0, show_default=True, help="Seconds to wait with --wait or --follow."
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bars on stderr (default: when stderr is a terminal).",
)
@one_line_errors
def submit(
    source: str,
    wait: bool,
    follow: bool,
    fmt: str,
    idempotency_key: str | None,
    timeout: float,
    progress: bool | None,
    **options: Any,
) -> None:
    """Submit SOURCE, a file or an http(s) URL, as a job (and with --wait, print its transcript).

    Without --wait it prints the job as JSON; `murmur transcript JOB` fetches the transcript
    later."""
    client = ApiClient.from_env()
    job = _create_job(client, source, _job_fields(options), idempotency_key, progress)
    _after_submit(
        client, job, wait=wait, fmt=fmt, timeout=timeout, progress=progress, follow=follow
    )


@main.command("follow")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("--timeout", default=3600.0, show_default=True, help="Seconds to follow, at most.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="The progress bar on stderr (default: when stderr is a terminal).",
)
@one_line_errors
def follow_job(job_id: str, timeout: float, progress: bool | None) -> None:
    """Print JOB's segments as they are transcribed (from the start), with its progress and
    ETA; exit with the job's outcome."""
    client = ApiClient.from_env()
    job = cli_follow.follow(client, job_id, timeout=timeout, progress=progress)
    _require_success(job)


@main.command("transcript")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@click.option("--format", "fmt", default="txt", show_default=True, type=_FORMAT)
@one_line_errors
def transcript(job_id: str, fmt: str) -> None:
    """Print the transcript of JOB (a job that succeeded)."""
    _print_transcript(ApiClient.from_env(), job_id, fmt)


@main.command("show")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@one_line_errors
def show(job_id: str) -> None:
    """Print JOB as JSON (its status, options, timings, error; its text once it succeeded)."""
    click.echo(json.dumps(ApiClient.from_env().json("GET", f"/v1/jobs/{job_id}"), indent=2))


@main.command("cancel")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@one_line_errors
def cancel(job_id: str) -> None:
    """Cancel JOB if it has not ended (a running one stops within seconds)."""
    job = ApiClient.from_env().json("DELETE", f"/v1/jobs/{job_id}")
    click.echo(f"{job['id']} {job['status']}")


@main.command("purge")
@click.argument("job_id", metavar="JOB", shell_complete=_complete_job_ids)
@one_line_errors
def purge(job_id: str) -> None:
    """Remove an ended JOB for good: its audio, its transcript and the job itself."""
    ApiClient.from_env().request("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"})
    click.echo(f"{job_id} purged")


@main.command("models")
@one_line_errors
def models() -> None:
    """List the models the API serves (what --model takes)."""
    for model in ApiClient.from_env().json("GET", "/v1/models")["data"]:
        click.echo(model["id"])


@main.command("jobs")
@click.option(
    "--status",
    type=click.Choice([s.value for s in JobStatus]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--cursor", default=None, help="The next page (printed under a full page).")
@one_line_errors
def jobs(status: str | None, limit: int, cursor: str | None) -> None:
    """List your most recent jobs, newest first, with the start of each transcript."""
    client = ApiClient.from_env()
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    if cursor:
        params["cursor"] = cursor
    page = client.json("GET", "/v1/jobs", params=params)
    click.echo(f"{'id':<37} {'status':<10} {'duration':>8}  {'created':<20} text")
    for job in page["data"]:
        duration = f"{job['duration_seconds']:.1f}s" if job["duration_seconds"] else "-"
        click.echo(
            f"{job['id']:<37} {job['status']:<10} {duration:>8}  "
            f"{(job['created_at'] or '')[:19]:<20} {_text_start(client, job)}"
        )
    if page.get("next_cursor"):
        click.echo(f"more: murmur jobs --cursor {page['next_cursor']}", err=True)


def _text_start(client: ApiClient, job: dict[str, Any], width: int = 40) -> str:
    """The first `width` characters of a succeeded job's text, on one line. A listing leaves
    the text out (a page of long transcripts would be megabytes): read from the job itself."""
    if job["status"] != JobStatus.SUCCEEDED:
        return ""
    text = job.get("text")
    if text is None:
        text = client.json("GET", f"/v1/jobs/{job['id']}", timeout=(5, 30)).get("text") or ""
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 1] + "\u2026"


def _register_domain_commands() -> None:
    from app.fleet.cli import fleet_command, smoke_command

    main.add_command(fleet_command, "fleet")
    main.add_command(smoke_command, "smoke")


_register_domain_commands()
if __name__ == "__main__":
    # `python -m app.cli` answers to the installed command's name, so its shell completion
    # variable is the same: _MURMUR_COMPLETE.
    main(prog_name="murmur")
