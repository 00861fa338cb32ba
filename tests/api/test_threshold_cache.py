"""The threshold table from memory: counter-checked at most once per interval, 304s without SQL.

The change counter is raised by triggers (migration 0008) on every write of ``thresholds`` and
update of ``routes``: a write made by "another process" (a session of its own, or a second app
on the same store) is seen at the next check, one made through the app at once.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import delete, event, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.api._threshold_cache import ThresholdCache
from hedgerow.api.thresholds import render_table
from hedgerow.controller.store.change_counters import read_change_counter
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Route, Threshold, utc_now
from hedgerow.settings import Settings
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import recent_calls


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _counter(sessionmaker: async_sessionmaker[AsyncSession]) -> int | None:
    async with sessionmaker() as session:
        return await read_change_counter(session)


async def _publish(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, route: str = "summarize"
) -> int:
    """Create a route by ingest and publish a threshold for it directly (as a tick would)."""
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, [call_factory(f"{route}-1", route=route)], defaults=route_defaults(Settings()))
        route_id = await session.scalar(select(Route.id).where(Route.route == route))
        session.add(
            Threshold(route_id=route_id, hedge_after_s=1.5, enabled=True, source="controller", version=1,
                      updated_at=utc_now())
        )  # fmt: skip
    assert route_id is not None
    return int(route_id)


async def test_triggers_raise_the_counter_on_every_write_the_table_shows(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    start = await _counter(sessionmaker)
    assert start == 0
    async with sessionmaker() as session, session.begin():  # a new route alone: no threshold, no change
        await ingest_calls(session, [call_factory("only-route", route="other")], defaults=route_defaults(Settings()))
    assert await _counter(sessionmaker) == 0
    route_id = await _publish(sessionmaker, call_factory)
    assert await _counter(sessionmaker) == 1  # threshold inserted (its route row is new: no update)
    async with sessionmaker() as session, session.begin():
        await session.execute(update(Threshold).where(Threshold.route_id == route_id).values(hedge_after_s=1.7))
    assert await _counter(sessionmaker) == 2
    async with sessionmaker() as session, session.begin():
        await session.execute(update(Route).where(Route.id == route_id).values(budget=0.05))
    assert await _counter(sessionmaker) == 3
    async with sessionmaker() as session, session.begin():
        await session.execute(delete(Threshold).where(Threshold.route_id == route_id))
    assert await _counter(sessionmaker) == 4
    try:  # a rolled-back write leaves the counter as it was
        async with sessionmaker() as session, session.begin():
            await session.execute(update(Route).where(Route.id == route_id).values(budget=0.2))
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert await _counter(sessionmaker) == 4


async def test_cache_checks_the_counter_at_most_once_per_interval(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    route_id = await _publish(sessionmaker, call_factory)
    clock = FakeClock()
    cache = ThresholdCache(sessionmaker, render_table, check_interval_s=1.0, clock=clock)
    assert cache.fresh() is None
    first = await cache.current()
    assert (cache.counter_reads, cache.renders) == (1, 1) and b'"hedge_after_s":1.5' in first.body
    clock.now += 0.4  # within the first half of the interval: no check at all
    assert cache.fresh() is first and await cache.current() is first and cache.counter_reads == 1
    async with sessionmaker() as session, session.begin():  # "another process" publishes
        await session.execute(update(Threshold).where(Threshold.route_id == route_id).values(hedge_after_s=2.5))
    assert await cache.current() is first  # within the interval: still the old table, no I/O
    clock.now += 0.7
    second = await cache.current()
    assert (cache.counter_reads, cache.renders) == (2, 2)
    assert b'"hedge_after_s":2.5' in second.body and second.etag != first.etag
    clock.now += 5
    assert await cache.current() == second and (cache.counter_reads, cache.renders) == (3, 2)  # unchanged: no render
    cache.invalidate()
    assert cache.fresh() is None
    assert await cache.current() == second and cache.counter_reads == 4


async def test_a_poll_in_the_second_half_of_the_interval_checks_ahead_without_waiting(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    route_id = await _publish(sessionmaker, call_factory)
    clock = FakeClock()
    cache = ThresholdCache(sessionmaker, render_table, check_interval_s=1.0, clock=clock)
    first = await cache.current()
    async with sessionmaker() as session, session.begin():  # "another process" publishes
        await session.execute(update(Threshold).where(Threshold.route_id == route_id).values(hedge_after_s=2.5))
    clock.now += 0.6
    # answered from memory at once (no await reached the store before it returned) ...
    assert await cache.current() is first and cache.counter_reads == 1
    assert await cache.current() is first  # a second poll meanwhile starts no second check
    for _ in range(3000):  # ... while the check it started runs in the background (30 s: a loaded machine)
        if cache.renders == 2:
            break
        await asyncio.sleep(0.01)
    assert (cache.counter_reads, cache.renders) == (2, 2)
    second = await cache.current()  # the new table, checked at 100.6: fresh until 101.6, no I/O
    assert b'"hedge_after_s":2.5' in second.body and cache.counter_reads == 2
    # a change made through this process: the next poll waits for a check, never an older answer
    async with sessionmaker() as session, session.begin():
        await session.execute(update(Threshold).where(Threshold.route_id == route_id).values(hedge_after_s=3.5))
    cache.invalidate()
    cache.check_soon()
    assert b'"hedge_after_s":3.5' in (await cache.current()).body
    await cache.aclose()


async def test_304_polls_touch_no_database_and_a_second_app_sees_changes(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with (
        make_api(threshold_check_interval_s=3600) as (app, api),
        make_api(threshold_check_interval_s=0.2) as (
            other,
            other_api,
        ),
    ):
        assert (
            await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 60, 0.4)})
        ).status_code == 202
        assert (await api.post("/v1/controller/run")).json()["ran"] is True  # invalidates this app's cache
        table = await api.get("/v1/thresholds")
        [row] = table.json()["thresholds"]
        etag = table.headers["etag"]
        statements: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
            statements.append(statement)

        event.listen(app.state.engine.sync_engine, "before_cursor_execute", record)
        try:
            for _ in range(50):
                polled = await api.get("/v1/thresholds", headers={"If-None-Match": etag})
                assert polled.status_code == 304 and polled.headers["etag"] == etag
            assert (await api.get("/v1/thresholds")).content == table.content
        finally:
            event.remove(app.state.engine.sync_engine, "before_cursor_execute", record)
        assert statements == []

        # the second app (another serve process on the same store) changes the route: this app's
        # own PATCH would invalidate at once; the other app sees the first app's change at its check
        seen = (await other_api.get("/v1/thresholds")).json()["thresholds"]
        assert seen == [row]
        patched = await other_api.patch("/v1/routes/summarize", params={"model": "m1"}, json={"budget": 0.05})
        assert patched.status_code == 200
        assert (await other_api.get("/v1/thresholds")).json()["thresholds"][0]["budget"] == 0.05
        # the first app checks once an hour: still the table it rendered (no database read)
        assert (await api.get("/v1/thresholds", headers={"If-None-Match": etag})).status_code == 304
        app.state.thresholds.invalidate()  # what its next check would do, an hour later
        changed = await api.get("/v1/thresholds", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.json()["thresholds"][0]["budget"] == 0.05
        # and the other way round, by the other app's timer alone: a change made through the
        # first app reaches it after its 0.2 s interval (polled for up to 10 s: a loaded machine)
        assert (
            await api.patch("/v1/routes/summarize", params={"model": "m1"}, json={"budget": 0.2})
        ).status_code == 200
        reads = other.state.thresholds.counter_reads
        budget = None
        for _ in range(100):
            budget = (await other_api.get("/v1/thresholds")).json()["thresholds"][0]["budget"]
            if budget == 0.2:
                break
            await asyncio.sleep(0.1)
        assert budget == 0.2 and other.state.thresholds.counter_reads > reads
