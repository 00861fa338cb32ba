"""Group commit on SQLite: jobs in one transaction, each in its own savepoint, cancellations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.errors import StoreError
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.group_commit import GroupCommitWriter
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Call, MinuteAggregate
from hedgerow.settings import Settings
from tests.conftest import CallFactory

DEFAULTS = route_defaults(Settings())


@pytest.fixture
async def sqlite_sessionmaker(tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'group.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``condition()`` holds (the writer runs on the same loop)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class Gate:
    """A work function that ingests its records, first waiting for ``release`` when the job is
    ``gated``, and failing (after writing) when it is ``failing``."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def __call__(self, session: AsyncSession, job: tuple[str, list[Any]]) -> tuple[int, int]:
        name, records = job
        self.started.append(name)
        if name.startswith("gated"):
            await self.release.wait()
        result = await ingest_calls(session, records, defaults=DEFAULTS)
        if name.startswith("failing"):
            raise ValueError(f"{name} failed after writing")
        return result


async def _stored(sessionmaker: async_sessionmaker[AsyncSession], prefix: str) -> tuple[int, int, int]:
    """(calls, attempts, calls counted in the minute aggregates) of request ids starting ``prefix``."""
    async with sessionmaker() as session:
        calls = await session.scalar(select(func.count()).select_from(Call).where(Call.request_id.like(f"{prefix}%")))
        attempts = await session.scalar(
            select(func.count()).select_from(Attempt).join(Call).where(Call.request_id.like(f"{prefix}%"))
        )
        minutes = await session.scalar(select(func.coalesce(func.sum(MinuteAggregate.calls), 0)))
    return int(calls or 0), int(attempts or 0), int(minutes or 0)


async def _running(
    sessionmaker: async_sessionmaker[AsyncSession],
    work: Callable[[AsyncSession, tuple[str, list[Any]]], Awaitable[tuple[int, int]]],
    **kwargs: Any,
) -> GroupCommitWriter[tuple[str, list[Any]], tuple[int, int]]:
    writer: GroupCommitWriter[tuple[str, list[Any]], tuple[int, int]] = GroupCommitWriter(sessionmaker, work, **kwargs)
    writer.start()
    return writer


def _batch(prefix: str, call_factory: CallFactory, n: int = 3) -> list[Any]:
    return [call_factory(f"{prefix}-{i}", route=f"route-{i % 2}") for i in range(n)]


async def test_jobs_waiting_together_share_one_transaction_and_a_failing_one_rolls_back_alone(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    gate = Gate()
    committed: list[tuple[int, int]] = []
    writer = await _running(sqlite_sessionmaker, gate, on_commit=committed.append)
    try:
        first = asyncio.create_task(writer.submit(("gated", _batch("g", call_factory))))
        await until(lambda: writer.writing == 1)
        jobs = [(name, _batch(name[-1], call_factory)) for name in ("good-a", "failing-b", "good-c")]
        tasks = [asyncio.create_task(writer.submit(job)) for job in jobs]
        await until(lambda: writer.queued == 3)
        gate.release.set()
        results = await asyncio.gather(first, *tasks, return_exceptions=True)
    finally:
        await writer.aclose()
    assert results[0] == (3, 0) and results[1] == (3, 0) and results[3] == (3, 0)
    assert isinstance(results[2], ValueError) and "failing-b failed" in str(results[2])
    assert (writer.groups, writer.jobs) == (2, 4)  # the three waiting jobs made one group
    assert gate.started == ["gated", "good-a", "failing-b", "good-c"]
    assert committed == [(3, 0), (3, 0), (3, 0)]
    assert await _stored(sqlite_sessionmaker, "b-") == (0, 0, 9)  # b's rows and its counts rolled back
    assert (await _stored(sqlite_sessionmaker, "a-"))[:2] == (3, 3)
    assert (await _stored(sqlite_sessionmaker, "c-"))[:2] == (3, 3)


async def test_a_batch_posted_twice_in_one_group_is_counted_once(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    gate = Gate()
    writer = await _running(sqlite_sessionmaker, gate)
    try:
        first = asyncio.create_task(writer.submit(("gated", _batch("g", call_factory, 1))))
        await until(lambda: writer.writing == 1)
        batch = _batch("twice", call_factory, 4)
        tasks = [asyncio.create_task(writer.submit((f"copy{i}", batch))) for i in range(2)]
        await until(lambda: writer.queued == 2)
        gate.release.set()
        await first
        answers = await asyncio.gather(*tasks)
    finally:
        await writer.aclose()
    assert (writer.groups, writer.jobs) == (2, 3)
    assert answers == [(4, 0), (0, 4)]
    assert await _stored(sqlite_sessionmaker, "twice-") == (4, 4, 5)  # 4 + the gated job's 1


async def test_a_job_cancelled_while_queued_is_not_written_and_the_others_are(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    gate = Gate()
    writer = await _running(sqlite_sessionmaker, gate)
    try:
        first = asyncio.create_task(writer.submit(("gated", _batch("g", call_factory, 1))))
        await until(lambda: writer.writing == 1)
        dropped = asyncio.create_task(writer.submit(("dropped", _batch("d", call_factory))))
        kept = asyncio.create_task(writer.submit(("kept", _batch("k", call_factory))))
        await until(lambda: writer.queued == 2)
        dropped.cancel()
        gate.release.set()
        assert await first == (1, 0) and await kept == (3, 0)
        with pytest.raises(asyncio.CancelledError):
            await dropped
        assert "dropped" not in gate.started
        assert (await _stored(sqlite_sessionmaker, "d-"))[:2] == (0, 0)
        # never written: posted again, every record is new
        assert await writer.submit(("again", _batch("d", call_factory))) == (3, 0)
    finally:
        await writer.aclose()
    assert await _stored(sqlite_sessionmaker, "d-") == (3, 3, 7)


async def test_a_job_cancelled_during_its_write_is_committed_once(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    gate = Gate()
    committed: list[tuple[int, int]] = []
    writer = await _running(sqlite_sessionmaker, gate, on_commit=committed.append)
    try:
        task = asyncio.create_task(writer.submit(("gated", _batch("w", call_factory))))
        await until(lambda: gate.started == ["gated"])
        task.cancel()
        gate.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: writer.jobs == 1)
        assert committed == [(3, 0)]  # the caches and counters still learn it
        assert await _stored(sqlite_sessionmaker, "w-") == (3, 3, 3)
        # the client, having had no answer, posts it again: nothing is doubled
        assert await writer.submit(("again", _batch("w", call_factory))) == (0, 3)
    finally:
        await writer.aclose()
    assert await _stored(sqlite_sessionmaker, "w-") == (3, 3, 3)


async def test_a_failed_commit_fails_every_job_of_the_group_and_the_writer_goes_on(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    async def work(session: AsyncSession, job: tuple[str, list[Any]]) -> tuple[int, int]:
        name, records = job
        result = await ingest_calls(session, records, defaults=DEFAULTS)
        if name == "breaks-commit":  # a foreign key checked only at COMMIT
            connection = await session.connection()
            await connection.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
            await connection.exec_driver_sql(
                "INSERT INTO attempts (call_id, attempt_index, upstream, role, start_s, end_s, outcome, "
                "completion_tokens, prompt_tokens_estimated, call_started_at) "
                "VALUES (999999, 0, 'a', 'primary', 0, 1, 'won', 0, 0, '2026-01-01 00:00:00.000000')"
            )
        return result

    writer = await _running(sqlite_sessionmaker, work)
    try:
        # both submitted before the writer task runs again: one group
        results = await asyncio.gather(
            writer.submit(("fine", _batch("f", call_factory))),
            writer.submit(("breaks-commit", _batch("x", call_factory))),
            return_exceptions=True,
        )
        assert writer.groups == 1
        assert all("FOREIGN KEY" in str(r) for r in results), results
        assert await _stored(sqlite_sessionmaker, "") == (0, 0, 0)
        assert await writer.submit(("fine", _batch("f", call_factory))) == (3, 0)
    finally:
        await writer.aclose()


async def test_close_writes_what_is_queued_then_refuses(
    sqlite_sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    gate = Gate()
    writer = await _running(sqlite_sessionmaker, gate)
    first = asyncio.create_task(writer.submit(("gated", _batch("g", call_factory, 1))))
    await until(lambda: writer.writing == 1)
    queued = asyncio.create_task(writer.submit(("late", _batch("l", call_factory))))
    await until(lambda: writer.queued == 1)
    closing = asyncio.create_task(writer.aclose())
    await asyncio.sleep(0)
    with pytest.raises(StoreError, match="not running"):
        await writer.submit(("refused", _batch("r", call_factory)))
    gate.release.set()
    await closing
    assert await first == (1, 0) and await queued == (3, 0)
    assert (await _stored(sqlite_sessionmaker, "l-"))[:2] == (3, 3)
