"""Day partitions (PostgreSQL) and request-id dedup across days (both databases).

Partition creation ahead of need and on demand, late and odd records, the same request id on
another day, concurrent batches that race on ids and on a new day, and retention dropping days
only once they are folded.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import ColumnElement, event, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Base, Call, HourlyRollup
from hedgerow.controller.store.partitions import (
    DAYS_AHEAD,
    DayPartitionCache,
    DayPartitionMissing,
    day_of,
    missing_days,
    partition_days,
    partition_name,
)
from hedgerow.controller.store.retention import drop_folded_days, run_retention
from hedgerow.controller.store.rollups import floor_hour, fold_hours, merge_rollups
from hedgerow.settings import Settings
from tests.conftest import CallFactory
from tests.helpers import drop_day_partitions

NOW = datetime(2026, 11, 29, 12, 20, tzinfo=UTC)
DAY = timedelta(days=1)


def _postgresql(sessionmaker: async_sessionmaker[AsyncSession]) -> bool:
    dialect: str = sessionmaker.kw["bind"].dialect.name
    return dialect == "postgresql"


def _pg_only(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    if not _postgresql(sessionmaker):
        pytest.skip("SQLite keeps plain tables")


async def _ingest(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord]) -> tuple[int, int]:
    async with sessionmaker() as session, session.begin():
        return await ingest_calls(session, records, defaults=route_defaults(Settings()))


async def _days(sessionmaker: async_sessionmaker[AsyncSession]) -> list[date]:
    async with sessionmaker() as session:
        return await partition_days(await session.connection())


async def _count(sessionmaker: async_sessionmaker[AsyncSession], model: type[Base], *where: ColumnElement[bool]) -> int:
    async with sessionmaker() as session:
        return int(await session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


async def _request_id_rows(sessionmaker: async_sessionmaker[AsyncSession]) -> int:
    async with sessionmaker() as session:
        return int((await session.execute(text("SELECT count(*) FROM call_request_ids"))).scalar_one())


async def test_the_migration_makes_today_and_the_days_ahead(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    _pg_only(sessionmaker)
    today = datetime.now(UTC).date()
    days = await _days(sessionmaker)
    assert [today + timedelta(days=n) for n in range(DAYS_AHEAD + 1)] == [d for d in days if d >= today]
    async with sessionmaker() as session:
        connection = await session.connection()
        assert await missing_days(connection, [today, today + DAY]) == []
        assert await missing_days(connection, [today - 40 * DAY]) == [today - 40 * DAY]
        # every day partition has its own keys: the primary key, and attempts -> that day's calls
        keys: dict[str, str] = dict(
            (
                await connection.execute(
                    text("SELECT conname, contype::text FROM pg_constraint WHERE conrelid = CAST(:t AS regclass)"),
                    {"t": partition_name("attempts", today)},
                )
            ).all()
        )
    name = partition_name("attempts", today)
    assert keys[f"pk_{name}"] == "p" and keys[f"uq_{name}_call_id_attempt_index"] == "u"
    assert keys[f"fk_{name}_call_id_{partition_name('calls', today)}"] == "f"


async def test_a_late_or_odd_record_gets_its_day_made_on_demand(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    late = call_factory("late", started_at=datetime(2026, 10, 3, 23, 59, 59, 999999, tzinfo=UTC))
    odd = call_factory("odd", started_at=datetime(1999, 12, 31, 23, 0, tzinfo=UTC), hedge_after_s=1.0,
                       primary_ttft_s=3.0, backup_ttft_s=0.5)  # fmt: skip
    assert await _ingest(sessionmaker, [late, odd, call_factory("now")]) == (3, 0)
    assert await _count(sessionmaker, Attempt) == 4
    async with sessionmaker() as session:
        stored = dict((await session.execute(select(Attempt.call_id, Attempt.call_started_at))).all())
        calls = dict((await session.execute(select(Call.id, Call.started_at))).all())
    assert stored == {call_id: calls[call_id] for call_id in stored}  # each attempt carries its call's start
    if _postgresql(sessionmaker):
        days = await _days(sessionmaker)
        assert {date(2026, 10, 3), date(1999, 12, 31)} <= set(days)
        async with sessionmaker() as session:  # the last microsecond of a day is in that day
            late_in = await session.scalar(text(f"SELECT count(*) FROM {partition_name('calls', date(2026, 10, 3))}"))
        assert late_in == 1
        # posting them again makes nothing new
        assert await _ingest(sessionmaker, [late, odd]) == (0, 2)
        assert await _days(sessionmaker) == days


def test_the_day_cache_trusts_known_days_only_inside_the_retention_horizon() -> None:
    cache = DayPartitionCache(retention_s=14 * 86400)
    today = NOW.date()
    days = [today - 20 * DAY, today - 14 * DAY, today - 13 * DAY, today, today + DAY]
    assert cache.unknown(days + days, now=NOW) == sorted(days)  # nothing known yet; repeats once
    cache.add(days)
    assert len(cache) == 5
    # the day that ended before now - 14 days may be dropped by retention at any time: looked up;
    # the one that ends after it (today - 14 days ends at NOW - 14 days + 11:40) is trusted
    assert cache.unknown(days, now=NOW) == [today - 20 * DAY]
    assert cache.unknown(days, now=NOW + DAY) == [today - 20 * DAY, today - 14 * DAY]
    cache.forget()
    assert cache.unknown([today], now=NOW) == [today]
    small = DayPartitionCache(retention_s=86400, max_days=2)
    small.add([today, today + DAY])
    small.add([today + 2 * DAY])  # past the bound: starts again with the new day only
    assert small.unknown([today, today + 2 * DAY], now=NOW) == [today]
    with pytest.raises(ValueError, match="retention_s"):
        DayPartitionCache(retention_s=0)
    with pytest.raises(ValueError, match="max_days"):
        DayPartitionCache(retention_s=1, max_days=0)


async def _ingest_cached(
    sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord], cache: DayPartitionCache
) -> tuple[int, int]:
    """Ingest as the api does: look up the days the cache does not trust, learn them on commit."""
    checked: set[date] = set()
    async with sessionmaker() as session, session.begin():
        result = await ingest_calls(
            session, records, defaults=route_defaults(Settings()), partition_days=cache, checked_days=checked
        )
    cache.add(checked)
    return result


async def test_cached_days_cost_no_catalog_query_and_a_dropped_day_fails_the_batch_whole(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    _pg_only(sessionmaker)
    engine = sessionmaker.kw["bind"]
    catalog_reads: list[str] = []

    def count_catalog_reads(
        conn: object, cursor: object, statement: str, parameters: object, context: object, executemany: bool
    ) -> None:
        if "pg_inherits" in statement:
            catalog_reads.append(statement)

    now = datetime.now(UTC)
    day = day_of(now - 2 * DAY)
    cache = DayPartitionCache(retention_s=Settings().retention_s)
    event.listen(engine.sync_engine, "before_cursor_execute", count_catalog_reads)
    try:
        assert await _ingest_cached(sessionmaker, [call_factory("a", started_at=now - 2 * DAY)], cache) == (1, 0)
        assert len(catalog_reads) >= 1
        assert cache.unknown([day], now=now) == []
        catalog_reads.clear()
        assert await _ingest_cached(sessionmaker, [call_factory("b", started_at=now - 2 * DAY)], cache) == (1, 0)
        assert catalog_reads == []  # the day was known: no look-up
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count_catalog_reads)
    # another connection drops the day (by hand: retention would not drop a day this recent)
    await drop_day_partitions(engine.url, day)
    late = [call_factory("c", started_at=now - 2 * DAY), call_factory("d", started_at=now)]
    with pytest.raises(DayPartitionMissing, match="no partition"):
        await _ingest_cached(sessionmaker, late, cache)
    assert await _count(sessionmaker, Call, Call.request_id.in_(["c", "d"])) == 0  # nothing of the batch
    assert await _request_id_rows(sessionmaker) == 2
    cache.forget()
    assert await _ingest_cached(sessionmaker, late, cache) == (2, 0)  # looked up again and made
    assert day in await _days(sessionmaker) and cache.unknown([day], now=now) == []
    assert await _count(sessionmaker, Attempt, Attempt.call_started_at == now - 2 * DAY) == 1


async def test_the_same_request_id_on_another_day_is_a_duplicate(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    first = call_factory("same", started_at=NOW)
    assert await _ingest(sessionmaker, [first]) == (1, 0)
    elsewhere = [dataclasses.replace(first, started_at=NOW + delta) for delta in (-3 * DAY, DAY, timedelta(seconds=1))]
    for record in elsewhere:
        assert await _ingest(sessionmaker, [record]) == (0, 1)
    assert await _ingest(sessionmaker, elsewhere) == (0, 3)
    assert await _count(sessionmaker, Call) == 1
    assert await _count(sessionmaker, Attempt) == 1
    if _postgresql(sessionmaker):
        assert await _request_id_rows(sessionmaker) == 1


async def test_concurrent_batches_over_days_count_each_call_once(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # six batches at once, sharing ids; each id comes with a different started_at (several
    # days, two of them without a partition yet), so every batch races on ids and on new days
    starts = [NOW - 20 * DAY, NOW - 19 * DAY, NOW, NOW + timedelta(hours=5)]
    batches = [
        [call_factory(f"c{i}", started_at=starts[(i + b) % len(starts)]) for i in range(b * 15, b * 15 + 60)]
        for b in range(6)
    ]
    results = await asyncio.gather(*(_ingest(sessionmaker, batch) for batch in batches))
    ids = {r.request_id for batch in batches for r in batch}
    assert sum(accepted for accepted, _ in results) == len(ids)
    assert sum(accepted + duplicates for accepted, duplicates in results) == sum(len(b) for b in batches)
    assert await _count(sessionmaker, Call) == len(ids)
    assert await _count(sessionmaker, Attempt) == len(ids)
    if _postgresql(sessionmaker):
        assert await _request_id_rows(sessionmaker) == len(ids)
        assert {day_of(NOW - 20 * DAY), day_of(NOW - 19 * DAY)} <= set(await _days(sessionmaker))


async def _old_and_new(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> tuple[list[CallRecord], list[CallRecord]]:
    """Calls 16-17 days before NOW (to be dropped at 14 days' retention) and 2 days before."""
    old = [
        call_factory(f"old{i}", started_at=NOW - 17 * DAY + timedelta(minutes=37 * i), hedge_after_s=1.0,
                     primary_ttft_s=3.0 if i % 3 else 0.4, backup_ttft_s=0.5)
        for i in range(60)
    ]  # fmt: skip
    new = [call_factory(f"new{i}", started_at=NOW - 2 * DAY + timedelta(minutes=11 * i)) for i in range(30)]
    assert await _ingest(sessionmaker, old + new) == (90, 0)
    return old, new


async def test_retention_drops_whole_days_once_folded(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    _pg_only(sessionmaker)
    old, new = await _old_and_new(sessionmaker, call_factory)
    old_days = sorted({day_of(r.started_at) for r in old})
    settings = Settings(retention_s=14 * 86400.0, retention_batch_rows=7)
    report = await run_retention(sessionmaker, settings, now=NOW)

    assert report.dropped_days == old_days
    assert report.deleted_calls == len(old) and all(h.skipped is None for h in report.deleted)
    assert report.deleted_attempts == sum(len(r.attempts) for r in old)
    assert report.pruned_request_ids == len(old)  # in batches of 7
    assert not set(old_days) & set(await _days(sessionmaker))
    async with sessionmaker() as session:
        left = set((await session.scalars(select(Call.request_id))).all())
        gone = await session.execute(text("SELECT to_regclass(:name)"), {"name": partition_name("calls", old_days[0])})
        assert gone.scalar_one() is None
        merged = await merge_rollups(session, since=floor_hour(NOW - 20 * DAY), until=floor_hour(NOW - 10 * DAY))
        sealed = await session.scalar(select(func.count()).where(HourlyRollup.sealed_at.is_not(None)))
    assert left == {r.request_id for r in new}
    assert await _request_id_rows(sessionmaker) == len(new)
    # the rollups keep every figure of the dropped calls
    [route] = merged
    assert route.rollup.calls == len(old) and route.rollup.hedges == len(old)
    assert sealed == len({floor_hour(r.started_at) for r in old})
    # today and the days ahead exist (made by the migration here: the run made none of them)
    assert {day_of(NOW) + timedelta(days=n) for n in range(DAYS_AHEAD + 1)} <= set(await _days(sessionmaker))
    # a second run finds nothing to do
    again = await run_retention(sessionmaker, settings, now=NOW)
    assert (again.dropped_days, again.deleted, again.pruned_request_ids) == ([], [], 0)


async def test_a_day_with_an_hour_not_folded_is_kept_until_it_is(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    _pg_only(sessionmaker)
    old, _new = await _old_and_new(sessionmaker, call_factory)
    await fold_hours(sessionmaker, now=NOW)
    # a late record for the oldest day arrives after the fold (a direct ingest: the api would refuse it)
    late = call_factory("late", started_at=old[0].started_at + timedelta(seconds=5))
    assert await _ingest(sessionmaker, [late]) == (1, 0)
    cutoff = floor_hour(NOW - 14 * DAY)
    dropped, hours = await drop_folded_days(sessionmaker, cutoff=cutoff, now=NOW)
    first_day = day_of(old[0].started_at)
    assert first_day not in dropped
    skipped = {h.hour_start: h.skipped for h in hours if h.hour_start.date() == first_day}
    assert skipped[floor_hour(late.started_at)] == "stale_rollup"
    assert set(skipped.values()) == {"stale_rollup", "day_not_folded"}
    assert await _count(sessionmaker, Call, Call.request_id == "late") == 1
    # the next run folds it, then drops the day: the late call is counted, not lost
    report = await run_retention(sessionmaker, Settings(retention_s=14 * 86400.0), now=NOW)
    assert first_day in report.dropped_days
    async with sessionmaker() as session:
        [route] = await merge_rollups(session, since=floor_hour(NOW - 20 * DAY), until=floor_hour(NOW - 10 * DAY))
    assert route.rollup.calls == len(old) + 1


async def test_a_day_still_in_retention_or_its_grace_is_kept(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    _pg_only(sessionmaker)
    old, _new = await _old_and_new(sessionmaker, call_factory)
    last_old_day = max(day_of(r.started_at) for r in old)
    # the cutoff sits 30 minutes after the last old day ends: inside the hour of grace
    day_end = datetime.combine(last_old_day + DAY, datetime.min.time(), tzinfo=UTC)
    now = day_end + timedelta(days=14, minutes=30)
    report = await run_retention(sessionmaker, Settings(retention_s=14 * 86400.0), now=now)
    assert last_old_day not in report.dropped_days
    assert last_old_day in await _days(sessionmaker)
    later = await run_retention(sessionmaker, Settings(retention_s=14 * 86400.0), now=now + timedelta(hours=1))
    assert last_old_day in later.dropped_days
