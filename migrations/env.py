"""Alembic environment of hedgerow: async engines (aiosqlite, asyncpg), batch mode on SQLite.

Where the database url comes from, first match wins:

1. ``config.attributes["connection"]``: an open sync connection handed over by
   :func:`hedgerow.controller.store.db.migrate_engine` (``hedgerow db upgrade`` and ``hedgerow serve``),
   which holds the store's migration lock in its transaction; migrations run on it, in it;
2. ``config.attributes["url"]``: a url set by a caller of :func:`hedgerow.controller.store.db.alembic_config`;
3. the ``HEDGEROW_DATABASE_URL`` environment variable (``alembic`` CLI from the repo root);
4. ``sqlalchemy.url`` in ``alembic.ini``.

With a url (2 to 4) the migrations run the same way: one transaction that first takes the
migration lock (:func:`hedgerow.controller.store.db.lock_for_migration`), so the ``alembic`` CLI and a
starting ``serve`` never migrate one store at the same time.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from hedgerow.controller.store.db import alembic_include_name, alembic_include_object, lock_for_migration, make_engine
from hedgerow.controller.store.models import Base

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


def _run_locked(connection: Connection) -> None:
    lock_for_migration(connection)
    _run_on_connection(connection)


async def _run_async() -> None:
    engine = make_engine(_url())
    try:
        async with engine.begin() as connection:  # committed at the end, rolled back on an error
            await connection.run_sync(_run_locked)
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
