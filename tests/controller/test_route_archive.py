"""Archived routes in the store: ingest refuses them (also through a stale route id cache, once it
starts again), the cap does not count them, ticks and the overview skip them, history stays.

Every test runs on SQLite and PostgreSQL (the ``sessionmaker`` fixture).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.errors import RouteArchived, RouteLimitExceeded, UnknownRoute
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.routes_admin import archive_route, configure_route, restore_route
from hedgerow.controller.store.ingest import RouteIdCache, ingest_calls, route_defaults
from hedgerow.controller.store.models import Call
from hedgerow.controller.store.overview import route_overview
from hedgerow.controller.store.queries import get_history, get_threshold, list_routes, list_thresholds
from hedgerow.settings import Settings
from tests.conftest import CallFactory

NOW = datetime.now(UTC).replace(microsecond=0)


def _records(call_factory: CallFactory, prefix: str, n: int, route: str = "summarize") -> list[CallRecord]:
    return [call_factory(f"{prefix}{i}", route=route, started_at=NOW - timedelta(seconds=i + 1)) for i in range(n)]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _ingest(
    sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord], **kwargs: Any
) -> tuple[int, int]:
    async with sessionmaker() as session, session.begin():
        return await ingest_calls(session, records, defaults=route_defaults(Settings()), **kwargs)


async def test_ingest_refuses_archived_routes_and_a_stale_cache_within_its_age(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    clock = _Clock()
    cache = RouteIdCache(max_age_s=5.0, clock=clock)
    resolved: dict[tuple[str, str], int] = {}
    await _ingest(sessionmaker, _records(call_factory, "a", 3), route_ids=cache, resolved=resolved)
    cache.add(resolved)
    await archive_route(sessionmaker, "summarize", "m1", actor="ops", now=NOW)

    # without the cache (another process, or one that never saw the route): refused at once
    with pytest.raises(RouteArchived, match=r"'summarize'.*archived"):
        await _ingest(sessionmaker, _records(call_factory, "b", 2))
    # a process that archived it forgets it; one that did not trusts its cache up to max_age_s
    assert await _ingest(sessionmaker, _records(call_factory, "c", 1), route_ids=cache) == (1, 0)
    clock.now = 5.1
    with pytest.raises(RouteArchived):
        await _ingest(sessionmaker, _records(call_factory, "d", 1), route_ids=cache)
    cache.add(resolved)
    cache.forget("summarize", "m1")
    with pytest.raises(RouteArchived):
        await _ingest(sessionmaker, _records(call_factory, "e", 1), route_ids=cache)
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(Call)) == 4


async def test_archived_routes_leave_the_cap_ticks_lists_and_overview(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(max_routes=2, max_models_per_route=1)
    for name in ("one", "two"):
        await _ingest(sessionmaker, _records(call_factory, name, 2, route=name), max_routes=2)
    with pytest.raises(RouteLimitExceeded):
        await _ingest(sessionmaker, _records(call_factory, "three", 1, route="three"), max_routes=2)
    await run_tick(sessionmaker, settings, now=NOW)
    archived = await archive_route(sessionmaker, "two", "m1", actor="ops", now=NOW + timedelta(seconds=1))
    assert archived.route["archived_by"] == "ops" and archived.history is not None
    again = await archive_route(sessionmaker, "two", "m1", actor="someone else", now=NOW + timedelta(seconds=9))
    assert again.history is None and again.route["archived_at"] == archived.route["archived_at"]
    assert again.route["archived_by"] == "ops"

    await _ingest(sessionmaker, _records(call_factory, "three", 1, route="three"), max_routes=2)
    ticked = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=60))
    assert sorted(row["route"] for row in ticked) == ["one", "three"]
    async with sessionmaker() as session:
        assert [r["route"] for r in await list_routes(session)] == ["one", "three"]
        assert [r["route"] for r in await list_routes(session, archived=True)] == ["two"]
        assert [t["route"] for t in await list_thresholds(session)] == ["one", "three"]
        assert [r["route"] for r in await route_overview(session, NOW)] == ["one", "three"]
        with pytest.raises(UnknownRoute, match="archived"):
            await get_threshold(session, "two", "m1")
        history = await get_history(session, "two", "m1")
    assert history[0]["reason"] == "archived" and len(history) == 2

    with pytest.raises(RouteArchived):
        await configure_route(sessionmaker, settings, "two", "m1", {"budget": 0.2}, replace=False, actor="ops")
    with pytest.raises(RouteLimitExceeded, match="not restored"):
        await restore_route(sessionmaker, settings, "two", "m1", actor="ops")
    await archive_route(sessionmaker, "three", "m1", actor="ops")
    restored = await restore_route(sessionmaker, settings, "two", "m1", actor="ops")
    assert restored.route["archived_at"] is None and restored.history is not None
    assert restored.history["details"]["changes"]["archived_at"]["to"] is None
    async with sessionmaker() as session:
        assert [t["route"] for t in await list_thresholds(session)] == ["one", "two"]  # served again at once


async def test_the_weekly_report_has_no_row_for_an_archived_route_after_its_week(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    from hedgerow.controller.report.report import IsoWeek
    from hedgerow.controller.report.report_store import weekly_report

    await _ingest(sessionmaker, _records(call_factory, "a", 3) + _records(call_factory, "k", 3, route="keep"))
    await run_tick(sessionmaker, Settings(), now=NOW)
    await archive_route(sessionmaker, "summarize", "m1", actor="ops", now=NOW + timedelta(seconds=1))
    await _ingest(sessionmaker, [call_factory("k-late", route="keep", started_at=NOW + timedelta(days=7))])
    await run_tick(sessionmaker, Settings(), now=NOW + timedelta(days=7, seconds=1))
    week = IsoWeek.of(NOW)
    this_week = await weekly_report(sessionmaker, week, now=NOW + timedelta(days=8))
    assert [r["route"] for r in this_week["routes"]] == ["keep", "summarize"]
    next_week = await weekly_report(sessionmaker, IsoWeek.of(NOW + timedelta(days=7)), now=NOW + timedelta(days=15))
    assert [r["route"] for r in next_week["routes"]] == ["keep"]
