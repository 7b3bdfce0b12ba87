"""Database engine and sessions: SQLite by default, PostgreSQL (psycopg 3) in production."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    DateTime,
    Dialect,
    Engine,
    Select,
    create_engine,
    event,
    exc,
    inspect,
)
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from app.private_files import private_dir, private_file, tighten


class Base(DeclarativeBase):
    pass


def as_utc(value: datetime | None) -> datetime | None:
    """`value` as an aware UTC datetime. Murmur stores only UTC; a naive value (SQLite keeps no
    zone, and a raw SQL result bypasses the column type) is read as UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp column that is always written in UTC and always read back aware, on SQLite
    (which drops the zone) as on PostgreSQL, so no code compares naive with aware times."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value)


READ_ONLY = "murmur_read_only"


def normalise_url(url: str) -> str:
    """Use psycopg 3 for PostgreSQL URLs that name no driver."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


@dataclass(frozen=True)
class Timeouts:
    """How long the database may keep a caller waiting (app.config.DatabaseSettings).

    `statement` None: no statement timeout (migrations build indexes on big tables)."""

    connect: float = 5.0
    statement: float | None = 5.0
    busy: float = 10.0

    @property
    def answer(self) -> float | None:
        """How long the client waits for any answer of a PostgreSQL server on a connection it
        holds: past the server's own statement timeout, so a slow statement is cancelled by
        the server first and only a server that no longer answers at all is cut off here."""
        return None if self.statement is None else self.statement + 1.0


# The codes of `database_fault`: each is in app/errors.py.
DATABASE_UNAVAILABLE = "database_unavailable"
INSUFFICIENT_STORAGE = "insufficient_storage"
_SQLITE_FULL = {13}  # SQLITE_FULL: "database or disk is full"
_SQLITE_UNAVAILABLE = {5, 6, 10, 14}  # BUSY (busy timeout passed), LOCKED, IOERR, CANTOPEN


def database_fault(error: BaseException) -> str | None:
    """What a database error means to a client: `insufficient_storage` (the database's disk
    is full), `database_unavailable` (it refuses, does not answer in time, or is busy past its
    timeout), or None (a bug: the caller answers 500)."""
    if isinstance(error, exc.TimeoutError):  # no pooled connection came free in time
        return DATABASE_UNAVAILABLE
    # SQLAlchemy wraps the driver's error, except where a raw connection is opened (RowReader).
    orig = error.orig if isinstance(error, exc.DBAPIError) else error
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary in _SQLITE_FULL:
            return INSUFFICIENT_STORAGE
        return DATABASE_UNAVAILABLE if primary in _SQLITE_UNAVAILABLE else None
    try:
        import psycopg
        from psycopg import errors as pg_errors
    except ImportError:  # pragma: no cover - psycopg is in requirements/control.txt
        return None
    if isinstance(orig, pg_errors.DiskFull):
        return INSUFFICIENT_STORAGE
    if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
        return DATABASE_UNAVAILABLE
    return None


def _answer_deadline_connection(seconds: float) -> Any:
    """A psycopg connection class that stops waiting for the server after `seconds`.

    PostgreSQL's statement timeout is the server's: a server that accepts a connection and
    then never answers (a black-holed network, a hung host) would hold the caller forever,
    and TCP keepalives do not help while the peer's kernel still acknowledges. This class
    closes such a connection and raises `OperationalError`; the pool then drops it.
    """
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.connection import _WAIT_INTERVAL

    class AnswerDeadlineConnection(psycopg.Connection[Any]):
        def wait(
            self, gen: Any, interval: float = _WAIT_INTERVAL, timeout: float | None = None
        ) -> Any:
            try:
                return super().wait(gen, interval, seconds if timeout is None else timeout)
            except pg_errors._WaitTimeout:
                if timeout is not None:  # the caller's own bound: its own handling
                    raise
                self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"the database did not answer within {seconds:g} s"
                ) from None

    return AnswerDeadlineConnection


def make_engine(url: str, timeouts: Timeouts | None = None) -> Engine:
    url = normalise_url(url)
    timeouts = timeouts or Timeouts()
    # Errors must not carry bound values into logs: prompts, transcripts, URLs.
    kwargs: dict[str, Any] = {"future": True, "hide_parameters": True}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1] if "///" in url else ""  # sqlite:// is in memory
        if path and path != ":memory:" and not path.startswith("file:"):
            # Jobs hold prompts and transcripts: the file is the owner's alone (SQLite gives
            # its -wal and -shm files the same mode). A directory that exists is not ours
            # to change; one created for the database is 0700.
            parent = Path(path).parent
            if not parent.exists():
                private_dir(parent)
            private_file(path)
            for companion in ("-wal", "-shm", "-journal"):  # left by an earlier, laxer version
                tighten(Path(path + companion))
        kwargs["connect_args"] = {"timeout": timeouts.busy, "check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
        # libpq counts whole seconds, and at least 2.
        connect_args: dict[str, Any] = {"connect_timeout": max(2, math.ceil(timeouts.connect))}
        if timeouts.statement is not None:
            connect_args["options"] = f"-c statement_timeout={int(timeouts.statement * 1000)}"
            # A request waits for a pooled connection no longer than one could be freed.
            kwargs["pool_timeout"] = timeouts.connect + timeouts.statement + 1.0
        kwargs["connect_args"] = connect_args
    engine = create_engine(url, **kwargs)
    answer = timeouts.answer
    if url.startswith("postgresql+psycopg") and answer is not None:
        connection_class = _answer_deadline_connection(answer)

        @event.listens_for(engine, "do_connect")
        def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
            return connection_class.connect(*cargs, **cparams)

    if url.startswith("sqlite"):
        # API, control worker and beat share the file: WAL lets readers run beside a writer,
        # and IMMEDIATE transactions make compare-and-set updates wait instead of failing.
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(timeouts.busy * 1000)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Readers (see Database.reader) start a deferred transaction: in WAL mode they run
            # beside the writer instead of queueing for its lock.
            read_only = conn.get_execution_options().get(READ_ONLY, False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


class Database:
    """One engine and its session factory; `session()` commits on success, rolls back on error."""

    def __init__(self, url: str, timeouts: Timeouts | None = None) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(url, timeouts)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._row_readers: dict[Select[*tuple[Any, ...]], RowReader] = {}

    @contextmanager
    def session(self) -> Iterator[Session]:
        s = self._factory()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    @contextmanager
    def reader(self) -> Iterator[Session]:
        """A session for reads only: on SQLite it does not take the write lock."""
        s = self._factory()
        try:
            s.connection(execution_options={READ_ONLY: True})
            yield s
        finally:
            s.close()  # ends the transaction; loaded objects stay readable (not expired)

    def row_reader(self, statement: Select[*tuple[Any, ...]]) -> RowReader:
        """The RowReader of `statement` on this database, compiled at its first use."""
        reader = self._row_readers.get(statement)
        if reader is None:
            reader = self._row_readers[statement] = RowReader(self.engine, statement)
        return reader

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def schema_revision(self) -> str | None:
        """The Alembic revision the database's schema is at; None when it has none (a new
        file, an empty database). A database that does not answer raises, as `ping` does."""
        with self.engine.connect() as conn:
            try:
                return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
            except exc.DBAPIError:
                conn.rollback()  # PostgreSQL's transaction is aborted after the error
                if inspect(conn).has_table("alembic_version"):
                    raise  # the table is there: the error was something else (locked, down)
                return None

    def dispose(self) -> None:
        self.engine.dispose()


class RowReader:
    """One SELECT, compiled once for the engine's dialect, run on a pooled DBAPI connection.

    For the hottest reads only (every worker request authenticates with one): SQLAlchemy's
    per-execution work (result metadata, events, an explicit BEGIN on SQLite) costs more
    than the indexed lookup itself. Parameters are the statement's named `bindparam`s; the
    result is the first row as a plain tuple, in the order of the selected columns.
    """

    def __init__(self, engine: Engine, statement: Select[*tuple[Any, ...]]) -> None:
        compiled = statement.compile(dialect=engine.dialect)
        self._engine = engine
        self._sql = compiled.string
        self._order = tuple(compiled.positiontup or ()) if compiled.positional else None
        # The columns' own conversions (SQLite keeps datetimes as text, for one).
        dialect = engine.dialect
        self._convert = [
            column.type.dialect_impl(dialect).result_processor(dialect, None)
            for column in statement.selected_columns
        ]

    def first(self, **params: Any) -> tuple[Any, ...] | None:
        values: Any = params if self._order is None else tuple(params[k] for k in self._order)
        connection = self._engine.raw_connection()
        driver = connection.driver_connection
        # psycopg: one statement needs no transaction, and without one the pool's reset
        # (a ROLLBACK) is skipped. SQLite connections here are in autocommit already.
        manual = getattr(driver, "autocommit", None) is False
        try:
            if manual:
                driver.autocommit = True  # type: ignore[union-attr]
            cursor = connection.cursor()
            try:
                cursor.execute(self._sql, values)
                row = cursor.fetchone()
            finally:
                cursor.close()
        finally:
            try:
                if manual:
                    driver.autocommit = False  # type: ignore[union-attr]
            finally:
                connection.close()  # back to the pool, even from a broken connection
        if row is None:
            return None
        return tuple(
            value if convert is None else convert(value)
            for convert, value in zip(self._convert, row, strict=True)
        )


def rows_changed(session: Session, statement: Any) -> int:
    """Run an UPDATE/DELETE and return how many rows it changed (compare-and-set checks)."""
    result = session.execute(statement)
    return int(cast(CursorResult[Any], result).rowcount)
