"""Group commit: concurrent writes of one process run by one writer task, several per transaction.

SQLite has one writer at a time. Concurrent ingest batches of one process that each open their
own transaction take turns on its lock and each pay a commit of their own; a
:class:`GroupCommitWriter` instead queues them (``submit``) to a single task that takes every job
waiting (at most ``max_jobs``), opens one transaction with ``BEGIN IMMEDIATE`` (the write lock
from the start, so a writer of another process waits in SQLite's busy handler before anything
is written, not halfway), runs each job inside a ``SAVEPOINT`` of its own, commits once, and then
answers every waiter. No job waits for a timer: a group is whatever queued up while the previous
one was being written, so a lone poster is served at once.

What each job's waiter gets:

- its job raised (a bad record, a route past a bound, a database error inside its savepoint):
  that exception, and only its savepoint is rolled back: the other jobs of the group go on;
- the transaction or its commit failed: that exception, for every job of the group; nothing of
  the group is stored;
- otherwise, once the commit has returned: the job's result (the response goes out only after
  the batch is durable).

A waiter cancelled while its job is still queued takes the job with it: the writer skips it, so
nothing of it is written. A waiter cancelled once its job's turn has come does not stop it: the
job is written and committed with its group, once, and ``on_commit`` still runs for it (a client
that re-posts the batch gets its records counted as duplicates). Either way a cancellation never
touches another job of the group.

The jobs of a group see each other's writes (one transaction), in the order they were submitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.errors import StoreError

__all__ = ["GroupCommitWriter"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Job(Generic[T, R]):
    item: T
    future: asyncio.Future[R]


def _answer(future: asyncio.Future[R], result: R) -> None:
    if not future.done():  # a cancelled waiter has nobody to answer
        future.set_result(result)


def _fail(future: asyncio.Future[R], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class GroupCommitWriter(Generic[T, R]):
    """One task that writes submitted jobs, several per transaction (see the module docstring).

    Args:
        sessionmaker: sessions of the store (SQLite: ``begin_sql`` is SQLite's).
        work: ``await work(session, item)`` writes one job inside the session's transaction
            (already inside the job's savepoint) and returns what its waiter gets; it must not
            commit or roll back.
        on_commit: called with each job's result once its group committed (also for a job
            whose waiter was cancelled meanwhile): learn what the committed rows make true
            (caches, counters). An exception it raises is logged, not passed on.
        on_close: awaited by :meth:`aclose` once the task stopped (e.g. dispose of an engine
            of the writer's own).
        max_jobs: most jobs per transaction, >= 1.
        begin_sql: the statement that opens the group's transaction (default ``BEGIN
            IMMEDIATE``: SQLite's write lock at once; it also makes the driver's transaction
            explicit, so the first ``SAVEPOINT`` does not open a transaction of its own that
            its ``RELEASE`` would commit).

    Raises:
        ValueError: ``max_jobs`` < 1.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        work: Callable[[AsyncSession, T], Awaitable[R]],
        *,
        on_commit: Callable[[R], None] | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        max_jobs: int = 8,
        begin_sql: str = "BEGIN IMMEDIATE",
    ) -> None:
        if max_jobs < 1:
            raise ValueError(f"max_jobs: must be >= 1, got {max_jobs!r}")
        self._sessionmaker = sessionmaker
        self._work = work
        self._on_commit = on_commit
        self._on_close = on_close
        self._max_jobs = max_jobs
        self._begin_sql = begin_sql
        self._queue: asyncio.Queue[_Job[T, R] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._writing = 0
        #: Groups written (committed or failed) and the jobs they held.
        self.groups = 0
        self.jobs = 0

    @property
    def queued(self) -> int:
        """Jobs waiting for their group."""
        return self._queue.qsize()

    @property
    def writing(self) -> int:
        """Jobs of the group being written now (0: the writer is idle)."""
        return self._writing

    def start(self) -> None:
        """Start the writer task on the running event loop.

        Raises:
            RuntimeError: already started, or no running event loop.
        """
        if self._task is not None:
            raise RuntimeError("group commit writer already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="hedgerow-group-commit")

    async def submit(self, item: T) -> R:
        """Queue a job and wait until its group committed; returns what ``work`` returned for it.

        Raises:
            StoreError: the writer is not running (not started, closed, or stopped).
            Exception: whatever ``work`` raised for this job, or the group's transaction raised.
        """
        if self._task is None or self._closed or self._task.done():
            raise StoreError("the store's writer is not running (the server is starting or stopping)")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Job(item, future))
        return await future

    async def aclose(self) -> None:
        """Write every job queued so far, stop the task, then await ``on_close``; later
        ``submit`` calls fail."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None:
                self._queue.put_nowait(None)
                await self._task
        finally:
            if self._on_close is not None:
                await self._on_close()

    async def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                first = await self._queue.get()
                if first is None:
                    return
                group = [first]
                while len(group) < self._max_jobs and not self._queue.empty():
                    job = self._queue.get_nowait()
                    if job is None:  # aclose: this group is the last
                        stopping = True
                        break
                    group.append(job)
                await self._write(group)
        finally:
            # cancelled (or a bug): no waiter may wait for ever
            stopped = StoreError("the store's writer stopped")
            while not self._queue.empty():
                job = self._queue.get_nowait()
                if job is not None:
                    _fail(job.future, stopped)

    async def _write(self, group: list[_Job[T, R]]) -> None:
        live = [job for job in group if not job.future.cancelled()]  # cancelled while queued: skipped
        if not live:
            return
        done: list[tuple[_Job[T, R], R]] = []
        failed: list[tuple[_Job[T, R], Exception]] = []
        self._writing = len(live)
        try:
            async with self._sessionmaker() as session, session.begin():
                connection = await session.connection()
                await connection.exec_driver_sql(self._begin_sql)
                for job in live:
                    if job.future.cancelled():
                        continue
                    try:
                        async with session.begin_nested():
                            result = await self._work(session, job.item)
                    except Exception as exc:  # this job's own error: its savepoint alone rolled back
                        failed.append((job, exc))
                    else:
                        done.append((job, result))
        except BaseException as exc:  # the transaction or its commit: nothing of the group is stored
            for job in live:
                _fail(job.future, exc if isinstance(exc, Exception) else StoreError("the store's writer stopped"))
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._writing = 0
            self.groups += 1
            self.jobs += len(live)
        for job, error in failed:
            _fail(job.future, error)
        for job, result in done:
            if self._on_commit is not None:
                try:
                    self._on_commit(result)
                except Exception:
                    log.exception("group commit: on_commit failed (the job is committed)")
            _answer(job.future, result)
