"""Running Alembic migrations from code (`murmur db upgrade`, tests, `make demo`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

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
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    if head is None:  # pragma: no cover - migrations/ always has revisions
        raise RuntimeError("migrations/ has no head revision")
    return head
