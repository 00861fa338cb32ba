"""The scheduler ticks by itself, only while holding the lease; a second process waits its turn."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import NoReturn

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import ThresholdHistory
from hedgerow.settings import Settings
from tests.conftest import CallFactory


@pytest.mark.parametrize("tick_in", ["loop", "process"])
async def test_only_the_lease_holder_ticks_and_hands_over(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, tick_in: str
) -> None:
    # A 6 s lease renewed at every 0.3 s tick: a renewal held up by a loaded machine for less than
    # 5 s does not let the second take over. The hand-over below needs no expiry (the first
    # releases the lease at shutdown).
    settings = Settings(controller_interval_s=0.3, lease_ttl_s=6.0, controller_tick_in=tick_in)
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, [call_factory("a")], defaults=route_defaults(settings))
    first = ControllerScheduler(sessionmaker, settings, holder="first")
    second = ControllerScheduler(sessionmaker, settings, holder="second")
    first.start()
    deadline = time.monotonic() + 30  # the first takes the lease at start (polled: a loaded machine)
    while not first.holding and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert first.holding, "the first scheduler did not take the lease at start"
    second.start()
    try:
        deadline = time.monotonic() + 90  # ticks every 0.3 s; a loaded machine may take far longer
        while first.ticks < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert first.ticks >= 3 and first.holding
        assert second.ticks == 0 and not second.holding
        assert await second.tick() is None  # an explicit tick is refused too
        await first.shutdown()  # releases the lease
        deadline = time.monotonic() + 30
        while second.ticks < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert second.ticks >= 1 and second.holding
    finally:
        await first.shutdown()
        await second.shutdown()
    async with sessionmaker() as session:
        ticks = await session.scalar(select(func.sum(ThresholdHistory.repeats)))
    assert ticks == first.ticks + second.ticks  # each tick is a row or a repeat of one (one route)


async def test_a_lost_lease_is_logged_once_when_the_jobs_renew_at_once(
    sessionmaker: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tick, rollup and report jobs renew on their own; when the store goes away under two
    renewals at once, ``lease_lost`` is one line, and each failure one line without a traceback."""
    from hedgerow.controller import scheduler as module

    scheduler = ControllerScheduler(sessionmaker, Settings(), holder="only")
    assert await scheduler.renew()

    async def store_down(*_args: object, **_kwargs: object) -> NoReturn:
        await asyncio.sleep(0.05)  # both renewals are under way before either fails
        raise OSError("connection refused\nsecond line")

    monkeypatch.setattr(module, "acquire_lease", store_down)
    caplog.set_level(logging.INFO)
    caplog.clear()
    assert list(await asyncio.gather(scheduler.renew(), scheduler.renew())) == [False, False]
    lost = [r for r in caplog.records if r.getMessage().startswith("lease_lost")]
    failures = [r for r in caplog.records if "could not renew" in r.getMessage()]
    assert len(lost) == 1
    assert len(failures) == 2 and all(r.exc_info is None for r in failures)
    assert failures[0].getMessage() == "could not renew the controller lease: OSError: connection refused"
