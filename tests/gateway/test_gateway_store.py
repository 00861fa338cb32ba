"""``GatewayStore`` (``hedgerow gateway --db``) against real stores: records written in batches and
read back, a store that cannot be reached keeps them queued, a full queue drops the oldest, a
batch naming an archived route is dropped and counted, and thresholds go stale."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select, update

from hedgerow.cli.gateway_store import GatewayStore, migrate_store
from hedgerow.controller.store.db import make_sessionmaker
from hedgerow.controller.store.models import Route, Threshold, utc_now
from hedgerow.settings import Settings
from tests.conftest import make_call
from tests.helpers import stored_calls


async def test_records_are_written_in_batches_and_thresholds_read(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 's.db'}")
    await migrate_store(settings)
    async with GatewayStore(settings, flush_interval_s=0.05, batch_size=2, interval_s=0.05) as store:
        assert store.lookup("r", "m") is None  # nothing published yet
        for i in range(5):
            store.submit(make_call(f"call-{i}", route="r", model="m"))
        for _ in range(200):
            if store.written == 5:
                break
            await asyncio.sleep(0.02)
        assert (store.written, store.duplicates, store.dropped) == (5, 0, 0)
        async with make_sessionmaker(store._engine)() as session, session.begin():
            route_id = await session.scalar(select(Route.id).where(Route.route == "r"))
            assert route_id is not None
            session.add(
                Threshold(
                    route_id=route_id, hedge_after_s=0.7, enabled=True, source="controller", version=3,
                    updated_at=utc_now(),
                )
            )  # fmt: skip
        for _ in range(200):
            if store.lookup("r", "m") is not None:
                break
            await asyncio.sleep(0.02)
        assert store.lookup("r", "m") == (0.7, 3, True)
        store.max_stale_s = 0.0  # a table older than this is not trusted
        await asyncio.sleep(0.01)
        assert store.lookup("r", "m") is None
    assert await stored_calls(settings.database_url) == 5


async def test_an_unreachable_store_keeps_the_records_and_a_full_queue_drops_the_oldest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(database_url="postgresql+asyncpg://postgres:pw@127.0.0.1:9/nothing")
    store = GatewayStore(settings, flush_interval_s=0.05, batch_size=2, max_queue=3)
    async with store:  # the first read fails: no table, calls keep their policy's value
        assert store.lookup("r", "m") is None
        for i in range(5):
            store.submit(make_call(f"kept-{i}", route="r", model="m"))
        assert store.dropped == 2
        assert not await store.write_batch()  # after the writer's own attempt (one write at a time)
        assert [r.request_id for r in store.pending] == ["kept-2", "kept-3", "kept-4"]
    assert store.written == 0 and len(store.pending) == 3  # still there after the last attempt at exit
    assert "writing 2 record(s) failed" in caplog.text and "pw" not in caplog.text


async def test_a_batch_naming_an_archived_route_is_dropped_and_counted(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 's.db'}")
    await migrate_store(settings)
    store = GatewayStore(settings, flush_interval_s=60.0)
    async with store:
        store.submit(make_call("first", route="old", model="m"))
        assert await store.write_batch() and store.written == 1
        async with make_sessionmaker(store._engine)() as session, session.begin():
            await session.execute(update(Route).where(Route.route == "old").values(archived_at=utc_now()))
        store.submit(make_call("second", route="old", model="m"))
        assert await store.write_batch()
        assert (store.written, store.dropped, store.pending) == (1, 1, [])
    assert await stored_calls(settings.database_url) == 1
