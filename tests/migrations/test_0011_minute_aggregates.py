"""Migration 0011: the backfill gives the rows ingest keeps, and running it again changes nothing.

A store at head takes a varied workload through ingest (which keeps ``minute_aggregates``); its
rows are the reference. Downgrading to 0010 drops the table; upgrading again backfills it from
the calls stored: every row must equal the reference. The backfill run once more (it empties
the table first) gives the same rows again.
"""

from __future__ import annotations

import importlib
from datetime import UTC, datetime

from sqlalchemy import select

from hedgerow.controller.store.db import downgrade_database, make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import MinuteAggregate
from hedgerow.settings import Settings
from tests.controller.rollup_workload import workload

START = datetime(2026, 12, 2, 22, 30, tzinfo=UTC)


async def _rows(url: str) -> list[tuple[int, int, int, int, int, int, int, bytes]]:
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            result = await session.execute(
                select(MinuteAggregate).order_by(MinuteAggregate.route_id, MinuteAggregate.minute_index)
            )
            return [
                (r.route_id, r.minute_index, r.calls, r.hedged, r.backup_wins, r.denied, r.wanted, r.histograms)
                for (r,) in result.all()
            ]
    finally:
        await engine.dispose()


async def test_0011_backfill_equals_what_ingest_keeps(database_url: str) -> None:
    upgrade_database(database_url)
    engine = make_engine(database_url)
    try:
        sessionmaker = make_sessionmaker(engine)
        records = workload(2500, seed=21, start=START, span_s=3 * 3600)  # over a day's end
        for start in range(0, len(records), 600):
            async with sessionmaker() as session, session.begin():
                await ingest_calls(session, records[start : start + 600], defaults=route_defaults(Settings()))
    finally:
        await engine.dispose()
    reference = await _rows(database_url)
    assert sum(row[2] for row in reference) == 2500
    downgrade_database(database_url, "0010")
    upgrade_database(database_url)
    assert await _rows(database_url) == reference
    migration = importlib.import_module("hedgerow.migrations.versions.0011_minute_aggregates")
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            assert await connection.run_sync(migration.backfill) == 2500
    finally:
        await engine.dispose()
    assert await _rows(database_url) == reference
