"""Migration 0012: ``routes.archived_at``/``archived_by`` come and go in place, keeping every row.

The columns are added and dropped with plain ``ALTER TABLE`` (no batch copy of ``routes``): on
SQLite a copy would delete the calls and history through ``ON DELETE CASCADE`` and drop the
change-counter triggers. The upgrade also runs on a store where a column is already there.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import inspect, text

from hedgerow.controller.routes_admin import archive_route
from hedgerow.controller.store.change_counters import read_change_counter
from hedgerow.controller.store.db import downgrade_database, make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.conftest import make_call


async def _columns(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(lambda sync: {c["name"] for c in inspect(sync).get_columns("routes")})
    finally:
        await engine.dispose()


async def _counts(url: str) -> tuple[int, int, int]:
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            counts = []
            for table in ("routes", "calls", "threshold_history"):
                counts.append(int((await connection.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()))
            return counts[0], counts[1], counts[2]
    finally:
        await engine.dispose()


async def _counter_moves_on_a_route_update(url: str) -> bool:
    engine = make_engine(url)
    try:
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker() as session:
            before = await read_change_counter(session)
        async with sessionmaker() as session, session.begin():
            await session.execute(text("UPDATE routes SET budget = budget"))
        async with sessionmaker() as session:
            return (await read_change_counter(session) or 0) > (before or 0)
    finally:
        await engine.dispose()


async def test_0012_upgrade_downgrade_keep_rows_and_triggers(database_url: str) -> None:
    upgrade_database(database_url)
    assert {"archived_at", "archived_by"} <= await _columns(database_url)
    engine = make_engine(database_url)
    try:
        sessionmaker = make_sessionmaker(engine)
        now = datetime.now(UTC)
        records = [make_call(f"r{i}", route=f"r{i % 2}", started_at=now - timedelta(seconds=i + 1)) for i in range(6)]
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records, defaults=route_defaults(Settings()))
        await archive_route(sessionmaker, "r1", "m1", actor="ops")
    finally:
        await engine.dispose()
    assert await _counts(database_url) == (2, 6, 1)

    downgrade_database(database_url, "0011")
    assert not {"archived_at", "archived_by"} & await _columns(database_url)
    assert await _counts(database_url) == (2, 6, 1)  # nothing cascaded away
    assert await _counter_moves_on_a_route_update(database_url)  # the triggers are still there

    # half applied by hand: the upgrade adds only what is missing
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text("ALTER TABLE routes ADD COLUMN archived_by VARCHAR(200)"))
    finally:
        await engine.dispose()
    upgrade_database(database_url)
    assert {"archived_at", "archived_by"} <= await _columns(database_url)
    assert await _counts(database_url) == (2, 6, 1)
    assert await _counter_moves_on_a_route_update(database_url)
