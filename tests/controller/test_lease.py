"""Lease: one holder at a time, renewal by the holder, hand-over after expiry, races."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.lease import acquire_lease, release_lease

T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


async def test_two_holders_and_expiry(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    assert await acquire_lease(sessionmaker, "jobs", "a", 30, now=T0)
    assert not await acquire_lease(sessionmaker, "jobs", "b", 30, now=T0 + timedelta(seconds=1))
    assert await acquire_lease(sessionmaker, "jobs", "a", 30, now=T0 + timedelta(seconds=20))
    # a's renewal at +20 s holds until +50 s
    assert not await acquire_lease(sessionmaker, "jobs", "b", 30, now=T0 + timedelta(seconds=45))
    assert await acquire_lease(sessionmaker, "jobs", "b", 30, now=T0 + timedelta(seconds=51))
    assert not await acquire_lease(sessionmaker, "jobs", "a", 30, now=T0 + timedelta(seconds=52))
    # another lease name is independent
    assert await acquire_lease(sessionmaker, "other", "a", 30, now=T0 + timedelta(seconds=52))


async def test_release_hands_over_at_once(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    assert await acquire_lease(sessionmaker, "jobs", "a", 30, now=T0)
    assert not await release_lease(sessionmaker, "jobs", "b")
    assert await release_lease(sessionmaker, "jobs", "a")
    assert await acquire_lease(sessionmaker, "jobs", "b", 30, now=T0 + timedelta(seconds=1))


async def test_race_for_a_free_lease_has_one_winner(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    for round_ in range(3):
        name = f"race{round_}"
        wins = await asyncio.gather(*(acquire_lease(sessionmaker, name, f"h{i}", 30, now=T0) for i in range(4)))
        assert sum(wins) == 1
