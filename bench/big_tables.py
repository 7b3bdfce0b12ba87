"""Benchmark of the API and the reconcile over a big jobs table, on SQLite and PostgreSQL.

Builds a jobs table of 100,000 rows (1 % of them succeeded with a 4 MB transcript; half the
rows are the bench client's, the rest spread over 999 other owners; some queued, dispatched
and running) with the migrations and bulk inserts, then measures through the real Flask app
(its test client) and the real snapshot reader:

- the first page of `GET /v1/jobs?limit=100` (also with `status=`, and a page 50 pages
  deep by cursor): p95 <= 50 ms;
- `GET /v1/jobs/<id>` of random jobs of the client (and of the big-transcript jobs alone):
  p95 <= 20 ms;
- `read_snapshot` (what a reconcile reads): p95 <= 50 ms.

The baseline is the same run over a 1,000-job table: a ratio near 1 means the cost does not
grow with the table. It also checks the listing's plan (EXPLAIN: an index, no sort) and that
the transcript endpoint still serves a big transcript.

Run:   .venv/bin/python bench/big_tables.py [--database sqlite|postgresql|both] [--jobs N]
Smoke: .venv/bin/python bench/big_tables.py --smoke   (2,000 jobs; fails on a wrong plan or
       a broken path, never on time)
PostgreSQL: MURMUR_BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres;
a database of its own is created and dropped). Redis: MURMUR_BENCH_REDIS_URL (default
redis://127.0.0.1:6379/14; the snapshot reads queue depths there).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.auth import token_fingerprint  # noqa: E402
from app.config import load_settings  # noqa: E402
from app.db import Database  # noqa: E402
from app.migrate import upgrade  # noqa: E402

POSTGRES_URL = os.environ.get(
    "MURMUR_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("MURMUR_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
TOKEN = "bench-big-tables-token-" + "t" * 32
OWNER = token_fingerprint(TOKEN)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TRANSCRIPT_BYTES = 4 * 1024 * 1024
TARGETS_MS = {"list": 50.0, "get": 20.0, "snapshot": 50.0}
COLUMNS = (
    "id",
    "status",
    "profile",
    "owner",
    "source",
    "audio_key",
    "filename",
    "size_bytes",
    "duration_seconds",
    "language",
    "word_timestamps",
    "webhook_attempts",
    "attempts",
    "transcript",
    "transcript_text",
    "processing_seconds",
    "created_at",
    "updated_at",
    "dispatched_at",
    "finished_at",
)


def big_transcript() -> tuple[str, str]:
    """A transcript of about 4 MB as stored (JSON text), and its text: four hours of speech
    with word timestamps, as faster-whisper returns them."""
    rng = random.Random(7)
    vocabulary = [
        "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "meeting", "budget",
        "quarter", "roadmap", "customer", "deploy", "latency", "thanks", "question", "next",
    ]  # fmt: skip
    segments, texts, size, t = [], [], 0, 0.0
    while size < TRANSCRIPT_BYTES:
        words = [rng.choice(vocabulary) for _ in range(12)]
        text = " " + " ".join(words)
        seg_words = []
        for w in words:
            seg_words.append({"word": " " + w, "start": round(t, 2), "end": round(t + 0.3, 2)})
            t += 0.35
        segment = {"start": seg_words[0]["start"], "end": round(t, 2), "text": text}
        segment |= {"avg_logprob": -0.21, "words": seg_words}
        segments.append(segment)
        texts.append(text)
        size += len(json.dumps(segment))
    full_text = "".join(texts)
    doc = {"text": full_text, "language": "en", "duration": round(t, 2), "segments": segments}
    return json.dumps(doc), full_text


def rows(n: int, transcript: tuple[str, str]) -> Iterator[tuple[Any, ...]]:
    """The table's rows, oldest first: half the bench client's, 1 % with a big transcript."""
    rng = random.Random(n)
    big_json, big_text = transcript
    small_json = json.dumps({"text": " hello", "language": "en", "segments": []})
    for i in range(n):
        created = NOW - timedelta(seconds=(n - i) * 7)
        owner = OWNER if i % 2 == 0 else f"{i % 999:064x}"
        if i % 100 == 50:
            status, body, text = "succeeded", big_json, big_text
        elif n - i <= 200 and i % 10 == 1:  # recent and unfinished
            status, body, text = rng.choice(["queued", "dispatched", "running"]), None, None
        elif i % 9 == 3:
            status, body, text = "failed", None, None
        else:
            status, body, text = "succeeded", small_json, " hello"
        finished = None if body is None and status != "failed" else created + timedelta(seconds=5)
        yield (
            f"job_{uuid.UUID(int=rng.getrandbits(128)).hex}",
            status,
            "local-cpu",
            owner,
            "upload",
            f"{i:08d}.audio" if status in ("queued", "dispatched", "running") else None,
            "talk.wav",
            1_000_000,
            60.0,
            "en",
            body is big_json,  # its words were asked for: the download serves them
            0,
            1 if status != "queued" else 0,
            body,
            text,
            2.5 if status == "succeeded" else None,
            created,
            created,
            created if status != "queued" else None,
            finished,
        )


def _fill_sqlite(url: str, n: int, transcript: tuple[str, str]) -> None:
    import sqlite3

    path = url.split("///", 1)[1]
    conn = sqlite3.connect(path)
    placeholders = ", ".join("?" for _ in COLUMNS)
    sql = f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({placeholders})"

    def as_sqlite(row: tuple[Any, ...]) -> tuple[Any, ...]:
        # The text SQLAlchemy's DateTime writes on SQLite: naive UTC, microseconds.
        return tuple(
            v.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
            if isinstance(v, datetime)
            else v
            for v in row
        )

    with conn:
        conn.executemany(sql, (as_sqlite(r) for r in rows(n, transcript)))
        conn.execute("ANALYZE")
    conn.close()


def _fill_postgresql(url: str, n: int, transcript: tuple[str, str]) -> None:
    import psycopg

    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        with conn.cursor().copy(f"COPY jobs ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in rows(n, transcript):
                copy.write_row(row)
        conn.execute("ANALYZE jobs")


@contextmanager
def database(kind: str, n: int, transcript: tuple[str, str], tmp: Path) -> Iterator[str]:
    """A migrated database holding `n` jobs; its URL. Removed afterwards."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp}/big-{n}.db"
        upgrade(url)
        _fill_sqlite(url, n, transcript)
        try:
            yield url
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{tmp}/big-{n}.db{suffix}").unlink(missing_ok=True)
        return
    import psycopg

    name = f"murmur_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{POSTGRES_URL.rsplit('/', 1)[0]}/{name}"
    try:
        upgrade(url)
        _fill_postgresql(url, n, transcript)
        yield url
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[-1] if len(samples) > 1 else samples[0]


def timed(call: Callable[[], Any], count: int) -> tuple[float, float]:
    """p95 of the wall-clock milliseconds of `call`, and of the CPU milliseconds this thread
    spent in it: on a shared machine the wall clock includes waiting for a CPU, the second
    does not (PostgreSQL's own work is in its server process, not counted there)."""
    wall, cpu = [], []
    for _ in range(count):
        start, start_cpu = time.perf_counter(), time.thread_time()
        call()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
    return p95(wall), p95(cpu)


class NoInstances:
    name = "local"

    def list_by_tag(self, scopes: frozenset[str]) -> list[object]:
        return []


def plan_problems(db: Database) -> list[str]:
    """What is wrong with the listing's plans: no index, a sort, a table scan."""
    from app.jobs.service import list_query

    problems = []
    for status in (None, "succeeded"):
        statement = list_query(OWNER, status, 101, None)
        compiled = statement.compile(dialect=db.engine.dialect)
        with db.engine.connect() as conn:
            if db.engine.dialect.name == "postgresql":
                (plan,) = conn.exec_driver_sql(
                    "EXPLAIN (FORMAT JSON) " + compiled.string, compiled.params
                ).one()
                text = json.dumps(plan)
                if '"Sort"' in text or "Seq Scan" in text or "Index" not in text:
                    problems.append(f"status={status}: {text}")
            else:
                params = tuple(compiled.params[k] for k in compiled.positiontup or ())
                found = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled.string, params)
                text = " | ".join(str(r[-1]) for r in found)
                if "TEMP B-TREE" in text or "INDEX" not in text:
                    problems.append(f"status={status}: {text}")
    return problems


def measure(
    url: str, samples: int, check_plans: bool, tmp: Path
) -> tuple[dict[str, float], list[str]]:
    """p95 milliseconds (wall clock, CPU) of each measured read, and the problems found."""
    import redis as redis_lib

    from app import create_app
    from app.fleet.providers import ProviderRegistry
    from app.fleet.snapshot import read_snapshot
    from app.services import build_services

    redis_lib.Redis.from_url(REDIS_URL).flushdb()
    env = {
        "MURMUR_DATABASE_URL": url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": str(tmp / "audio"),
        "MURMUR_API_TOKEN": TOKEN,
        "MURMUR_SIGNING_KEY": "bench-signing-key-" + "k" * 32,
    }
    settings = load_settings(env=env)
    app = create_app(settings)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    problems: list[str] = []
    db: Database = app.extensions["murmur"].db
    if check_plans:  # a table of a few hundred rows is rightly read whole and sorted
        problems += plan_problems(db)

    def get(path: str) -> Any:
        response = client.get(path, headers=headers)
        if response.status_code != 200:
            problems.append(f"GET {path}: {response.status_code}")
        return response

    first = get("/v1/jobs?limit=100").get_json()
    if len(first["data"]) != 100 or any("text" in j for j in first["data"]):
        problems.append("the first page is not 100 jobs without their text")
    # The cursor of page 50, or of the last page a small table has.
    cursor, pages = first["next_cursor"], 1
    while cursor is not None and pages < 50:
        page = get(f"/v1/jobs?limit=100&cursor={cursor}").get_json()
        if page["next_cursor"] is None:
            break
        cursor, pages = page["next_cursor"], pages + 1
    from sqlalchemy import func, select

    from app.models import Job

    with db.reader() as s:
        mine = list(s.scalars(select(Job.id).where(Job.owner == OWNER)))
        big = list(
            s.scalars(
                select(Job.id)
                .where(Job.owner == OWNER, func.length(Job.transcript_text) > 100_000)
                .limit(20)
            )
        )
    rng = random.Random(1)
    big_one = big[0] if big else mine[0]
    transcript = get(f"/v1/jobs/{big_one}/transcript?format=verbose_json")
    if big and len(transcript.get_data()) < TRANSCRIPT_BYTES // 2:
        problems.append("the transcript endpoint did not serve the big transcript")
    # That request parsed and wrote megabytes of JSON: collect its garbage now, or the
    # collector's full pass lands in (and is charged to) the first timed listing.
    del transcript
    gc.collect()

    figures = {
        "list": timed(lambda: get("/v1/jobs?limit=100"), samples),
        "list_status": timed(lambda: get("/v1/jobs?status=succeeded&limit=100"), samples),
        "list_deep": timed(lambda: get(f"/v1/jobs?limit=100&cursor={cursor or ''}"), samples),
        "get": timed(lambda: get(f"/v1/jobs/{rng.choice(mine)}"), samples * 2),
        "get_big": timed(lambda: get(f"/v1/jobs/{rng.choice(big or mine)}"), samples),
    }
    svc = build_services(
        settings,
        app.extensions["murmur"].celery,
        db=db,
        providers=ProviderRegistry(settings, {"local": NoInstances()}),  # type: ignore[dict-item]
    )
    figures["snapshot"] = timed(lambda: read_snapshot(svc, NOW), samples)
    snapshot = read_snapshot(svc, NOW)
    if snapshot.state.queued == 0:
        problems.append("the snapshot saw no queued job")
    db.dispose()
    return figures, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2,000 jobs; plans and paths only")
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=200, help="requests per figure")
    args = parser.parse_args()
    n = 2_000 if args.smoke else args.jobs
    baseline_n = 200 if args.smoke else 1_000
    samples = 20 if args.smoke else args.samples
    kinds = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    transcript = big_transcript()
    print(f"jobs table: {n:,} rows, 1 % with a {len(transcript[0]) / 1e6:.1f} MB transcript")
    failed = False
    workdir = tempfile.TemporaryDirectory(prefix="murmur-big-tables-")
    tmp = Path(workdir.name)
    names = {
        "list": "GET /v1/jobs?limit=100",
        "list_status": "  ... &status=succeeded",
        "list_deep": "  ... 50 pages deep (cursor)",  # the last page of a smaller table
        "get": "GET /v1/jobs/<id>",
        "get_big": "  ... of a 4 MB-transcript job",
        "snapshot": "read_snapshot (reconcile)",
    }
    for kind in kinds:
        results = {}
        for size in (baseline_n, n):
            start = time.monotonic()
            with database(kind, size, transcript, tmp) as url:
                built = time.monotonic() - start
                figures, problems = measure(url, samples, size == n, tmp)
            results[size] = figures
            print(f"{kind}: {size:,} jobs built in {built:.1f} s")
            for problem in problems:
                failed = True
                print(f"  PROBLEM: {problem[:600]}")
        print(f"\n{kind}: p95 ms over {samples} requests ({n:,} jobs vs {baseline_n:,})")
        print(
            f"{'':34} {'ms':>7} {'baseline':>8} {'ratio':>6} {'CPU ms':>7} {'baseline':>8}"
            f" {'target':>7}"
        )
        for key, label in names.items():
            (ms, cpu), (base, base_cpu) = results[n][key], results[baseline_n][key]
            target = TARGETS_MS.get(key.split("_")[0])
            verdict = "" if target is None else ("met" if ms <= target else "NOT met")
            limit = f"{target:.0f}" if target else ""
            print(
                f"{label:34} {ms:7.2f} {base:8.2f} {ms / base:6.2f} {cpu:7.2f} {base_cpu:8.2f}"
                f" {limit:>4} {verdict}"
            )
        print()
    workdir.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
