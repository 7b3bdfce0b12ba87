"""Shared fixtures: real Redis, real PostgreSQL and SQLite, settings, the API, live processes.

The one fixture stack of every test directory. Redis tests use database 15 (override with
MURMUR_TEST_REDIS_URL; each pytest-xdist worker takes the next lower one) and flush it;
PostgreSQL tests share one database of the session (of each xdist worker) on the server named
by MURMUR_TEST_POSTGRES_URL, emptied before each test. Time is a `FakeClock` where
a test steps it, injected as `Services.clock` (app/services.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import requests
from werkzeug.serving import make_server

from app import create_app
from app.config import Settings, load_settings
from app.db import Base, Database
from app.fleet.cloudinit import worker_environment
from app.migrate import upgrade
from app.models import Worker, WorkerState, utcnow

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _redis_url() -> str:
    """Database 15 (or MURMUR_TEST_REDIS_URL's), one lower for each further pytest-xdist
    worker: every worker flushes its own database, never another's."""
    base = os.environ.get("MURMUR_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under `-n`
    if not worker.startswith("gw"):
        return base
    head, _, db = base.rpartition("/")
    return f"{head}/{int(db) - int(worker[2:])}"


REDIS_URL = _redis_url()
POSTGRES_URL = os.environ.get(
    "MURMUR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)

API_TOKEN = "test-api-token-" + "a" * 32
OTHER_TOKEN = "test-api-token-" + "b" * 32
SIGNING_KEY = "test-signing-key-" + "c" * 32
WEBHOOK_SECRET = "test-webhook-secret-" + "d" * 32
ADMIN_TOKEN = "test-admin-token-" + "e" * 32


T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told: inject it as `Services.clock`."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis at {REDIS_URL} does not answer ({exc}); .ci/run starts one")
    return REDIS_URL


@pytest.fixture()
def clean_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture(scope="session")
def postgres_server() -> str:
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        pytest.fail(f"PostgreSQL at {POSTGRES_URL} does not answer ({exc}); .ci/run starts one")
    return POSTGRES_URL


# Everything a test could change in the schema of the shared database (a trigger it adds, a
# column it drops, a function it defines), read from the catalogue.
_SCHEMA_QUERY = """
SELECT 'column', table_name || '.' || column_name || ':' || data_type || ':' || is_nullable
  FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL SELECT 'index', indexname || ':' || indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL SELECT 'trigger', tgname FROM pg_trigger WHERE NOT tgisinternal
UNION ALL SELECT 'function', proname FROM pg_proc
  WHERE pronamespace = 'public'::regnamespace
UNION ALL SELECT 'constraint', conname FROM pg_constraint
  WHERE connamespace = 'public'::regnamespace
ORDER BY 1, 2
"""


class _SharedDatabase:
    """The session's PostgreSQL database: built by the migrations once, emptied before each
    test, and built again should a test have left its schema changed."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.name = f"murmur_test_{uuid.uuid4().hex[:10]}"
        self.url = f"{server.rsplit('/', 1)[0]}/{self.name}"
        self._build()
        self.schema = self._schema()

    def _admin(self, sql: str) -> None:
        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(sql)

    def _build(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.name}"')
        upgrade(self.url)

    def _schema(self) -> list[tuple[str, str]]:
        with psycopg.connect(self.url) as conn:
            return [(kind, what) for kind, what in conn.execute(_SCHEMA_QUERY).fetchall()]

    def emptied(self) -> str:
        """Every row gone, the schema (and Alembic's version) as the migrations built it.

        Connections a previous test left (a process killed mid-transaction, a pool not
        disposed) are ended first, as `DROP DATABASE ... WITH (FORCE)` would: none may hold a
        lock on a row this test needs.
        """
        tables = ", ".join(f'"{table.name}"' for table in Base.metadata.sorted_tables)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            conn.execute(f"TRUNCATE {tables}")
        if self._schema() != self.schema:
            self._build()
        return self.url

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@contextlib.contextmanager
def throwaway_database(server: str, prefix: str) -> Iterator[str]:
    """A new, empty database named `prefix_<random>` on `server` (an admin URL), dropped at
    the end even with connections left open."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_database(postgres_server: str) -> Iterator[_SharedDatabase]:
    """A database of our own on the server for the session (see `_SharedDatabase`)."""
    shared = _SharedDatabase(postgres_server)
    try:
        yield shared
    finally:
        shared.drop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using it runs on SQLite (a new file) and on PostgreSQL (the session's database,
    emptied); both schemas are built by the migrations, as production's is."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/murmur.db"
        upgrade(url)
        return url
    shared: _SharedDatabase = request.getfixturevalue("postgres_database")
    return shared.emptied()


def make_settings(database_url: str, redis_url: str, tmp_path: Path, **env: str) -> Settings:
    base = {
        "MURMUR_DATABASE_URL": database_url,
        "MURMUR_REDIS_URL": redis_url,
        "MURMUR_STORAGE_PATH": str(tmp_path / "audio"),
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MURMUR_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    base.update(env)
    return load_settings(env=base)


@pytest.fixture()
def settings(database_url: str, clean_redis: redis.Redis, tmp_path: Path) -> Settings:
    return make_settings(database_url, REDIS_URL, tmp_path)


@pytest.fixture()
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings.database_url)
    yield database
    database.dispose()


@pytest.fixture()
def client(settings: Settings, db: Database) -> Any:
    app = create_app(settings, db=db)
    return app.test_client()


def auth(token: str = API_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def add_worker(
    db: Database,
    profile: str = "local-cpu",
    instance_id: str | None = None,
    state: WorkerState = WorkerState.BOOTING,
) -> Worker:
    worker = Worker(
        profile=profile,
        provider="local",
        instance_id=instance_id or f"inst-{uuid.uuid4().hex[:12]}",
        state=state.value,
        requested_at=utcnow(),
        created_at=utcnow(),
    )
    with db.session() as s:
        s.add(worker)
    return worker


@dataclass
class LiveApi:
    url: str
    settings: Settings
    db: Database
    env: dict[str, str]


@pytest.fixture()
def live_api_env() -> dict[str, str]:
    """Extra MURMUR_* settings for live_api and its processes; a test module may override it."""
    return {}


@pytest.fixture()
def live_api(
    database_url: str, clean_redis: redis.Redis, tmp_path: Path, live_api_env: dict[str, str]
) -> Iterator[LiveApi]:
    """The API served over real HTTP on a free port, in a thread of the test process."""
    port = free_port()
    env = {
        **live_api_env,
        "MURMUR_PORT": str(port),
        "MURMUR_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }
    settings = make_settings(database_url, REDIS_URL, tmp_path, **env)
    settings = settings.model_copy(
        update={"api": settings.api.model_copy(update={"allow_private_urls": True})}
    )
    database = Database(settings.database_url)
    app = create_app(settings, db=database)
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    process_env = {
        **os.environ,
        "MURMUR_DATABASE_URL": settings.database_url,
        "MURMUR_REDIS_URL": REDIS_URL,
        "MURMUR_STORAGE_PATH": settings.storage_path,
        "MURMUR_API_TOKEN": f"{API_TOKEN},{OTHER_TOKEN}",
        "MURMUR_SIGNING_KEY": SIGNING_KEY,
        "MURMUR_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "MURMUR_ALLOW_PRIVATE_URLS": "1",
        **env,
    }
    try:
        yield LiveApi(f"http://127.0.0.1:{port}", settings, database, process_env)
    finally:
        server.shutdown()
        database.dispose()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start_process(args: list[str], env: dict[str, str], log: Path) -> Proc:
    handle = log.open("wb")
    popen = subprocess.Popen(args, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT)
    return Proc(popen, log)


@pytest.fixture()
def start_worker(live_api: LiveApi, tmp_path: Path) -> Iterator[Callable[..., tuple[Worker, Proc]]]:
    """Start a real transcription worker process (as the local provider would) for a profile."""
    procs: list[Proc] = []

    def start(profile_name: str = "local-cpu", **extra_env: str) -> tuple[Worker, Proc]:
        worker = add_worker(live_api.db, profile_name)
        profile = live_api.settings.profile(profile_name)
        env = {
            **live_api.env,
            **worker_environment(live_api.settings, profile, worker.id, worker.instance_id or ""),
        }
        env.update(extra_env)
        proc = start_process(
            [sys.executable, "-m", "gpu_worker", "run"], env, tmp_path / f"{worker.id}.log"
        )
        procs.append(proc)

        def ready() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"worker exited early:\n{proc.output()}")
            with live_api.db.session() as s:
                row = s.get(Worker, worker.id)
                return row is not None and row.state == WorkerState.READY.value

        wait_for(ready, 90, "the worker to report ready")
        # Ready is reported just before the Celery consumer starts; give it a moment.
        wait_for(lambda: "ready" in proc.output().lower(), 30, "the consumer to start")
        return worker, proc

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture()
def control_worker(live_api: LiveApi, tmp_path: Path) -> Iterator[Proc]:
    """A real Celery worker on the `control` queue (the reconcile)."""
    proc = start_process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "-Q",
            "control",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        live_api.env,
        tmp_path / "control.log",
    )
    wait_for(lambda: "ready" in proc.output(), 60, "the control worker to start")
    yield proc
    proc.stop()


@pytest.fixture()
def io_worker(live_api: LiveApi, tmp_path: Path) -> Iterator[Proc]:
    """A real Celery worker on the `io` queue (URL fetches, webhooks, retention), with the
    thread pool production runs it with (scripts/stack.py, docker/compose.yaml)."""
    proc = start_process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks",
            "worker",
            "-Q",
            "io",
            "--pool",
            "threads",
            "--concurrency",
            "4",
            "--loglevel",
            "INFO",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-n",
            "io@%h",
        ],
        live_api.env,
        tmp_path / "io.log",
    )
    wait_for(lambda: "ready" in proc.output(), 60, "the I/O worker to start")
    yield proc
    proc.stop()


def api_get(live: LiveApi, path: str, token: str = API_TOKEN, **kw: Any) -> requests.Response:
    return requests.get(live.url + path, headers=auth(token), timeout=30, **kw)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible server (moto's, tests/s3_server.py) on a loopback port, started
    once per session like Redis and PostgreSQL; it checks no signature (see that module)."""
    from tests.s3_server import start_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("s3") / "s3.log")
    yield server
    server.stop()


@pytest.fixture()
def s3_env(s3_server: Any) -> dict[str, str]:
    """MURMUR_* settings of an s3 store in a bucket of its own for this test."""
    bucket = f"murmur-{uuid.uuid4().hex[:16]}"
    s3_server.make_bucket(bucket)
    return dict(s3_server.env(bucket))


# --- test tiers ------------------------------------------------------------------------------
# `make check` is the edit-test loop: `-m "not slow"`, no subprocess stack, no real model.
# A test is `slow` when it asks for a fixture below (directly or through another fixture), lives
# in a directory below, or says so itself; new tests fall in the right tier without a list.
# With MURMUR_TEST_TIER=quick (set by `make check`), a test that was not marked and still
# starts a Python process (a Celery worker, gunicorn, the stack, a GPU worker) is skipped with
# a note to mark it: it still runs in `make test`, and the quick tier stays quick.
SLOW_FIXTURES = frozenset(
    {
        "control_worker",  # a Celery worker process
        "fake_worker",  # a stand-in worker process of the local provider (tests/fleet)
        "io_worker",  # the I/O Celery worker process
        "s3_server",  # the S3-compatible server process (moto)
        "start_worker",  # a GPU worker process, with the real model
        "ha",  # Redis primary, replica and Sentinels (tests/deploy)
        "tiny_en_dir",  # the real Whisper model's files (tests/worker)
    }
)
SLOW_DIRECTORIES = frozenset({"deploy", "whisperx"})
_TESTS = Path(__file__).resolve().parent
_SPAWNERS = ("celery", "gunicorn", "murmur", "redis-server", "redis-sentinel")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = Path(item.path).resolve().relative_to(_TESTS).parts[0]
        except ValueError:
            top = ""
        if top in SLOW_DIRECTORIES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def _stack_program(args: Any) -> str | None:
    """The program's name if `args` starts a process of the stack (Python, Celery...)."""
    argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args or [])
    if not argv:
        return None
    program = os.fsdecode(argv[0])
    name = os.path.basename(program)
    return name if program == sys.executable or name.startswith(_SPAWNERS) else None


_in_a_test = threading.Event()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _in_a_test.set()  # a test's setup, call and teardown (module fixtures included)
    try:
        yield
    finally:
        _in_a_test.clear()


def pytest_configure(config: pytest.Config) -> None:
    # For the whole process, so a module- or session-scoped fixture that starts a process is
    # caught as well (its tests are skipped with the note); only while a test runs, so
    # pytest-xdist can still start its workers.
    if os.environ.get("MURMUR_TEST_TIER") != "quick":
        return
    real_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        program = _stack_program(args) if _in_a_test.is_set() else None
        if program is not None:
            pytest.skip(
                f"starts a process ({program}): it belongs to the slow tier (`make test`); "
                "mark it @pytest.mark.slow"
            )
        real_init(self, args, *rest, **kw)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
