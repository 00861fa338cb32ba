"""Ingest: rows written once per request_id, routes created on first sight, concurrent batches."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.policy.route_config import RouteConfig
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Base, Call, Route
from hedgerow.settings import Settings
from tests.conftest import CallFactory


async def _count(sessionmaker: async_sessionmaker[AsyncSession], model: type[Base]) -> int:
    async with sessionmaker() as session:
        count = await session.scalar(select(func.count()).select_from(model))
        assert count is not None  # COUNT(*) always answers
        return count


async def _ingest(
    sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord], defaults: RouteConfig
) -> tuple[int, int]:
    async with sessionmaker() as session, session.begin():
        return await ingest_calls(session, records, defaults=defaults)


async def test_ingest_is_idempotent(sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory) -> None:
    defaults = route_defaults(Settings(default_budget=0.2, default_hedge_after_s=1.5))
    batch = [call_factory(f"r{i}", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.5) for i in range(5)]
    batch += [call_factory(f"p{i}", model="m2") for i in range(3)]
    assert await _ingest(sessionmaker, batch, defaults) == (8, 0)
    assert await _ingest(sessionmaker, batch, defaults) == (0, 8)
    assert await _count(sessionmaker, Call) == 8
    assert await _count(sessionmaker, Attempt) == 5 * 2 + 3
    async with sessionmaker() as session:
        routes = (await session.scalars(select(Route).order_by(Route.model))).all()
    assert [(r.route, r.model) for r in routes] == [("summarize", "m1"), ("summarize", "m2")]
    assert routes[0].budget == 0.2 and routes[0].default_hedge_after_s == 1.5
    assert routes[0].enabled and routes[0].pinned_hedge_after_s is None
    assert routes[0].created_at.tzinfo is not None and routes[0].created_at.utcoffset() == timedelta(0)


async def test_duplicates_inside_one_batch(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    defaults = route_defaults(Settings())
    batch = [call_factory("same"), call_factory("same"), call_factory("other")]
    assert await _ingest(sessionmaker, batch, defaults) == (2, 1)
    assert await _ingest(sessionmaker, [call_factory("other"), call_factory("new")], defaults) == (1, 1)
    assert await _count(sessionmaker, Call) == 3


async def test_the_first_copy_of_a_duplicate_wins(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    batch = [call_factory("dup", primary_ttft_s=0.5), call_factory("dup", primary_ttft_s=3.0)]
    assert await _ingest(sessionmaker, batch, route_defaults(Settings())) == (1, 1)
    async with sessionmaker() as session:
        assert await session.scalar(select(Call.ttft_s).where(Call.request_id == "dup")) == 0.5


async def test_round_trip_of_stored_fields(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    record = call_factory("x1", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.25)
    await _ingest(sessionmaker, [record], route_defaults(Settings()))
    async with sessionmaker() as session:
        call = await session.scalar(select(Call).where(Call.request_id == "x1"))
        assert call is not None
        attempts = (
            await session.scalars(select(Attempt).where(Attempt.call_id == call.id).order_by(Attempt.attempt_index))
        ).all()
    assert call.started_at == record.started_at
    assert (call.hedged, call.hedge_reason, call.winner, call.ttft_s) == (True, "ttft_timeout", "backup", 1.25)
    assert [(a.role, a.outcome, a.first_token_s, a.end_s) for a in attempts] == [
        ("primary", "cancelled", None, 1.25),
        ("backup", "won", 1.25, 2.25),
    ]


async def test_concurrent_batches_count_each_call_once(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    defaults = route_defaults(Settings())
    batches = [[call_factory(f"c{j}", route=f"route{j % 3}") for j in range(i, i + 30)] for i in range(0, 60, 10)]
    results = await asyncio.gather(*(_ingest(sessionmaker, b, defaults) for b in batches))
    assert sum(accepted for accepted, _ in results) == 60 + 20  # ids c0..c79 overlap
    assert sum(accepted + dup for accepted, dup in results) == 6 * 30
    assert await _count(sessionmaker, Call) == 80
    assert await _count(sessionmaker, Route) == 3


class _Failure(Exception):
    pass


async def test_a_rolled_back_batch_leaves_nothing_and_the_next_one_is_whole(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    defaults = route_defaults(Settings())
    batch = [call_factory(f"b{i}", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.5) for i in range(50)]
    try:
        async with sessionmaker() as session, session.begin():
            assert await ingest_calls(session, batch, defaults=defaults) == (50, 0)
            raise _Failure
    except _Failure:
        pass
    assert (await _count(sessionmaker, Call), await _count(sessionmaker, Attempt)) == (0, 0)
    # the staging rows (PostgreSQL) and the id read-back (SQLite) start clean for the next batch
    assert await _ingest(sessionmaker, batch[:20], defaults) == (20, 0)
    assert await _ingest(sessionmaker, batch, defaults) == (30, 20)
    assert (await _count(sessionmaker, Call), await _count(sessionmaker, Attempt)) == (50, 100)


async def test_two_batches_in_one_transaction(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    defaults = route_defaults(Settings())
    async with sessionmaker() as session, session.begin():
        assert await ingest_calls(session, [call_factory(f"t{i}") for i in range(10)], defaults=defaults) == (10, 0)
        again = [call_factory(f"t{i}") for i in range(5, 15)]
        assert await ingest_calls(session, again, defaults=defaults) == (5, 5)
    async with sessionmaker() as session:
        pairs = (await session.execute(select(Call.request_id, Attempt.call_id).join(Attempt))).all()
        ids = dict((await session.execute(select(Call.request_id, Call.id))).all())
    assert len(pairs) == 15 and all(ids[request_id] == call_id for request_id, call_id in pairs)


async def test_version_1_records_get_the_prompt_token_estimate(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    record = call_factory("v1", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.5)
    await _ingest(sessionmaker, [record], route_defaults(Settings()))
    async with sessionmaker() as session:
        rows = (await session.execute(select(Attempt.prompt_tokens, Attempt.prompt_tokens_estimated))).all()
    # both attempts answered 200 and carried no usage of their own: the call's 100 prompt tokens each
    assert sorted(rows) == [(100, True), (100, True)]


async def test_cached_route_ids_skip_the_routes_table_and_a_batch_is_a_few_statements(
    engine: AsyncEngine, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    from sqlalchemy import event

    from hedgerow.controller.store.ingest import RouteIdCache

    defaults = route_defaults(Settings())
    cache = RouteIdCache()
    resolved: dict[tuple[str, str], int] = {}
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, [call_factory("first")], defaults=defaults, route_ids=cache, resolved=resolved)
    assert len(cache) == 0 and list(resolved) == [("summarize", "m1")]  # learnt by the caller after commit
    cache.add(resolved)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        batch = [
            call_factory(f"c{i}", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.5)
            if i % 3
            else call_factory(f"c{i}")
            for i in range(600)
        ]
        async with sessionmaker() as session, session.begin():
            assert await ingest_calls(session, batch, defaults=defaults, route_ids=cache) == (600, 0)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    assert not any("routes" in s for s in statements)
    # SQLite: insert calls, read their ids, insert attempts, read the minute aggregates the
    # batch touches, upsert them; PostgreSQL: the staging DDL (the COPYs, the merge and the
    # minute aggregates go through the driver connection, unseen by SQLAlchemy's events)
    assert 1 <= len(statements) <= 5, statements
    assert await _count(sessionmaker, Attempt) == 1 + 400 * 2 + 200


def test_route_id_cache_lookup_add_and_bound() -> None:
    import pytest

    from hedgerow.controller.store.ingest import RouteIdCache

    cache = RouteIdCache(max_entries=2)
    cache.add({("a", "m"): 1, ("b", "m"): 2})
    assert cache.lookup([("a", "m"), ("c", "m")]) == ({("a", "m"): 1}, [("c", "m")])
    cache.add({("c", "m"): 3})  # past the bound: starts again
    assert len(cache) == 1 and cache.lookup([("a", "m")]) == ({}, [("a", "m")])
    with pytest.raises(ValueError, match="max_entries"):
        RouteIdCache(max_entries=0)


async def test_timestamps_are_stored_as_every_other_writer_stores_them(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import text

    whole_second = datetime(2026, 11, 25, 6, 0, 0, tzinfo=UTC)  # no microseconds: the edge case
    await _ingest(sessionmaker, [call_factory("edge", started_at=whole_second)], route_defaults(Settings()))
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(Call).where(Call.started_at >= whole_second)) == 1
        assert await session.scalar(select(Call.started_at)) == whole_second
        if session.get_bind().dialect.name == "sqlite":  # the text SQLAlchemy itself writes and compares
            stored = await session.scalar(text("SELECT started_at FROM calls"))
            assert stored == "2026-11-25 06:00:00.000000"


async def test_each_attempt_is_stored_under_its_own_call(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """New ids are matched to their calls both when every call is new and when some were stored."""
    defaults = route_defaults(Settings())
    first = [call_factory(f"id{i:02d}", primary_ttft_s=0.1 + i / 100, route=f"r{i % 3}") for i in range(0, 40, 2)]
    assert await _ingest(sessionmaker, first, defaults) == (20, 0)  # all new
    mixed = [call_factory(f"id{i:02d}", primary_ttft_s=0.1 + i / 100, route=f"r{i % 3}") for i in range(40)]
    assert await _ingest(sessionmaker, mixed, defaults) == (20, 20)  # every other one stored already
    async with sessionmaker() as session:
        pairs = (await session.execute(select(Call.request_id, Call.ttft_s, Attempt.first_token_s).join(Attempt))).all()
    assert len(pairs) == 40
    for request_id, ttft_s, first_token_s in pairs:
        assert first_token_s == ttft_s == pytest.approx(0.1 + int(request_id[2:]) / 100), request_id
