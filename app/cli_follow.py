"""`murmur submit --follow` and `murmur follow JOB`: a job's event stream on a terminal.

Segments are printed as they arrive (`[start → end] text`, the speaker first when there is one)
and a progress bar on stderr follows the job's real progress with its ETA. A dropped connection
is resumed from the last event seen (Last-Event-ID), so nothing is printed twice; a redelivered
job's restart is said on stderr. The command ends with the job: its JSON when it succeeded,
else an error line (exit status 1).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import requests
from tqdm import tqdm

from app.cli_client import ApiClient, CliError

# Consecutive failed reconnections before giving up, and the pause between them.
RECONNECTS = 5
RECONNECT_PAUSE_SECONDS = 1.0
# A stream is silent at most one heartbeat (15 s by default) between events.
READ_TIMEOUT_SECONDS = 60.0


def _clock(seconds: float) -> str:
    minutes, rest = divmod(max(0.0, seconds), 60)
    return f"{int(minutes):02d}:{rest:04.1f}"


def segment_line(segment: dict[str, Any]) -> str:
    """One segment as `--follow` prints it."""
    speaker = f"{segment['speaker']}: " if segment.get("speaker") else ""
    span = f"[{_clock(segment['start'])} → {_clock(segment['end'])}]"
    return f"{span} {speaker}{str(segment.get('text', '')).strip()}"


def parse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """{"id", "event", "data"} per event of a text/event-stream; comments and `retry:` are
    skipped."""
    event: dict[str, str] = {}
    for line in lines:
        if line == "":
            if "data" in event:
                yield {**event, "data": json.loads(event["data"])}
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


class _Follower:
    """One job followed to its end, across reconnections."""

    def __init__(self, client: ApiClient, job_id: str, bar: tqdm, print_segments: bool) -> None:
        self.client = client
        self.job_id = job_id
        self.bar = bar
        self.print_segments = print_segments
        self.last_id: str | None = None

    def _open(self) -> requests.Response:
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        return self.client.request(
            "GET",
            f"/v1/jobs/{self.job_id}/events",
            headers=headers,
            stream=True,
            timeout=(5, READ_TIMEOUT_SECONDS),
        )

    def _show(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind, data = event.get("event"), event["data"]
        if kind == "status":
            self.bar.set_description_str(f"{self.job_id} {data['status']}")
        elif kind == "progress":
            total = float(data.get("total_seconds") or 0.0) or 1.0
            done = min(float(data.get("done_seconds") or 0.0), total)
            self.bar.total, self.bar.n = total, done
            eta = data.get("eta_seconds")
            audio = f"{done:.0f}/{total:.0f} s audio"
            self.bar.set_postfix_str(audio + (f", eta {eta:.0f} s" if eta is not None else ""))
        elif kind == "attempt" and data.get("superseded"):
            self.bar.write(
                f"(the job restarted on another worker, attempt {data['attempt']}: "
                "its segments start again)",
                file=sys.stderr,
            )
        elif kind == "segment" and self.print_segments:
            self.bar.write(segment_line(data), file=sys.stdout)
        elif kind == "error":
            raise CliError(f"the event stream failed: {data['error']['message']}")
        elif kind == "done":
            if data.get("status") == "succeeded":
                self.bar.n = self.bar.total
                self.bar.set_postfix_str("done")
            return dict(data)
        return None

    def run(self, deadline: float) -> dict[str, Any]:
        failures = 0
        while True:
            try:
                with self._open() as response:
                    if response.status_code == 204:  # `done` was seen before a drop
                        return dict(self.client.json("GET", f"/v1/jobs/{self.job_id}"))
                    lines = response.iter_lines(decode_unicode=True)
                    for event in parse_events(lines):
                        failures = 0
                        self.last_id = event.get("id", self.last_id)
                        done = self._show(event)
                        if done is not None:
                            return done
                        if time.monotonic() > deadline:
                            raise CliError(_still_running(self.job_id))
            except (requests.RequestException, CliError) as exc:
                if isinstance(exc, CliError) and not _retryable(exc):
                    raise
                failures += 1
                if failures > RECONNECTS or time.monotonic() > deadline:
                    raise CliError(_still_running(self.job_id)) from None
                time.sleep(RECONNECT_PAUSE_SECONDS)


def _retryable(exc: CliError) -> bool:
    text = str(exc.message)
    return "did not answer in time" in text or "cannot reach the API" in text


def _still_running(job_id: str) -> str:
    return (
        f"stopped following job {job_id}; it goes on: `murmur follow {job_id}` picks it up, "
        f"`murmur transcript {job_id}` once it has succeeded"
    )


def follow(
    client: ApiClient,
    job_id: str,
    *,
    timeout: float,
    progress: bool | None,
    print_segments: bool = True,
) -> dict[str, Any]:
    """Follow the job's events until it ends (or `timeout` seconds pass); the ended job."""
    disable = None if progress is None else not progress
    fmt = "{desc} {percentage:3.0f}%|{bar}| {postfix}"
    with tqdm(file=sys.stderr, disable=disable, desc=job_id, total=1.0, bar_format=fmt) as bar:
        return _Follower(client, job_id, bar, print_segments).run(time.monotonic() + timeout)
