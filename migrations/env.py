"""Alembic environment of hedgerow: async engines (aiosqlite, asyncpg), batch mode on SQLite.

Where the database url comes from, first match wins:

1. ``config.attributes["connection"]``: an open sync connection handed over by
   :func:`hedgerow.controller.db.upgrade_connection` (migrations run on it, in its transaction);
2. ``config.attributes["url"]``: set by :func:`hedgerow.controller.db.upgrade_database`;
3. the ``HEDGEROW_DATABASE_URL`` environment variable (``alembic`` CLI from the repo root);
4. ``sqlalchemy.url`` in ``alembic.ini``.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from hedgerow.controller.db import alembic_include_name, alembic_include_object
from hedgerow.controller.models import Base

config = context.config
if config.config_file_name is not None and not config.attributes:
    fileConfig(config.config_file_name)
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("HEDGEROW_DATABASE_URL")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database url: pass one, set HEDGEROW_DATABASE_URL or sqlalchemy.url in alembic.ini")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=alembic_include_name,
        include_object=alembic_include_object(connection.dialect.name),
    )


def _run_on_connection(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the migration SQL without a database (``alembic upgrade head --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_on_connection)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    """Run the migrations on a live database (a given connection, or a new async engine)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on_connection(connection)
        return
    asyncio.run(_run_async())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
