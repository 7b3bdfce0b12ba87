"""Alembic environment: migrates the database named by Murmur's own settings."""

from __future__ import annotations

from alembic import context

import app.models  # noqa: F401  (registers the tables on Base.metadata)
from app.config import load_settings
from app.db import Base, Timeouts, make_engine

config = context.config


def _url() -> str:
    return config.attributes.get("url") or load_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # No statement timeout: a migration may build an index on a big table.
    engine = make_engine(_url(), Timeouts(statement=None))
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
