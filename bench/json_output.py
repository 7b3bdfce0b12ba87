"""Cost of the API's finite-JSON encoder (app/json_provider.py) on GET /v1/jobs?limit=100.

Baseline in the same run: the same app and database with Flask's default JSON provider
(which would write NaN/Infinity). Requests alternate between the two so that load on the
machine hits both alike; prints both medians and their ratio. In-process (Flask test
client, a throw-away SQLite database); no network.
Run: `.venv/bin/python bench/json_output.py [--smoke]`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flask.json.provider import DefaultJSONProvider  # noqa: E402
from sqlalchemy import update  # noqa: E402

from app import create_app  # noqa: E402
from app.auth import token_fingerprint  # noqa: E402
from app.config import load_settings  # noqa: E402
from app.db import Database  # noqa: E402
from app.jobs.service import JobRequest, insert_job  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.models import Job  # noqa: E402
from app.services import utc_clock  # noqa: E402

TOKEN = "bench-token-" + "a" * 32
# `--smoke` (CI, tests/test_benches.py): the same path, a few rounds.
SMOKE = "--smoke" in sys.argv[1:]
ROUNDS = 5 if SMOKE else 300  # bounded: well under a minute in all
# Small transcripts: the listing shows only their text, and loading big ones from the
# database would hide the encoder's cost in noise.
TRANSCRIPT = {"text": "bench " * 20, "language": "en", "duration": 600.0, "segments": []}


def get(client: object, path: str) -> float:
    start = time.perf_counter()
    response = client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - start
    assert response.status_code == 200 and len(response.get_json()["data"]) == 100
    return elapsed


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="murmur-bench-json-"))
    url = f"sqlite:///{tmp}/bench.db"
    upgrade(url)
    settings = load_settings(
        env={
            "MURMUR_DATABASE_URL": url,
            "MURMUR_REDIS_URL": "redis://127.0.0.1:1/0",  # never contacted by these routes
            "MURMUR_STORAGE_PATH": str(tmp / "audio"),
            "MURMUR_API_TOKEN": TOKEN,
            "MURMUR_SIGNING_KEY": "bench-signing-key-" + "b" * 32,
        }
    )
    db = Database(url)
    owner = token_fingerprint(TOKEN)
    ids = []
    for _ in range(100):
        job, _ = insert_job(db, JobRequest(owner=owner, source="upload"), now=utc_clock())
        ids.append(job.id)
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(
                status="succeeded",
                transcript=TRANSCRIPT,
                processing_seconds=3.5,
                duration_seconds=600.0,
            )
        )
    finite = create_app(settings, db=db).test_client()
    baseline_app = create_app(settings, db=db)
    baseline_app.json = DefaultJSONProvider(baseline_app)
    baseline = baseline_app.test_client()
    path = "/v1/jobs?limit=100"
    new, base = [], []
    for _ in range(ROUNDS):
        new.append(get(finite, path))
        base.append(get(baseline, path))
    new_ms, base_ms = statistics.median(new) * 1000, statistics.median(base) * 1000
    print(
        f"GET {path}: finite {new_ms:.2f} ms, baseline {base_ms:.2f} ms, "
        f"ratio {new_ms / base_ms:.3f}"
    )
    db.dispose()


if __name__ == "__main__":
    main()
