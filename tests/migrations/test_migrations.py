"""Migrations: upgrade, downgrade to base, upgrade again; and models in sync with the migrations."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from hedgerow.controller.store.db import (
    alembic_include_name,
    alembic_include_object,
    current_revision,
    downgrade_database,
    head_revision,
    make_engine,
    upgrade_database,
)
from hedgerow.controller.store.models import Base
from hedgerow.controller.store.partitions import is_partition_name

TABLES = {
    "routes", "calls", "attempts", "thresholds", "threshold_history", "leases", "hourly_rollups", "prices",
    "report_deliveries", "change_counters", "minute_aggregates",
}  # fmt: skip
#: Tables of PostgreSQL only (day partitions aside).
PG_TABLES = {"call_request_ids"}


def _expected(url: str) -> set[str]:
    return TABLES | (PG_TABLES if url.startswith("postgresql") else set())


async def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            names = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
        return {name for name in names if not is_partition_name(name)} - {"alembic_version"}
    finally:
        await engine.dispose()


async def test_upgrade_downgrade_upgrade(database_url: str) -> None:
    upgrade_database(database_url)
    assert await _tables(database_url) == _expected(database_url)
    downgrade_database(database_url, "base")
    assert await _tables(database_url) == set()
    upgrade_database(database_url)
    assert await _tables(database_url) == _expected(database_url)
    engine = make_engine(database_url)
    try:
        assert await current_revision(engine) == head_revision()
    finally:
        await engine.dispose()


async def test_models_match_migrations(database_url: str) -> None:
    upgrade_database(database_url)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as connection:
            diff = await connection.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync,
                        opts={
                            "compare_type": True,
                            "include_name": alembic_include_name,
                            "include_object": alembic_include_object(sync.dialect.name),
                        },
                    ),
                    Base.metadata,
                )
            )
    finally:
        await engine.dispose()
    assert diff == []


def test_upgrade_from_sync_code(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sync.db'}"
    upgrade_database(url)
    upgrade_database(url)  # already at head: a no-op
    import sqlite3

    with sqlite3.connect(tmp_path / "sync.db") as connection:
        versions = [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
    assert versions == [head_revision()]
