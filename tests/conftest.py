"""Shared fixtures: ``database_url`` runs a store test on SQLite and on PostgreSQL.

- ``sqlite``: a fresh file in the test's tmp dir.
- ``postgresql``: a database of its own for each pytest process (each xdist worker), created on
  the server of ``HEDGEROW_TEST_DATABASE_URL`` (e.g.
  ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``) when the process first needs it and
  dropped when it ends; everything in its ``public`` schema is dropped before each test. Two
  workers, or two runs on one machine, never share a database. Skipped, with the reason, when
  the variable is unset.

``fresh_pg_database`` gives a test a whole database of its own (for tests that start several
``serve`` processes on one store).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

if TYPE_CHECKING:
    from hedgerow.client.records import AttemptOutcome, AttemptRole, CallRecord

PG_ENV = "HEDGEROW_TEST_DATABASE_URL"
T = TypeVar("T")
PG_SKIP = f"{PG_ENV} is not set (e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test)"


def _admin_params(url: str) -> dict[str, object]:
    """asyncpg connection arguments for the maintenance database of the server at ``url``."""
    parsed = make_url(url)
    return {
        "user": parsed.username,
        "password": parsed.password,
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
        "database": "postgres",
    }


async def create_pg_database(base_url: str, prefix: str) -> str:
    """Create an empty database named ``<prefix>_<random>`` on the server of ``base_url``.

    Returns:
        Its SQLAlchemy async URL (``base_url`` with the database replaced).
    """
    import asyncpg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    connection = await asyncpg.connect(**_admin_params(base_url))
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


async def drop_pg_database(url: str) -> None:
    """Drop the database of ``url`` (closing its open connections)."""
    import asyncpg

    name = make_url(url).database
    connection = await asyncpg.connect(**_admin_params(url))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


@asynccontextmanager
async def fresh_pg_database(prefix: str = "hedgerow_t") -> AsyncIterator[str]:
    """A new, empty PostgreSQL database for the block (dropped after it); skips without the server."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(PG_SKIP)
    url = await create_pg_database(base, prefix)
    try:
        yield url
    finally:
        await drop_pg_database(url)


def _run_in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a loop of its own in another thread (callable from a running loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="session")
def worker_pg_url(worker_id: str) -> Iterator[str | None]:
    """This pytest process's own PostgreSQL database (None without the server variable).

    Named after the xdist worker (``gw0``, ``master`` without xdist) plus a random suffix, created
    at the first test that needs it, dropped when the process ends.
    """
    base = os.environ.get(PG_ENV)
    if not base:
        yield None
        return
    url = _run_in_thread(create_pg_database(base, f"hedgerow_{worker_id}"))
    try:
        yield url
    finally:
        _run_in_thread(drop_pg_database(url))


async def reset_postgres(url: str) -> None:
    """Drop and recreate the ``public`` schema of the PostgreSQL database at ``url``."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            await connection.execute(text("CREATE SCHEMA public"))
    finally:
        await engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database's SQLAlchemy async URL (SQLite file, or this worker's PostgreSQL database)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'hedgerow.db'}"
        return
    url = request.getfixturevalue("worker_pg_url")
    if not url:
        pytest.skip(PG_SKIP)
    await reset_postgres(url)
    yield url


@pytest.fixture
async def migrated_url(database_url: str) -> str:
    """``database_url`` migrated to the newest revision."""
    from hedgerow.controller.store.db import upgrade_database

    upgrade_database(database_url)
    return database_url


@pytest.fixture
async def engine(migrated_url: str) -> AsyncIterator[AsyncEngine]:
    """An async engine on a migrated store (disposed after the test)."""
    from hedgerow.controller.store.db import make_engine

    eng = make_engine(migrated_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """A sessionmaker on the migrated store."""
    from hedgerow.controller.store.db import make_sessionmaker

    return make_sessionmaker(engine)


def make_call(
    request_id: str,
    *,
    route: str = "summarize",
    model: str = "m1",
    started_at: datetime | None = None,
    primary_ttft_s: float | None = 0.5,
    primary_end_s: float | None = None,
    primary_outcome: AttemptOutcome | None = None,
    hedge_after_s: float | None = None,
    backup_ttft_s: float | None = None,
) -> CallRecord:
    """A realistic CallRecord for tests.

    Without ``hedge_after_s`` the primary alone answers (TTFT ``primary_ttft_s``, or fails when it
    is None). With it, a backup starts at ``hedge_after_s`` and answers ``backup_ttft_s`` later;
    the first of the two first tokens wins and the other attempt is cancelled at that moment
    (a primary cancelled before its first token is censored).
    """

    from hedgerow.client.records import AttemptRecord, CallRecord

    started_at = started_at or datetime.now(UTC)
    attempts: list[AttemptRecord] = []
    if hedge_after_s is None:
        if primary_ttft_s is None:
            end = primary_end_s if primary_end_s is not None else 0.01
            attempts.append(
                AttemptRecord("a", "primary", 0.0, None, end, primary_outcome or "failed", 503, "http_503", 0)
            )
            return CallRecord(
                request_id,
                route,
                model,
                started_at,
                client="test",
                status="error",
                error_type="http_503",
                attempts=tuple(attempts),
            )
        end = primary_ttft_s + 1.0
        attempts.append(AttemptRecord("a", "primary", 0.0, primary_ttft_s, end, "won", 200, None, 20))
        return CallRecord(
            request_id,
            route,
            model,
            started_at,
            client="test",
            hedge_after_s=None,
            winner="primary",
            ttft_s=primary_ttft_s,
            ttfo_s=primary_ttft_s,
            tpot_s=0.05,
            e2e_s=end,
            max_itl_s=0.1,
            prompt_tokens=100,
            completion_tokens=20,
            attempts=tuple(attempts),
        )
    assert backup_ttft_s is not None and primary_ttft_s is not None
    winner: AttemptRole
    backup_first = hedge_after_s + backup_ttft_s
    if primary_ttft_s <= backup_first:
        first = primary_ttft_s
        attempts.append(AttemptRecord("a", "primary", 0.0, first, first + 1.0, "won", 200, None, 20))
        attempts.append(AttemptRecord("b", "backup", hedge_after_s, None, first, "cancelled", 200, None, 0))
        winner = "primary"
    else:
        first = backup_first
        attempts.append(AttemptRecord("a", "primary", 0.0, None, first, "cancelled", 200, None, 0))
        attempts.append(AttemptRecord("b", "backup", hedge_after_s, first, first + 1.0, "won", 200, None, 20))
        winner = "backup"
    return CallRecord(
        request_id,
        route,
        model,
        started_at,
        client="test",
        hedge_after_s=hedge_after_s,
        threshold_version=1,
        hedged=True,
        hedge_reason="ttft_timeout",
        winner=winner,
        ttft_s=first,
        ttfo_s=first,
        tpot_s=0.05,
        e2e_s=first + 1.0,
        max_itl_s=0.1,
        prompt_tokens=100,
        completion_tokens=20,
        attempts=tuple(attempts),
    )


class CallFactory(Protocol):
    """The type of :func:`make_call`, which the ``call_factory`` fixture gives."""

    def __call__(
        self,
        request_id: str,
        *,
        route: str = ...,
        model: str = ...,
        started_at: datetime | None = ...,
        primary_ttft_s: float | None = ...,
        primary_end_s: float | None = ...,
        primary_outcome: AttemptOutcome | None = ...,
        hedge_after_s: float | None = ...,
        backup_ttft_s: float | None = ...,
    ) -> CallRecord: ...


@pytest.fixture
def call_factory() -> CallFactory:
    """The :func:`make_call` factory of test call records."""
    return make_call


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` first: with xdist, a long test started last would run alone
    while the other workers idle (longest-first scheduling shortens the whole run)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
