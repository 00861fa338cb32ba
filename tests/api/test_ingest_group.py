"""POST /v1/calls on SQLite: batches that wait together are written in one group commit.

SQLite's write lock is held from a connection of the test's own while the batches are posted,
so the writer waits on it with one batch and the others queue into the next group.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from hedgerow.api.app import create_app
from hedgerow.controller.store.models import Call, MinuteAggregate, Route
from hedgerow.settings import Settings
from tests.conftest import CallFactory


@asynccontextmanager
async def sqlite_api(path: Path, **overrides: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{path}",
        controller_interval_s=3600.0,
        allowed_hosts="hedgerow.test",
        **overrides,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow.test") as client:
            yield app, client


@contextmanager
def write_lock(path: Path) -> Iterator[None]:
    """Hold SQLite's write lock of the file at ``path`` (another writer waits in its busy handler)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def post_in_one_group(app: Any, api: httpx.AsyncClient, path: Path, bodies: list[Any]) -> list[httpx.Response]:
    """Post a filler batch the writer waits with, then ``bodies`` together; returns their answers."""
    writer = app.state.ingest_writer
    groups = writer.groups
    with write_lock(path):
        filler = asyncio.create_task(api.post("/v1/calls", json={"calls": []}))
        await until(lambda: writer.writing == 1)
        posts = [asyncio.create_task(api.post("/v1/calls", json=body)) for body in bodies]
        await until(lambda: writer.queued == len(bodies))
    assert (await filler).status_code == 202
    answers = await asyncio.gather(*posts)
    assert writer.groups == groups + 2  # the filler's group, then one for all of ``bodies``
    return answers


async def _count(app: Any, what: Any) -> int:
    async with app.state.sessionmaker() as session:
        return int(await session.scalar(select(func.coalesce(what, 0))) or 0)


async def test_a_batch_refused_in_a_group_gets_its_own_422_and_the_others_are_stored(
    tmp_path: Path, call_factory: CallFactory
) -> None:
    path = tmp_path / "group.db"
    async with sqlite_api(path, max_routes=1) as (app, api):
        assert (await api.post("/v1/calls", json={"calls": [call_factory("first").to_dict()]})).status_code == 202
        good = [call_factory(f"good{i}").to_dict() for i in range(3)]
        bad = [call_factory(f"bad{i}").to_dict() for i in range(3)]
        bad[2]["route"] = "a-second-route"  # past max_routes=1: refused when written
        answers = await post_in_one_group(app, api, path, [{"calls": good}, {"calls": bad}])
        assert answers[0].status_code == 202 and answers[0].json() == {"accepted": 3, "duplicates": 0}
        assert answers[1].status_code == 422
        detail = answers[1].json()["detail"]
        assert (detail["index"], detail["field"]) == (2, "route") and "max_routes" in detail["message"]
        assert await _count(app, func.count(Call.id)) == 4
        assert await _count(app, func.count(Route.id)) == 1
        assert await _count(app, func.sum(MinuteAggregate.calls)) == 4


async def test_a_batch_posted_twice_in_one_group_is_counted_once(tmp_path: Path, call_factory: CallFactory) -> None:
    path = tmp_path / "group.db"
    async with sqlite_api(path) as (app, api):
        batch = {"calls": [call_factory(f"twice{i}", route=f"r{i % 2}").to_dict() for i in range(5)]}
        answers = await post_in_one_group(app, api, path, [batch, batch])
        assert sorted(a.json()["accepted"] for a in answers) == [0, 5]
        assert sorted(a.json()["duplicates"] for a in answers) == [0, 5]
        assert await _count(app, func.count(Call.id)) == 5
        assert await _count(app, func.sum(MinuteAggregate.calls)) == 5
        metrics = (await api.get("/metrics")).text
        assert "hedgerow_records_accepted_total 5.0" in metrics
        assert "hedgerow_records_duplicate_total 5.0" in metrics
