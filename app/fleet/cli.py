"""`murmur fleet`: print the fleet (profiles, costs, workers) straight from the database and Redis.

It reads what `/v1/fleet` reads, so it works on the control host even when the API is down,
and needs no admin token (whoever can read the config and database already sees everything).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import redis

from app.broker import redis_client
from app.cli_errors import broker_where, one_line, one_line_errors
from app.config import ConfigError, Settings, check_settings, load_settings
from app.db import Database
from app.fleet.service import fleet_overview
from app.services import utc_clock


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _eur(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(view: dict[str, Any]) -> str:
    """The overview as text: budget, profiles, held-back reasons, workers."""
    b = view["budget"]
    lines = [
        f"budget: {_eur(b['current_hourly_eur'])} EUR/h now, "
        f"{_eur(b['planned_hourly_eur'])} planned, max {_eur(b['max_hourly_eur'])}",
        f"waiting jobs: {view['waiting_jobs']} (oldest {_age(view['oldest_waiting_seconds'])})",
        "",
        f"{'PROFILE':<16} {'ON':<3} {'BACKOFF UNTIL':<20} {'WORKERS':<28} {'QUEUE':>5} "
        f"{'EUR/H NOW':>9} {'PLANNED':>8}  LAST ERROR",
    ]
    for p in view["profiles"]:
        workers = ", ".join(f"{k}={v}" for k, v in sorted(p["workers"].items())) or "-"
        held = p["backoff_until"] or (f"retry {p['retry_at']}" if p["retry_at"] else "-")
        if p.get("consecutive_failed_boots"):
            workers += f" (failed boots: {p['consecutive_failed_boots']})"
        depth = "-" if p["queue_depth"] is None else str(p["queue_depth"])
        lines.append(
            f"{p['name']:<16} {'yes' if p['enabled'] else 'no':<3} {held:<20} {workers:<28} "
            f"{depth:>5} {_eur(p['current_hourly_eur']):>9} {_eur(p['planned_hourly_eur']):>8}  "
            f"{p['last_error'] or '-'}"
        )
    plan = view["plan"]
    if plan and plan["held_back"]:
        lines += ["", "held back:"] + [f"  - {reason}" for reason in plan["held_back"]]
    lines += [
        "",
        f"{'WORKER':<38} {'PROFILE':<14} {'STATE':<9} {'AGE':>6} {'REPORT':>6} {'SEEN':>6}  "
        "TIMINGS (s after request)",
    ]
    for w in view["workers"]:
        timings = " ".join(f"{k}={v:g}" for k, v in w["timings"].items() if v is not None)
        note = f"  [{w['delete_reason']}]" if w["delete_reason"] else ""
        lines.append(
            f"{w['id']:<38} {w['profile']:<14} {w['state']:<9} {_age(w['age_seconds']):>6} "
            f"{_age(w['last_report_age_seconds']):>6} {_age(w.get('last_seen_age_seconds')):>6}  "
            f"{timings or '-'}{note}"
        )
    if not view["workers"]:
        lines.append("(no workers)")
    return "\n".join(lines)


def broker_problem(settings: Settings, client: redis.Redis) -> str | None:
    """Why the broker cannot be read (refused, wrong CA, timeout...), or None: one line."""
    try:
        client.ping()
    except redis.RedisError as exc:
        where = broker_where(settings.redis_url, settings.redis.sentinels)
        secrets = tuple(p for p in (urlsplit(settings.redis_url).password,) if p)
        return f"cannot reach the broker at {where}: {one_line(exc, secrets)}"
    return None


@click.command("fleet")
@click.option("--json", "as_json", is_flag=True, help="Print the same JSON as GET /v1/fleet.")
@one_line_errors
def fleet_command(as_json: bool) -> None:
    """Show profiles (back-off, workers, queue, costs, last error) and workers (lifecycle).

    Reads the database and the broker (Redis) of the configuration (MURMUR_CONFIG and the
    MURMUR_* variables), not the API. When the broker cannot be reached it still prints
    what the database holds, warns on stderr and exits 1: queue depths, the plan and report
    ages are then unknown (`-`).
    """
    settings = load_settings()
    db = Database(settings.database_url)
    client = redis_client(settings, socket_timeout=5, socket_connect_timeout=5)
    problem = broker_problem(settings, client)
    try:
        view = fleet_overview(settings, db, None if problem else client, utc_clock())
    finally:
        db.dispose()
    click.echo(json.dumps(view, indent=2) if as_json else render(view))
    if problem is not None:
        click.echo(
            f"warning: {problem}; queue depths, the plan and report ages are unknown (-)",
            err=True,
        )
        sys.exit(1)


# The bundled sample (a checkout of the repository; the control image has no samples/).
SMOKE_AUDIO = Path(__file__).resolve().parents[2] / "samples" / "welcome.wav"


@click.command("smoke")
@click.option("--profile", "names", multiple=True, help="Only this profile (repeatable).")
@click.option(
    "--timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds from the first request to the last transcript; then everything is deleted.",
)
@click.option(
    "--max-eur",
    type=float,
    default=5.0,
    show_default=True,
    help="Refuse to start if every worker running for the whole time limit costs more.",
)
@click.option(
    "--audio",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Audio to transcribe (default: samples/welcome.wav).",
)
@one_line_errors
def smoke_command(
    names: tuple[str, ...], timeout: float, max_eur: float, audio: Path | None
) -> None:
    """Start one worker per enabled profile, transcribe a sample, delete everything, check.

    Prints each worker's lifecycle timings and cost; exits 0 only when every profile
    transcribed and the provider shows nothing left. Ctrl-C deletes what was created.
    """
    try:
        settings = load_settings()
    except ConfigError as exc:
        click.echo("configuration problems:\n  - " + "\n  - ".join(exc.problems), err=True)
        sys.exit(1)
    problems = check_settings(settings)
    unknown = [n for n in names if n not in {p.name for p in settings.profiles}]
    problems += [f"--profile {n}: no such profile" for n in unknown]
    audio = audio or SMOKE_AUDIO
    if not audio.is_file():
        problems.append(f"--audio: {audio} does not exist")
    if problems:
        click.echo("cannot run:\n  - " + "\n  - ".join(problems), err=True)
        sys.exit(1)
    profiles = [p for p in settings.profiles if (p.name in names if names else p.enabled)]
    from app.fleet import smoke  # builds the Celery app from the config: only once it is valid

    svc = smoke.process_services(settings)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the same clean-up as Ctrl-C

    signal.signal(signal.SIGTERM, stop)
    try:
        results = smoke.run_smoke(svc, profiles, audio, timeout=timeout, max_eur=max_eur,
                                  echo=click.echo, shielded=_cleanup_shielded)  # fmt: skip
    except smoke.SmokeRefused as exc:
        click.echo(f"refused: {exc}", err=True)
        sys.exit(2)
    except smoke.SmokeInterrupted as exc:
        click.echo(smoke.render(exc.results))
        if any(r.left for r in exc.results):
            click.echo("interrupted: the provider still lists what is marked LEFT BEHIND", err=True)
        else:
            click.echo("interrupted: everything the smoke test created was deleted", err=True)
        sys.exit(130)
    finally:
        svc.db.dispose()
    click.echo(smoke.render(results))
    sys.exit(0 if all(r.ok for r in results) else 1)


@contextmanager
def _cleanup_shielded() -> Iterator[None]:
    """A Ctrl-C during cleanup is answered with a note, not obeyed: it would leave servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, frame: object) -> None:
        click.echo("cleaning up: deleting what the smoke test created (it stops by itself)")

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
