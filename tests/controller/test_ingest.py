"""Ingest: rows written once per request_id, routes created on first sight, concurrent batches."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select

from hedgerow.controller.ingest import ingest_calls, route_defaults
from hedgerow.controller.models import Attempt, Call, Route
from hedgerow.settings import Settings


async def _count(sessionmaker, model) -> int:
    async with sessionmaker() as session:
        return await session.scalar(select(func.count()).select_from(model))


async def _ingest(sessionmaker, records, defaults):
    async with sessionmaker() as session, session.begin():
        return await ingest_calls(session, records, defaults=defaults)


async def test_ingest_is_idempotent(sessionmaker, call_factory) -> None:
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
    assert routes[0].created_at.tzinfo is not None and routes[0].created_at.utcoffset().total_seconds() == 0


async def test_duplicates_inside_one_batch(sessionmaker, call_factory) -> None:
    defaults = route_defaults(Settings())
    batch = [call_factory("same"), call_factory("same"), call_factory("other")]
    assert await _ingest(sessionmaker, batch, defaults) == (2, 1)
    assert await _ingest(sessionmaker, [call_factory("other"), call_factory("new")], defaults) == (1, 1)
    assert await _count(sessionmaker, Call) == 3


async def test_the_first_copy_of_a_duplicate_wins(sessionmaker, call_factory) -> None:
    batch = [call_factory("dup", primary_ttft_s=0.5), call_factory("dup", primary_ttft_s=3.0)]
    assert await _ingest(sessionmaker, batch, route_defaults(Settings())) == (1, 1)
    async with sessionmaker() as session:
        assert await session.scalar(select(Call.ttft_s).where(Call.request_id == "dup")) == 0.5


async def test_round_trip_of_stored_fields(sessionmaker, call_factory) -> None:
    record = call_factory("x1", hedge_after_s=1.0, primary_ttft_s=3.0, backup_ttft_s=0.25)
    await _ingest(sessionmaker, [record], route_defaults(Settings()))
    async with sessionmaker() as session:
        call = await session.scalar(select(Call).where(Call.request_id == "x1"))
        attempts = (
            await session.scalars(select(Attempt).where(Attempt.call_id == call.id).order_by(Attempt.attempt_index))
        ).all()
    assert call.started_at == record.started_at
    assert (call.hedged, call.hedge_reason, call.winner, call.ttft_s) == (True, "ttft_timeout", "backup", 1.25)
    assert [(a.role, a.outcome, a.first_token_s, a.end_s) for a in attempts] == [
        ("primary", "cancelled", None, 1.25),
        ("backup", "won", 1.25, 2.25),
    ]


async def test_concurrent_batches_count_each_call_once(sessionmaker, call_factory) -> None:
    defaults = route_defaults(Settings())
    batches = [[call_factory(f"c{j}", route=f"route{j % 3}") for j in range(i, i + 30)] for i in range(0, 60, 10)]
    results = await asyncio.gather(*(_ingest(sessionmaker, b, defaults) for b in batches))
    assert sum(accepted for accepted, _ in results) == 60 + 20  # ids c0..c79 overlap
    assert sum(accepted + dup for accepted, dup in results) == 6 * 30
    assert await _count(sessionmaker, Call) == 80
    assert await _count(sessionmaker, Route) == 3
