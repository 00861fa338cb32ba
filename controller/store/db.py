"""Engines, sessions and migrations of the SQL store.

``make_engine`` builds an async engine for SQLite (``sqlite+aiosqlite:///path``) or PostgreSQL
(``postgresql+asyncpg://...``); ``upgrade_database`` / ``downgrade_database`` run the Alembic
migrations shipped inside the package (``hedgerow.migrations``), so they work from an installed
wheel as well as from a checkout.

Migrating is serialised on every store: ``hedgerow db upgrade``, ``hedgerow serve`` and the
``alembic`` CLI all migrate in one transaction that first takes the store's migration lock
(:func:`lock_for_migration`: a PostgreSQL advisory lock, or ``BEGIN EXCLUSIVE`` on SQLite), so two
processes migrating one store at once run one after the other, and a migration that fails
leaves the store at the revision it started from (SQLite and PostgreSQL both roll DDL back).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CursorResult, Result, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from hedgerow.controller.errors import StoreError, StoreNotReady

__all__ = [
    "ASYNC_DRIVERS",
    "LEASE_POOL_SIZE",
    "MIGRATION_LOCK_TIMEOUT_S",
    "SQLITE_BUSY_TIMEOUT_S",
    "SQLITE_PRAGMAS",
    "StoreEngines",
    "WriteFence",
    "alembic_config",
    "alembic_include_name",
    "alembic_include_object",
    "async_database_url",
    "check_database_url",
    "check_ready",
    "current_revision",
    "dialect_insert",
    "downgrade_database",
    "head_revision",
    "known_revisions",
    "lock_for_migration",
    "make_engine",
    "make_sessionmaker",
    "make_store_engines",
    "migrate_engine",
    "safe_url",
    "upgrade_connection",
    "upgrade_database",
]

#: How long a SQLite writer waits for the lock held by another writer before failing.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: The pragmas of every SQLite connection of the store: foreign keys enforced, WAL journaling
#: (readers and the one writer do not block each other), ``synchronous=FULL`` (a commit returns
#: once the WAL is on disk, so an answered ``POST /v1/calls`` survives a power cut, not only a
#: crash of the process; the group commit writer shares that fsync among the batches of a
#: group), and the busy timeout. ``bench/ingest.py`` gives its raw sqlite3 baseline the same.
SQLITE_PRAGMAS: tuple[str, ...] = (
    "PRAGMA foreign_keys=ON",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}",
)

#: Key of the PostgreSQL advisory lock held while migrating.
_MIGRATION_LOCK = 0x6865646765
#: The longest a migration waits for the store's migration lock (another process migrating, or on
#: SQLite a long write) before failing, seconds; ``HEDGEROW_MIGRATION_LOCK_TIMEOUT_S`` for the CLI.
MIGRATION_LOCK_TIMEOUT_S = 600.0


#: ``await fence(session)`` as the last statement of a scheduled job's writing transaction (so on
#: SQLite after its write lock is taken, and on PostgreSQL a row it locks is held only for the
#: commit): raises, and the transaction rolls back, when the process may no longer write (the
#: lease holder's check, :func:`hedgerow.controller.lease.check_lease_held`). None: no check.
WriteFence = Callable[[AsyncSession], Awaitable[None]]

#: Plain URL schemes and the async driver they are served by.
ASYNC_DRIVERS: dict[str, str] = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
}


def async_database_url(url: str) -> str:
    """``url`` with a plain scheme mapped to its async driver (``sqlite:///x.db`` →
    ``sqlite+aiosqlite:///x.db``, ``postgresql://`` and ``postgres://`` → ``postgresql+asyncpg://``);
    any other url unchanged."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ASYNC_DRIVERS:
        return f"{ASYNC_DRIVERS[scheme]}://{rest}"
    return url


def check_database_url(url: str) -> str:
    """Check ``url`` names a supported store; returns it with its async driver
    (:func:`async_database_url`).

    Raises:
        StoreError: malformed url, a driver other than aiosqlite / asyncpg, or a SQLite file
            whose folder does not exist (SQLite would say only "unable to open database file").
    """
    url = async_database_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        why = "" if isinstance(exc, ArgumentError) else f" ({exc})"
        raise StoreError(f"database url {safe_url(url)!r} is not a SQLAlchemy URL{why}") from None
    if parsed.drivername not in ("sqlite+aiosqlite", "postgresql+asyncpg"):
        raise StoreError(
            f"database url {safe_url(url)!r}: driver {parsed.drivername!r} is not supported; use "
            "sqlite+aiosqlite:///path or postgresql+asyncpg://user@host/db"
        )
    if parsed.drivername.startswith("sqlite") and parsed.database and parsed.database != ":memory:":
        folder = Path(parsed.database).parent
        if not folder.is_dir():
            where = "" if folder.is_absolute() else f"; it is relative to the working directory {Path.cwd()}"
            raise StoreError(
                f"database url {safe_url(url)!r}: the folder {str(folder)!r} of the SQLite file does not exist{where} "
                "(sqlite:///name.db is a relative path, sqlite:////abs/name.db an absolute one)"
            )
    return url


def make_engine(url: str, *, inline_in_transaction: bool = False, **kwargs: Any) -> AsyncEngine:
    """Create an async engine for the store.

    On SQLite every connection gets :data:`SQLITE_PRAGMAS`: foreign keys on, WAL journaling,
    ``synchronous=FULL`` and a busy timeout of :data:`SQLITE_BUSY_TIMEOUT_S` so that concurrent
    writers wait instead of failing.

    Args:
        url: ``sqlite+aiosqlite:///path`` or ``postgresql+asyncpg://user@host:port/db``.
        inline_in_transaction: SQLite: connections that run the statements of an open
            transaction on the event loop's thread
            (:mod:`hedgerow.controller.store.sqlite_inline`; only for transactions opened with
            ``BEGIN IMMEDIATE``). Ignored on PostgreSQL.
        **kwargs: passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

    Raises:
        StoreError: when the url is malformed or names an unsupported driver.
    """
    url = check_database_url(url)
    if url.startswith("sqlite"):
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
        if inline_in_transaction:
            from hedgerow.controller.store.sqlite_inline import connect_inline_in_transaction

            path = make_url(url).database or ":memory:"
            kwargs["async_creator"] = partial(connect_inline_in_transaction, path, **connect_args)
        engine = create_async_engine(url, connect_args=connect_args, **kwargs)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in SQLITE_PRAGMAS:
                cursor.execute(pragma)
            cursor.close()

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """An ``async_sessionmaker`` bound to ``engine`` (objects stay usable after commit)."""
    return async_sessionmaker(engine, expire_on_commit=False)


#: PostgreSQL: connections of the lease's own pool (one renewal at a time, plus one spare for a
#: release at shutdown while a cancelled renewal's connection is still being returned).
LEASE_POOL_SIZE = 2


@dataclass(frozen=True, slots=True)
class StoreEngines:
    """The engines of one ``serve`` process, one per kind of work, so that none waits for another.

    On PostgreSQL each is an engine (a connection pool) of its own, with a fixed size and no
    overflow; on SQLite the four are one engine, as before (SQLite serialises writers itself,
    and ingest has its own group commit writer, :func:`hedgerow.api.calls.make_ingest_writer`).

    Attributes:
        api: reads of the api (threshold polls, ``/readyz``, the console, admin writes).
        ingest: ``POST /v1/calls`` batches (PostgreSQL).
        jobs: the lease holder's controller tick, rollups, retention and weekly report.
        lease: the controller lease's renewals and release only.
    """

    api: AsyncEngine
    ingest: AsyncEngine
    jobs: AsyncEngine
    lease: AsyncEngine

    async def dispose(self) -> None:
        """Close every pool's connections (each engine once)."""
        seen: set[int] = set()
        for engine in (self.api, self.ingest, self.jobs, self.lease):
            if id(engine) not in seen:
                seen.add(id(engine))
                await engine.dispose()


def make_store_engines(url: str, *, api_pool_size: int, ingest_pool_size: int, jobs_pool_size: int) -> StoreEngines:
    """Make the engines of a ``serve`` process (see :class:`StoreEngines`).

    On PostgreSQL: four pools, of ``api_pool_size``, ``ingest_pool_size``, ``jobs_pool_size`` and
    :data:`LEASE_POOL_SIZE` connections, none with overflow, so a process opens at most their sum;
    heavy ingest fills only its own pool, and polls, health checks and lease renewals never queue
    behind it. On SQLite: one engine (:func:`make_engine`) for all four.

    Args:
        url: the store's url (see :func:`make_engine`).
        api_pool_size: connections of the api's pool, >= 1.
        ingest_pool_size: connections of the ingest pool, >= 1.
        jobs_pool_size: connections of the jobs' pool, >= 1.

    Raises:
        StoreError: the url is malformed or names an unsupported driver.
        ValueError: a pool size below 1.
    """
    sizes = {"api_pool_size": api_pool_size, "ingest_pool_size": ingest_pool_size, "jobs_pool_size": jobs_pool_size}
    for name, size in sizes.items():
        if size < 1:
            raise ValueError(f"{name}: must be >= 1, got {size!r}")
    url = check_database_url(url)
    if url.startswith("sqlite"):
        engine = make_engine(url)
        return StoreEngines(engine, engine, engine, engine)

    def pool(size: int) -> AsyncEngine:
        return make_engine(url, pool_size=size, max_overflow=0)

    return StoreEngines(pool(api_pool_size), pool(ingest_pool_size), pool(jobs_pool_size), pool(LEASE_POOL_SIZE))


def alembic_include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic ``include_name``: leave the day partitions of ``calls`` / ``attempts`` (PostgreSQL)
    out of comparisons; they are made at run time (:mod:`hedgerow.controller.store.partitions`)."""
    from hedgerow.controller.store.partitions import is_partition_name

    return not (type_ == "table" and name is not None and is_partition_name(name))


def alembic_include_object(dialect_name: str) -> Any:
    """An Alembic ``include_object`` for ``dialect_name``: leaves out the models' objects that
    exist on the other database only (``info={"dialect": ...}``, see
    :func:`hedgerow.controller.store.models.on_dialect`)."""
    from hedgerow.controller.store.models import on_dialect

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if reflected:
            return True
        table = getattr(obj, "table", None)
        return bool(on_dialect(obj, dialect_name) and (table is None or on_dialect(table, dialect_name)))

    return include_object


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config that uses the migrations shipped in ``hedgerow.migrations``.

    Args:
        url: database url handed to ``env.py`` (through ``config.attributes["url"]``).
    """
    import hedgerow.migrations as migrations_package

    config = Config()
    config.set_main_option("script_location", str(Path(migrations_package.__file__).resolve().parent))
    if url is not None:
        config.attributes["url"] = url
    return config


def head_revision() -> str | None:
    """The head revision of the shipped migrations."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def known_revisions() -> set[str]:
    """The ids of the shipped migrations' revisions."""
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _run_outside_loop(fn: Any, *args: Any) -> None:
    """Run ``fn`` here, or in a worker thread when this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        fn(*args)
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=target, name="hedgerow-migrate")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]


def upgrade_database(url: str, revision: str = "head", *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Migrate the database at ``url`` up to ``revision`` (default: the newest).

    The same path as ``hedgerow serve`` takes (:func:`migrate_engine`): one transaction holding
    the store's migration lock. Callable from sync code; when the calling thread runs an event
    loop, the migration runs in a worker thread (it blocks the caller until done). Async callers
    should prefer :func:`migrate_engine` on their own engine.

    Args:
        url: the store; revision: the target; lock_timeout_s: the longest wait for the
            migration lock, seconds.

    Raises:
        StoreError: when the url is not supported.
        StoreNotReady: the database cannot be reached, its lock was not free within
            ``lock_timeout_s``, or the migration failed (nothing of it is kept).
    """
    check_database_url(url)
    _run_outside_loop(asyncio.run, _migrate_url(url, revision, lock_timeout_s, downgrade=False))


def downgrade_database(url: str, revision: str, *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` removes every table), in
    one transaction holding the store's migration lock.

    Raises:
        StoreError: when the url is not supported.
        StoreNotReady: as :func:`upgrade_database`.
    """
    check_database_url(url)
    _run_outside_loop(asyncio.run, _migrate_url(url, revision, lock_timeout_s, downgrade=True))


async def _migrate_url(url: str, revision: str, lock_timeout_s: float, *, downgrade: bool) -> None:
    """Migrate the store at ``url`` with an engine of its own (disposed after)."""
    engine = make_engine(url)
    try:
        await migrate_engine(engine, revision, lock_timeout_s=lock_timeout_s, downgrade=downgrade)
    finally:
        await engine.dispose()


def lock_for_migration(connection: Connection, timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Take the store's migration lock in ``connection``'s transaction, waiting at most ``timeout_s``.

    PostgreSQL: the transaction-scoped advisory lock :data:`_MIGRATION_LOCK` (its wait bounded by
    a transaction-local ``lock_timeout``, put back once the lock is held). SQLite: ``BEGIN
    EXCLUSIVE`` on the connection (its wait bounded by the connection's busy timeout, put back
    after), so the whole migration is one SQLite transaction and no other connection writes
    meanwhile; the connection must not have run a statement in its transaction yet (pysqlite
    opens no transaction for DDL by itself, so without this each DDL statement would commit on
    its own). The lock is released when the transaction ends.

    Args:
        connection: a sync connection, in a transaction that has run nothing yet (SQLite).
        timeout_s: the longest wait, seconds (> 0).

    Raises:
        StoreNotReady: the lock was not free within ``timeout_s`` (naming the store), or the
            SQLite connection had already started its transaction.
    """
    wait_ms = max(1, round(timeout_s * 1000))
    shown = connection.engine.url.render_as_string(hide_password=True)
    busy = StoreNotReady(
        f"cannot migrate database {shown}: its migration lock was not free within {timeout_s:g} s "
        "(another process is migrating it, or on SQLite writing to it); try again when it is done, "
        "or wait longer with HEDGEROW_MIGRATION_LOCK_TIMEOUT_S"
    )
    if connection.dialect.name == "postgresql":
        previous = connection.execute(text("SELECT current_setting('lock_timeout')")).scalar_one()
        connection.execute(text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": f"{wait_ms}ms"})
        try:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == "55P03":  # lock_not_available
                raise busy from None
            raise
        connection.execute(text("SELECT set_config('lock_timeout', :previous, true)"), {"previous": previous})
        return
    if connection.dialect.name != "sqlite":
        raise StoreError(f"unsupported database dialect {connection.dialect.name!r}: use SQLite or PostgreSQL")
    connection.exec_driver_sql(f"PRAGMA busy_timeout={wait_ms}")
    try:
        connection.exec_driver_sql("BEGIN EXCLUSIVE")
    except DBAPIError as exc:
        message = str(exc.orig)
        if "locked" in message or "busy" in message:
            raise busy from None
        raise StoreNotReady(f"cannot migrate database {shown}: BEGIN EXCLUSIVE failed: {message}") from None
    finally:
        connection.exec_driver_sql(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")


async def upgrade_connection(
    connection: AsyncConnection, revision: str = "head", *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S
) -> None:
    """Migrate through an open async connection (inside its transaction) up to ``revision``,
    holding the store's migration lock (:func:`lock_for_migration`) first.

    Args:
        connection: in a transaction that has run nothing yet (the caller commits it).
        revision: the target; lock_timeout_s: the longest wait for the lock, seconds.

    Raises:
        StoreNotReady: the lock was not free within ``lock_timeout_s``.
    """
    await _migrate_connection(connection, revision, lock_timeout_s, downgrade=False)


async def _migrate_connection(
    connection: AsyncConnection, revision: str, lock_timeout_s: float, *, downgrade: bool
) -> None:
    def _migrate(sync_connection: Connection) -> None:
        # replicas starting together, and `db upgrade` runs, migrate one after the other
        lock_for_migration(sync_connection, lock_timeout_s)
        config = alembic_config()
        config.attributes["connection"] = sync_connection
        (command.downgrade if downgrade else command.upgrade)(config, revision)

    await connection.run_sync(_migrate)


#: ``user:password@`` of a url SQLAlchemy cannot parse: from the first ``:`` after the scheme's
#: ``://`` (or, without one, the first ``:``) to the last ``@``.
_UNPARSED_PASSWORD = re.compile(r"^(?P<head>(?:[^:]*://)?[^:]*:)(?P<password>.*)(?P<tail>@[^@]*)$", re.DOTALL)


def safe_url(url: str) -> str:
    """``url`` with its password masked (``***``), for messages and logs.

    A url SQLAlchemy parses is rendered by it with the password hidden; in one it cannot parse
    everything between the user's ``:`` and the last ``@`` is masked (so a password holding
    ``@`` or ``/`` does not show either).
    """
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        match = _UNPARSED_PASSWORD.match(url)
        return url if match is None else f"{match['head']}***{match['tail']}"


async def migrate_engine(
    engine: AsyncEngine,
    revision: str = "head",
    *,
    lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S,
    downgrade: bool = False,
) -> None:
    """Migrate the database of ``engine`` to ``revision`` in one transaction holding the store's
    migration lock (what ``hedgerow serve`` and ``hedgerow db upgrade`` both do).

    A second process migrating the same store waits for the first (at most ``lock_timeout_s``)
    and then finds it migrated; a migration that fails is rolled back whole.

    Args:
        engine: the store; revision: the target (default the newest);
        lock_timeout_s: the longest wait for the migration lock, seconds;
        downgrade: migrate down to ``revision`` instead of up.

    Raises:
        StoreNotReady: the database cannot be reached, the lock was not free in time, or the
            migration fails (one line naming the database, password hidden, and the error).
    """
    try:
        async with engine.begin() as connection:
            await _migrate_connection(connection, revision, lock_timeout_s, downgrade=downgrade)
    except StoreError:
        raise
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise StoreNotReady(
            f"cannot migrate database {engine.url.render_as_string(hide_password=True)}: "
            f"{type(exc).__name__}: {first_line}"
        ) from exc


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    async with engine.connect() as connection:
        return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())


async def check_ready(engine: AsyncEngine) -> str:
    """Check the database answers and is migrated to head; return its revision.

    Raises:
        StoreNotReady: naming what is wrong (unreachable, or at which revision vs head).
    """
    try:
        current = await current_revision(engine)
    except Exception as exc:
        raise StoreNotReady(f"database not reachable: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    head = head_revision()
    if current != head:
        raise StoreNotReady(
            f"database is at revision {current or 'none (empty)'}, migrations head is {head}: run `hedgerow db upgrade`"
        )
    assert current is not None, "the shipped migrations have a head"
    return current


def dialect_insert(session: AsyncSession, table: Any) -> Any:
    """The INSERT construct of the session's dialect, which has ``on_conflict_do_nothing``.

    Raises:
        StoreError: for a dialect other than SQLite and PostgreSQL.
    """
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise StoreError(f"unsupported database dialect {name!r}: use SQLite or PostgreSQL")


def rowcount(result: Result[Any]) -> int:
    """The number of rows an UPDATE or DELETE statement matched.

    ``AsyncSession.execute`` is typed to return a plain ``Result``; for DML statements it is a
    ``CursorResult``, which carries ``rowcount``.
    """
    assert isinstance(result, CursorResult), f"not the result of a DML statement: {type(result).__name__}"
    return int(result.rowcount)
