"""Listing jobs reads an index in order: no sort, no scan of the table, on both databases.

The statement checked is the one the API runs (`app.jobs.service.list_query`), after ANALYZE
for every order and filter the API offers: all of an owner's jobs or one status, the first page
or one after a cursor (see `_plan` for how PostgreSQL's planner is asked).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert

from app.db import Database
from app.jobs.service import list_query
from app.models import Job, JobStatus

OWNERS = ("owner-a", "owner-b", "owner-c")
STATUSES = [s.value for s in JobStatus]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _fill(db: Database, n: int) -> None:
    rows = [
        {
            "id": f"job_{i:032x}",
            "owner": OWNERS[i % len(OWNERS)],
            "status": STATUSES[i % len(STATUSES)],
            "source": "upload",
            "created_at": T0 + timedelta(seconds=i),
            "updated_at": T0 + timedelta(seconds=i),
            "attempts": 0,
            "word_timestamps": False,
            "webhook_attempts": 0,
        }
        for i in range(n)
    ]
    with db.session() as s:
        s.execute(insert(Job), rows)


def _plan(db: Database, statement: Any, *, by_cost: bool) -> tuple[list[str], str]:
    """(node descriptions, the whole plan as text) of `statement` on this database.

    Without `by_cost`, PostgreSQL may not read the table whole (no sequential or bitmap scan):
    a plan then has a Sort only if no index can give the order. A few hundred matching rows
    are cheaper to sort than to read in index order, and millions are not; this checks the
    index serves the order whatever the table holds."""
    compiled = statement.compile(dialect=db.engine.dialect)
    with db.engine.begin() as conn:
        if db.engine.dialect.name == "postgresql":
            if not by_cost:
                conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
                conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            (plan,) = conn.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + compiled.string, compiled.params
            ).one()
            plan = plan if isinstance(plan, list) else json.loads(plan)
            nodes: list[str] = []

            def walk(node: dict[str, Any]) -> None:
                nodes.append(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
                for child in node.get("Plans", []):
                    walk(child)

            walk(plan[0]["Plan"])
            return nodes, json.dumps(plan)
        params = tuple(compiled.params[k] for k in compiled.positiontup or ())
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled.string, params).all()
        details = [str(row[-1]) for row in rows]
        return details, "\n".join(details)


def test_every_listing_order_is_served_by_an_index_without_a_sort(database_url: str) -> None:
    db = Database(database_url)
    try:
        _fill(db, 6000)
        with db.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE jobs" if "postgresql" in database_url else "ANALYZE")
        cursor = (T0 + timedelta(seconds=3000), f"job_{3000:032x}")
        for status in (None, JobStatus.SUCCEEDED.value, JobStatus.QUEUED.value):
            for after in (None, cursor):
                # The first page of all jobs, the listing most clients read, by cost as well.
                by_cost = status is None and after is None
                nodes, text = _plan(db, list_query("owner-b", status, 101, after), by_cost=by_cost)
                expected = "ix_jobs_owner_status_created" if status else "ix_jobs_owner_created"
                assert expected in text, (status, after, text)
                if db.engine.dialect.name == "postgresql":
                    assert not any("Sort" in n for n in nodes), (status, after, nodes)
                    assert not any(n.startswith("Seq Scan") for n in nodes), (status, after, nodes)
                else:
                    assert "TEMP B-TREE" not in text, (status, after, text)
                    assert not any(d.startswith("SCAN jobs") and "INDEX" not in d for d in nodes)
        # And the pages it reads are the right ones: newest first, the cursor excluded.
        with db.reader() as s:
            page = list(s.execute(list_query("owner-b", None, 3, cursor)).scalars())
        assert [j.id for j in page] == [f"job_{i:032x}" for i in (2998, 2995, 2992)]
    finally:
        db.dispose()


def test_the_migration_keeps_old_transcripts_and_their_text(tmp_path: Any) -> None:
    """A SQLite database of the previous schema: its table is rebuilt with the transcript
    last, nothing is lost, and an old job's text is read from its transcript."""
    from sqlalchemy import text

    from app.jobs.service import get_job, get_transcript
    from app.migrate import upgrade

    url = f"sqlite:///{tmp_path}/old.db"
    upgrade(url, "0005_audio_expiry")
    db = Database(url)
    transcript = {"text": " from before", "segments": [{"start": 0, "end": 1, "text": "x"}]}
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, status, owner, source, word_timestamps, attempts,"
                " webhook_attempts, transcript, created_at, updated_at) VALUES ('job_old',"
                " 'succeeded', 'o', 'upload', 0, 1, 0, :t, '2026-01-01 00:00:00.000000',"
                " '2026-01-01 00:00:00.000000')"
            ),
            {"t": json.dumps(transcript)},
        )
    db.dispose()
    upgrade(url)
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            columns = [row[1] for row in conn.exec_driver_sql("PRAGMA table_info(jobs)")]
        # Every later migration keeps them last too (0007 and 0008 say why).
        assert columns[-2:] == ["transcript_text", "transcript"]
        assert get_transcript(db, "job_old") == transcript
        assert get_job(db, "job_old").transcript_text == " from before"
    finally:
        db.dispose()


def test_a_listing_reads_no_transcript_and_a_poll_only_its_text(client: Any, db: Database) -> None:
    """The listing leaves the text out, a poll shows it, and only the transcript endpoint
    serves the transcript; none of the first two loads the transcript column."""
    from sqlalchemy import event

    from tests.conftest import auth
    from tests.test_hostile_input import running_job
    from tests.test_worker_endpoints import call

    worker, job_id = running_job(client, db)
    words = [{"word": " hi", "start": 0.0, "end": 0.5}]
    transcript = {
        "text": " hi",
        "segments": [{"start": 0, "end": 1, "text": " hi", "words": words}],
    }
    body = {"transcript": transcript, "processing_seconds": 1.0}
    assert call(client, worker, f"/jobs/{job_id}/result", body).get_json() == {"stored": True}

    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    def reads_transcript() -> bool:
        return any(re.search(r"jobs\.transcript\b(?!_)", s) for s in statements)

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        listed = client.get("/v1/jobs", headers=auth()).get_json()["data"]
        polled = client.get(f"/v1/jobs/{job_id}", headers=auth()).get_json()
        assert statements and not reads_transcript(), statements
        served = client.get(f"/v1/jobs/{job_id}/transcript?format=verbose_json", headers=auth())
        assert reads_transcript()  # the one request that does
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert [j["id"] for j in listed] == [job_id] and "text" not in listed[0]
    assert polled["status"] == "succeeded" and polled["text"] == " hi"
    assert served.status_code == 200 and served.get_json()["segments"][0]["text"] == " hi"
