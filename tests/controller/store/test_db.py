"""Engine settings and column types of the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from hedgerow.controller.errors import StoreError
from hedgerow.controller.store.db import check_ready, head_revision, make_engine
from hedgerow.controller.store.models import Attempt, Lease


async def test_foreign_keys_are_enforced(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    with pytest.raises(IntegrityError):
        async with sessionmaker() as session, session.begin():
            session.add(
                Attempt(
                    call_id=12345,
                    call_started_at=datetime.now(UTC),
                    attempt_index=0,
                    upstream="a",
                    role="primary",
                    start_s=0.0,
                    first_token_s=None,
                    end_s=1.0,
                    outcome="failed",
                    status_code=None,
                    error_type=None,
                    completion_tokens=0,
                )
            )


async def test_timestamps_read_back_as_aware_utc(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    plus_two = timezone(timedelta(hours=2))
    written = datetime(2026, 11, 29, 10, 30, 0, 250000, tzinfo=plus_two)
    async with sessionmaker() as session, session.begin():
        session.add(Lease(name="t", holder="h", expires_at=written))
    async with sessionmaker() as session:
        read = await session.scalar(select(Lease.expires_at))
    assert read == written and read.tzinfo is not None and read.utcoffset() == timedelta(0)
    assert read.hour == 8
    with pytest.raises(StatementError, match="timezone-aware"):
        async with sessionmaker() as session, session.begin():
            session.add(Lease(name="naive", holder="h", expires_at=datetime(2026, 1, 1)))


@pytest.mark.parametrize("inline", [False, True], ids=["threaded", "inline_in_transaction"])
async def test_sqlite_pragmas(engine: AsyncEngine, migrated_url: str, inline: bool) -> None:
    if engine.dialect.name != "sqlite":
        pytest.skip("SQLite only")
    checked = make_engine(migrated_url, inline_in_transaction=True) if inline else engine
    try:
        async with checked.connect() as connection:
            assert (await connection.execute(text("PRAGMA foreign_keys"))).scalar() == 1
            assert (await connection.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await connection.execute(text("PRAGMA synchronous"))).scalar() == 2  # FULL
            busy_timeout_ms = (await connection.execute(text("PRAGMA busy_timeout"))).scalar()
            assert busy_timeout_ms is not None and busy_timeout_ms >= 1000
    finally:
        if inline:
            await checked.dispose()


async def test_ready_check(engine: AsyncEngine, tmp_path: Path) -> None:
    assert await check_ready(engine) == head_revision()
    empty = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(StoreError, match="run `hedgerow db upgrade`"):
            await check_ready(empty)
    finally:
        await empty.dispose()


def test_unsupported_urls_are_refused() -> None:
    for url in ("mysql://u@h/db", "sqlite+pysqlite:///x.db", "not a url"):
        with pytest.raises(StoreError):
            make_engine(url)


def test_plain_urls_are_mapped_to_the_async_drivers() -> None:
    from hedgerow.controller.store.db import check_database_url
    from hedgerow.settings import Settings

    assert check_database_url("sqlite:///x.db") == "sqlite+aiosqlite:///x.db"
    assert check_database_url("postgresql://u@h/db") == "postgresql+asyncpg://u@h/db"
    assert check_database_url("postgres://u@h:5433/db") == "postgresql+asyncpg://u@h:5433/db"
    assert Settings(database_url="sqlite:////tmp/a.db").database_url == "sqlite+aiosqlite:////tmp/a.db"


def test_a_sqlite_file_in_a_missing_folder_is_named_with_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hedgerow.controller.store.db import check_database_url

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"folder 'tmp/nope' of the SQLite file does not exist; it is relative to"):
        check_database_url("sqlite:///tmp/nope/x.db")
    with pytest.raises(StoreError, match=r"folder '/no/such/folder' of the SQLite file does not exist \("):
        check_database_url("sqlite+aiosqlite:////no/such/folder/x.db")
    assert check_database_url("sqlite:///here.db") == "sqlite+aiosqlite:///here.db"  # the folder is the cwd
    assert check_database_url("sqlite+aiosqlite:///:memory:") == "sqlite+aiosqlite:///:memory:"


async def test_a_migration_that_fails_midway_is_rolled_back_whole(database_url: str) -> None:
    """0004 adds columns to ``attempts`` and then creates ``prices``: with ``prices`` in its way
    it fails after the columns were added, and none of it may stay (else every later upgrade
    fails with a duplicate column)."""
    from sqlalchemy import inspect

    from hedgerow.controller.errors import StoreNotReady
    from hedgerow.controller.store.db import current_revision, migrate_engine, upgrade_database

    upgrade_database(database_url, "0003")
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE prices (id INTEGER)"))
        with pytest.raises(StoreNotReady, match=r"prices.* already exists"):
            await migrate_engine(engine)
        assert await current_revision(engine) == "0003"
        async with engine.connect() as connection:
            columns = await connection.run_sync(lambda sync: {c["name"] for c in inspect(sync).get_columns("attempts")})
        assert "prompt_tokens" not in columns
        async with engine.begin() as connection:
            await connection.execute(text("DROP TABLE prices"))
        await migrate_engine(engine)
        assert await check_ready(engine) == head_revision()
    finally:
        await engine.dispose()
