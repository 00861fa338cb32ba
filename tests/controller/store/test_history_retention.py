"""Threshold history is pruned: held decisions after ``history_retention_s``, applied changes
after the longer ``applied_history_retention_s``, each route's newest row kept (issue 13 point 7)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.store.models import Route, ThresholdHistory
from hedgerow.controller.store.retention import prune_history, run_retention
from hedgerow.settings import Settings

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def _row(route_id: int, age: timedelta, applied: bool, reason: str) -> ThresholdHistory:
    return ThresholdHistory(
        route_id=route_id, computed_at=NOW - age, last_at=NOW - age, previous_hedge_after_s=1.0,
        hedge_after_s=1.0, applied=applied,
        reason=reason, source="controller", window_s=3600.0, samples=0, censored=0, budget=0.1,
    )  # fmt: skip


async def test_old_history_is_pruned_applied_kept_longest_newest_kept(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    async with sessionmaker() as session, session.begin():
        routes = [
            Route(
                route=f"r{i}",
                model="m",
                enabled=True,
                budget=0.1,
                default_hedge_after_s=2.0,
                min_hedge_after_s=0.05,
                max_hedge_after_s=30.0,
                created_at=NOW,
                updated_at=NOW,
            )
            for i in range(2)
        ]
        session.add_all(routes)
        await session.flush()
        a, b = routes[0].id, routes[1].id
        session.add_all(
            [
                _row(a, 400 * DAY, True, "applied-ancient"),
                _row(a, 100 * DAY, True, "applied-old"),
                _row(a, 100 * DAY, False, "held-old"),
                _row(a, 10 * DAY, False, "held-recent"),
                _row(b, 500 * DAY, False, "b-only-row"),  # a route's newest row stays, however old
            ]
        )
    settings = Settings(database_url="sqlite+aiosqlite:///:memory:")
    assert (settings.history_retention_s, settings.applied_history_retention_s) == (30 * 86400, 365 * 86400)
    report = await run_retention(sessionmaker, settings, now=NOW)
    assert report.pruned_history == 2 and report.to_dict()["pruned_history"] == 2
    async with sessionmaker() as session:
        kept = set((await session.scalars(select(ThresholdHistory.reason))).all())
    assert kept == {"applied-old", "held-recent", "b-only-row"}
    assert await prune_history(sessionmaker, held_before=NOW, applied_before=NOW, batch_rows=1) == 1
    async with sessionmaker() as session:
        kept = set((await session.scalars(select(ThresholdHistory.reason))).all())
    assert kept == {"held-recent", "b-only-row"}  # the newest of each route


def test_applied_history_is_kept_at_least_as_long_as_held() -> None:
    with pytest.raises(ValidationError, match="applied changes are kept longest"):
        Settings(history_retention_s=86400 * 10, applied_history_retention_s=86400)
