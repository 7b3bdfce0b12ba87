"""Running Alembic migrations from code (`murmur db upgrade`, tests, `make demo`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config

if TYPE_CHECKING:
    from app.db import Database

_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(url: str) -> Config:
    cfg = Config(str(_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(_ROOT / "migrations"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The revision `upgrade(url)` brings a database to (the one head of migrations/)."""
    return _revisions()[0]


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    """migrations/' head and every revision in it, read once a process."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(""))
    head = script.get_current_head()
    if head is None:  # pragma: no cover - migrations/ always has revisions
        raise RuntimeError("migrations/ has no head revision")
    return head, frozenset(revision.revision for revision in script.walk_revisions())


def schema_problem(revision: str | None) -> str | None:
    """What stops this release serving on a database whose schema is at `revision`; None
    when nothing does.

    No schema (a new file, a database nobody migrated, a typo in a SQLite path) or an
    older one: every request would fail on a missing table or column. A revision this
    release does not know is a later release's: its migrations only add (docs/operations.md,
    "Upgrade"), so this release keeps serving on it while the new one rolls out.
    """
    head, known = _revisions()
    if revision == head or (revision is not None and revision not in known):
        return None
    if revision is None:
        return "no Murmur schema; run `murmur db upgrade`"
    return f"schema at {revision}, this release needs {head}; run `murmur db upgrade`"


def database_schema_problem(db: Database) -> str | None:
    """`schema_problem` of `db`, naming the database (without its password) for a process
    that refuses to start on it. A database that does not answer is not judged here: it
    may be starting too, and /readyz and the requests say so while it is down."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.cli_errors import database_where

    try:
        revision = db.schema_revision()
    except SQLAlchemyError:
        return None
    problem = schema_problem(revision)
    return None if problem is None else f"the database {database_where(db.url)}: {problem}"


def configured_schema_problem(url: str) -> str | None:
    """`database_schema_problem` of the database at `url`, on a connection opened for it: a
    process's check at its start, before it has a pool of its own."""
    from app.db import Database

    db = Database(url)
    try:
        return database_schema_problem(db)
    finally:
        db.dispose()
