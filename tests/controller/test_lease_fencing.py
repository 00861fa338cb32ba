"""A leader that cannot renew steps down before its lease can pass on; a stale publish is refused.

The scheduler renews through a pool of its own; here that pool has one connection, which the
test holds, so every renewal waits (the leader's own store connection is what is blocked, not
the database). The leader must stop counting itself the holder before the TTL has passed since
its last renewal, start no tick, and, once another holder took the expired lease, a publish in
its name must be refused inside the publishing transaction (nothing written).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.jobs import run_tick
from hedgerow.controller.lease import CONTROLLER_LEASE, LeaseLost, acquire_lease, check_lease_held, lease_holder
from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.db import make_engine, make_sessionmaker
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Threshold, ThresholdHistory
from hedgerow.settings import Settings
from tests.conftest import CallFactory

TTL_S = 4.0


async def _published(sessionmaker: async_sessionmaker[AsyncSession]) -> tuple[int, int]:
    """(threshold rows, history rows) in the store."""
    async with sessionmaker() as session:
        thresholds = await session.scalar(select(func.count()).select_from(Threshold))
        history = await session.scalar(select(func.count()).select_from(ThresholdHistory))
    return int(thresholds or 0), int(history or 0)


async def test_blocked_renewals_step_down_before_the_ttl_and_a_stale_publish_is_refused(
    migrated_url: str, call_factory: CallFactory
) -> None:
    settings = Settings(lease_ttl_s=TTL_S, controller_interval_s=3600.0)
    jobs_engine = make_engine(migrated_url)
    lease_engine = make_engine(migrated_url, pool_size=1, max_overflow=0, pool_timeout=120)
    jobs = make_sessionmaker(jobs_engine)
    async with jobs() as session, session.begin():
        await ingest_calls(session, [call_factory(f"c{i}") for i in range(5)], defaults=route_defaults(settings))
    leader = ControllerScheduler(jobs, settings, holder="old", lease_sessionmaker=make_sessionmaker(lease_engine))
    changes: list[bool] = []
    leader.on_lease = changes.append
    held = None
    try:
        assert await leader.renew() and leader.holding
        renewed = time.monotonic()  # the renewal started before this
        held = await lease_engine.connect()  # the lease pool's only connection: renewals now wait
        await held.exec_driver_sql("SELECT 1")
        leader.start()
        samples: list[tuple[float, bool]] = []
        while (elapsed := time.monotonic() - renewed) < TTL_S + 1.0:
            samples.append((elapsed, leader.holding))
            await asyncio.sleep(0.05)
        late = [elapsed for elapsed, holding in samples if holding and elapsed >= TTL_S]
        assert not late, f"still counted itself the holder {late[0]:.2f} s after its last renewal (TTL {TTL_S} s)"
        stepped_down = [elapsed for elapsed, holding in samples if not holding]
        assert stepped_down and stepped_down[0] < TTL_S, samples
        assert changes == [True, False], changes  # acquired, then lost (logged and reported once each)
        assert await leader.tick() is None  # no tick while it cannot renew
        assert leader.ticks == 0

        # the lease expired in the store: another holder takes it
        deadline = time.monotonic() + 30
        while not await acquire_lease(jobs, CONTROLLER_LEASE, "new", 60.0):
            assert time.monotonic() < deadline, "the expired lease could not be taken"
            await asyncio.sleep(0.2)
        assert (await lease_holder(jobs, CONTROLLER_LEASE) or ("",))[0] == "new"

        # a publish in the old holder's name is refused in its own transaction: nothing written
        with pytest.raises(LeaseLost, match="new holds it"):
            await run_tick(jobs, settings, fence=partial(check_lease_held, name=CONTROLLER_LEASE, holder="old"))
        assert await _published(jobs) == (0, 0)
        # the new holder's publish goes through the same fence
        rows = await run_tick(jobs, settings, fence=partial(check_lease_held, name=CONTROLLER_LEASE, holder="new"))
        assert len(rows) == 1 and await _published(jobs) == (1, 1)

        # the old leader's pool is free again: its renewal finds the lease taken, it stays out
        await held.close()
        held = None
        assert not await leader.renew() and not leader.holding
        assert await leader.tick() is None
        assert await _published(jobs) == (1, 1)
    finally:
        if held is not None:
            await held.close()
        await leader.shutdown()
        await lease_engine.dispose()
        await jobs_engine.dispose()


async def test_the_publish_fence_refuses_an_expired_or_released_lease(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(lease_ttl_s=TTL_S)
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, [call_factory("c")], defaults=route_defaults(settings))
    fence = partial(check_lease_held, name=CONTROLLER_LEASE, holder="me")
    with pytest.raises(LeaseLost, match="gone"):
        await run_tick(sessionmaker, settings, fence=fence)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "me", 0.05)
    await asyncio.sleep(0.1)
    with pytest.raises(LeaseLost, match="expired"):
        await run_tick(sessionmaker, settings, fence=fence)
    assert await _published(sessionmaker) == (0, 0)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "me", 60.0)
    assert len(await run_tick(sessionmaker, settings, fence=fence)) == 1


async def test_the_hold_lapses_at_the_safety_fraction_of_the_ttl(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """Counted from the start of the last successful renewal, on the monotonic clock given."""
    clock = [1000.0]
    scheduler = ControllerScheduler(sessionmaker, Settings(lease_ttl_s=30.0), holder="me", clock=lambda: clock[0])
    assert scheduler.safe_hold_s == pytest.approx(22.5)  # LEASE_SAFETY_FRACTION 0.75 of 30 s
    assert await scheduler.renew() and scheduler.holding
    clock[0] += 22.4
    assert scheduler.holding
    clock[0] += 0.2
    assert not scheduler.holding  # no renewal for 22.6 s: it no longer acts as the holder
    assert await scheduler.renew() and scheduler.holding  # a renewal that succeeds restores it
    await scheduler.shutdown()
