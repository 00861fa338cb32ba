"""The controller tick in a worker process: same rows, same fence, killed at shutdown, logs kept.

Each test runs on a SQLite file and on PostgreSQL. A tick is held in its publish by a lock the
test takes on the store (PostgreSQL: the routes' rows; SQLite: the database's write lock), so
that a shutdown or a kill lands while the worker's transaction is open.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from hedgerow.controller._tick_worker import WORKER_NICE, TickWorker, TickWorkerError
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.lease import CONTROLLER_LEASE, LeaseLost, acquire_lease, lease_holder
from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.db import make_engine, make_sessionmaker
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Lease, Threshold, ThresholdHistory
from hedgerow.settings import Settings
from tests.conftest import CallFactory
from tests.serve_process import running_serve

#: Seconds allowed for what should take well under one on an idle machine (a loaded one is slow).
WIDE_S = 120.0


async def _seed(sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, settings: Settings) -> None:
    """Three routes with 60 calls each over the last 20 minutes, TTFTs spread so that a threshold is set."""
    now = datetime.now(UTC)
    calls = [
        call_factory(
            f"{route}-{i}",
            route=route,
            started_at=now - timedelta(seconds=20 * i),
            primary_ttft_s=0.2 + 0.05 * (i % 17) + (2.5 if i % 11 == 0 else 0.0),
        )
        for route in ("alpha", "beta", "gamma")
        for i in range(60)
    ]
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, calls, defaults=route_defaults(settings))


async def _published(sessionmaker: async_sessionmaker[AsyncSession]) -> tuple[int, int]:
    """(threshold rows, history rows) in the store."""
    async with sessionmaker() as session:
        thresholds = await session.scalar(select(func.count()).select_from(Threshold))
        history = await session.scalar(select(func.count()).select_from(ThresholdHistory))
    return int(thresholds or 0), int(history or 0)


async def _wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout_s: float = WIDE_S, what: str = "condition", every_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(every_s)


async def _tick_starting(scheduler: ControllerScheduler) -> None:
    """Wait until the scheduler renewed and hands its first tick to a worker still starting.

    A spawned worker imports the estimation stack before it can tick (well over the few
    milliseconds the caller needs next to take the publish's lock).
    """
    await _wait_for(lambda: asyncio.sleep(0, scheduler.tick_worker is not None), what="the tick", every_s=0.005)


@asynccontextmanager
async def _publish_blocked(url: str) -> AsyncIterator[AsyncConnection]:
    """Hold what a tick's publish needs first (PostgreSQL: the routes' rows, SQLite: the write lock).

    Yields the connection holding it (its transaction is committed at the end): on SQLite no other
    connection can write meanwhile.
    """
    engine = make_engine(url)
    try:
        async with engine.connect() as connection:
            if connection.dialect.name == "postgresql":
                await connection.execute(text("SELECT id FROM routes FOR UPDATE"))
            else:
                await connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield connection
            finally:
                await connection.commit()
    finally:
        await engine.dispose()


async def _tick_in_publish(url: str, scheduler: ControllerScheduler) -> None:
    """Wait until the scheduler's worker is up and (PostgreSQL: seen) waiting in the tick's publish."""

    async def worker_up() -> bool:
        worker = scheduler.tick_worker
        return worker is not None and bool(worker.pids)

    await _wait_for(worker_up, what="the tick worker to start")
    worker = scheduler.tick_worker
    assert worker is not None
    await _wait_for(lambda: asyncio.sleep(0, worker.last_started > 0), what="the worker to take the tick")
    if url.startswith("postgresql"):
        engine = make_engine(url)
        try:

            async def waiting() -> bool:
                async with engine.connect() as connection:
                    count = await connection.scalar(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
                return bool(count)

            await _wait_for(waiting, what="the worker's publish to wait for the routes' locks")
        finally:
            await engine.dispose()
    else:  # no view of a waiting SQLite writer: leave the worker (3 small routes) time to reach the lock
        await asyncio.sleep(3.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_worker_publishes_the_rows_the_loop_publishes(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(lease_ttl_s=60.0)
    await _seed(sessionmaker, call_factory, settings)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "me", 60.0)
    now = datetime.now(UTC)
    on_loop = await run_tick(sessionmaker, settings, now=now)
    assert len(on_loop) == 3 and any(row["applied"] for row in on_loop)
    async with sessionmaker() as session, session.begin():  # back to nothing published
        await session.execute(delete(ThresholdHistory))
        await session.execute(delete(Threshold))
    worker = TickWorker(migrated_url, settings)
    worker.set_hold_until(time.monotonic() + 60.0)
    try:
        in_worker = await worker.tick("me", now=now)
    finally:
        await worker.close()
    assert in_worker == on_loop
    assert await _published(sessionmaker) == (3, 3)


async def test_the_worker_fence_refuses_a_lapsed_hold_and_a_taken_lease(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(lease_ttl_s=60.0)
    await _seed(sessionmaker, call_factory, settings)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "me", 60.0)
    worker = TickWorker(migrated_url, settings)
    try:
        worker.set_hold_until(time.monotonic() - 1.0)  # the parent's hold ended: the row alone is not enough
        with pytest.raises(LeaseLost, match="no renewal succeeded in time"):
            await worker.tick("me")
        worker.set_hold_until(time.monotonic() + 60.0)
        with pytest.raises(LeaseLost, match="me holds it"):
            await worker.tick("other")  # the row names "me"
        assert await _published(sessionmaker) == (0, 0)
        assert len(await worker.tick("me")) == 3
    finally:
        await worker.close()
    assert await _published(sessionmaker) == (3, 3)


async def test_a_lease_taken_by_another_holder_mid_tick_publishes_nothing(
    migrated_url: str,
    sessionmaker: async_sessionmaker[AsyncSession],
    call_factory: CallFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(lease_ttl_s=60.0, controller_interval_s=3600.0, controller_tick_in="process")
    await _seed(sessionmaker, call_factory, settings)
    scheduler = ControllerScheduler(sessionmaker, settings, holder="old")
    caplog.set_level(logging.INFO)
    try:
        ticking = asyncio.create_task(scheduler.tick())
        await _tick_starting(scheduler)
        async with _publish_blocked(migrated_url) as blocker:
            await _tick_in_publish(migrated_url, scheduler)
            # another holder takes the row (committed when the publish is let go)
            await blocker.execute(update(Lease).where(Lease.name == CONTROLLER_LEASE).values(holder="new"))
            assert scheduler.holding  # this process still counts itself the holder: the row decides
        assert await asyncio.wait_for(ticking, WIDE_S) is None
        assert not scheduler.holding and scheduler.ticks == 0
        assert await _published(sessionmaker) == (0, 0)
        assert any("controller tick not published" in r.getMessage() and "new holds it" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    finally:
        await scheduler.shutdown()


async def test_shutdown_at_once_kills_the_worker_mid_tick_and_releases_the_lease(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # a TTL long enough that no renewal falls while the test holds SQLite's write lock
    settings = Settings(lease_ttl_s=600.0, controller_interval_s=3600.0, controller_tick_in="process")
    await _seed(sessionmaker, call_factory, settings)
    scheduler = ControllerScheduler(sessionmaker, settings, holder="me")
    scheduler.start()
    await _wait_for(lambda: asyncio.sleep(0, scheduler.holding), what="the lease")
    job = asyncio.create_task(scheduler._tick_job())  # the scheduled job's body, run now
    await _tick_starting(scheduler)
    async with _publish_blocked(migrated_url):
        await _tick_in_publish(migrated_url, scheduler)
        worker = scheduler.tick_worker
        assert worker is not None
        (pid,) = worker.pids
        started = time.monotonic()
        stopping = asyncio.create_task(scheduler.shutdown(timeout_s=0))
        await _wait_for(lambda: asyncio.sleep(0, not _alive(pid)), what="the worker to be killed")
        killed_s = time.monotonic() - started
    await asyncio.wait_for(stopping, WIDE_S)
    released_s = time.monotonic() - started
    await asyncio.wait_for(job, WIDE_S)  # cancelled at shutdown, quietly
    assert killed_s < 20.0 and released_s < 30.0, (killed_s, released_s)  # wide margins: a loaded machine
    assert await lease_holder(sessionmaker, CONTROLLER_LEASE) is None
    assert await _published(sessionmaker) == (0, 0)  # the tick's transaction rolled back
    assert scheduler.ticks == 0


async def test_a_killed_worker_fails_its_tick_and_the_next_tick_succeeds(
    migrated_url: str,
    sessionmaker: async_sessionmaker[AsyncSession],
    call_factory: CallFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(lease_ttl_s=60.0, controller_interval_s=3600.0, controller_tick_in="process")
    await _seed(sessionmaker, call_factory, settings)
    scheduler = ControllerScheduler(sessionmaker, settings, holder="me")
    try:
        ticking = asyncio.create_task(scheduler.tick())
        await _tick_starting(scheduler)
        async with _publish_blocked(migrated_url):
            await _tick_in_publish(migrated_url, scheduler)
            worker = scheduler.tick_worker
            assert worker is not None
            (pid,) = worker.pids
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(TickWorkerError, match=r"tick worker.* died during the tick; nothing was published"):
                await asyncio.wait_for(ticking, WIDE_S)
        assert await _published(sessionmaker) == (0, 0)
        caplog.set_level(logging.INFO)
        rows = await asyncio.wait_for(scheduler.tick(), WIDE_S)
        assert rows is not None and len(rows) == 3 and scheduler.ticks == 1
        assert pid not in worker.pids
        assert await _published(sessionmaker) == (3, 3)
        # the worker's log lines reach this process's logging (here caplog) before tick() returns
        changed = [r for r in caplog.records if r.getMessage().startswith("threshold_changed")]
        assert len(changed) == sum(row["applied"] for row in rows) > 0
        assert all(r.process != os.getpid() and r.name == "hedgerow.events" for r in changed)
        assert {vars(r)["fields"]["route"] for r in changed} <= {"alpha", "beta", "gamma"}
    finally:
        await scheduler.shutdown()


async def test_a_worker_that_died_while_idle_is_replaced_at_the_next_tick(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(lease_ttl_s=60.0, controller_interval_s=3600.0, controller_tick_in="process")
    await _seed(sessionmaker, call_factory, settings)
    scheduler = ControllerScheduler(sessionmaker, settings, holder="me")
    try:
        assert len(await scheduler.tick() or []) == 3
        worker = scheduler.tick_worker
        assert worker is not None
        (pid,) = worker.pids
        # the worker yields the CPU to the api: it runs WORKER_NICE steps nicer than this process
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE)
        os.kill(pid, signal.SIGKILL)
        await _wait_for(lambda: asyncio.sleep(0, not _alive(pid) or pid not in worker.pids), what="the kill")
        again = await asyncio.wait_for(scheduler.tick(), WIDE_S)
        assert len(again or []) == 3
        assert scheduler.ticks == 2
    finally:
        await scheduler.shutdown()
    assert not worker.pids


async def test_an_in_memory_store_ticks_on_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    engine = make_engine("sqlite+aiosqlite:///:memory:")
    try:
        scheduler = ControllerScheduler(make_sessionmaker(engine), Settings(controller_tick_in="process"))
        assert scheduler.tick_in == "loop"
        assert any("cannot open an in-memory SQLite store" in r.getMessage() for r in caplog.records)
    finally:
        await engine.dispose()


async def test_the_worker_is_warmed_up_before_any_tick_and_stopped_at_shutdown(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession]
) -> None:
    scheduler = ControllerScheduler(sessionmaker, Settings(controller_tick_in="process"), holder="me")
    try:
        await scheduler.warm_up()  # what start() schedules WORKER_WARM_UP_S later, on every process
        worker = scheduler.tick_worker
        assert worker is not None
        (pid,) = worker.pids
        assert scheduler.ticks == 0 and _alive(pid)
    finally:
        await scheduler.shutdown()
    assert not worker.pids
    await _wait_for(lambda: asyncio.sleep(0, not _alive(pid)), what="the worker to end")


async def test_shutdown_ends_a_tick_awaited_outside_the_jobs(
    migrated_url: str, sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """A tick asked for by ``POST /v1/controller/run`` is no job: shutdown's kill still ends it."""
    settings = Settings(lease_ttl_s=600.0, controller_interval_s=3600.0, controller_tick_in="process")
    await _seed(sessionmaker, call_factory, settings)
    scheduler = ControllerScheduler(sessionmaker, settings, holder="me")
    ticking = asyncio.create_task(scheduler.tick())
    await _tick_starting(scheduler)
    async with _publish_blocked(migrated_url):
        await _tick_in_publish(migrated_url, scheduler)
        worker = scheduler.tick_worker
        assert worker is not None
        (pid,) = worker.pids
        stopping = asyncio.create_task(scheduler.shutdown(timeout_s=0))
        with pytest.raises(TickWorkerError, match=r"stopped \(shutdown\); nothing was published"):
            await asyncio.wait_for(ticking, WIDE_S)
    await asyncio.wait_for(stopping, WIDE_S)
    assert not _alive(pid)
    assert await lease_holder(sessionmaker, CONTROLLER_LEASE) is None
    assert await _published(sessionmaker) == (0, 0)


def _children(pid: int) -> list[int]:
    """Process ids of ``pid``'s live child processes (Linux ``/proc``)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from Linux /proc")
async def test_serve_stopped_by_sigterm_leaks_no_semaphore_of_the_worker(tmp_path: Path) -> None:
    # serve re-raises SIGTERM once shut down, so no atexit finalizer runs: the tick worker's log
    # queue (three named semaphores) must be released by TickWorker.close itself
    url = f"sqlite+aiosqlite:///{tmp_path / 'hedgerow.db'}"
    async with running_serve(url, tmp_path, HEDGEROW_CONTROLLER_INTERVAL_S="1") as served:
        deadline = time.monotonic() + WIDE_S  # the resource tracker and the pool's worker are running
        while len(_children(served.process.pid)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        assert len(_children(served.process.pid)) >= 2, await served.stderr_text()
        tracker_and_worker = _children(served.process.pid)
    deadline = time.monotonic() + 10.0  # the resource tracker writes its warning as it ends, after serve
    while any(Path(f"/proc/{pid}").exists() for pid in tracker_and_worker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stderr = await served.stderr_text()
    assert "Finished server process" in stderr, stderr[-2000:]
    assert "leaked semaphore" not in stderr, stderr[-2000:]
