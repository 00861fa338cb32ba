"""The threshold table that clients poll, rendered once and kept in memory with its ETag.

``GET /v1/thresholds`` is polled by every client process every few seconds; rendering it from
the store (a connection, an ORM load of every route, JSON, SHA-256) cost 30-45 ms of CPU per poll
at 1,000 routes. :class:`ThresholdCache` keeps the rendered body and its ETag, and learns that the
table changed from the store's ``threshold_table`` change counter (raised by triggers on every
write of ``thresholds`` and update of ``routes``, by whichever process made it): at most once per
``check_interval_s`` it reads the counter (one primary-key read) and renders the table again
only when the counter moved. Between checks a poll, 200 or 304, touches no database; a change
made by another ``serve`` process is served within ``check_interval_s`` (plus the query), one
made through this process at once (:meth:`ThresholdCache.invalidate`).

A poll does not wait for the check while polls keep coming: the first poll in the second half of
the interval starts the check in the background and is answered from the table it holds
(refresh-ahead), so the check is usually done before the table stops being fresh. Only a poll
that finds the table older than the interval (no poll came in its second half, or the check is
slower than half the interval) waits for a check. Right after a controller tick of 1,000 routes
published from its worker process, a check took 50-140 ms (its reads interleaved with the tick's
answer being written on the same event loop) and every poll of that moment waited for it
(``bench/tick_interference.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.api.store_errors import STORE_ERRORS
from hedgerow.controller.store.change_counters import read_change_counter
from hedgerow.controller.store.queries import list_thresholds

__all__ = ["CachedTable", "ThresholdCache"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CachedTable:
    """A rendered threshold table: the response body, its strong ETag, the counter it was read at."""

    body: bytes
    etag: str
    version: int | None


class ThresholdCache:
    """The rendered threshold table of one process, refreshed from the store's change counter.

    Args:
        sessionmaker: sessions of the store.
        render: ``rows -> (body, etag)`` (the threshold router's rendering, one copy of it).
        check_interval_s: seconds between two counter reads, >= 0 (0: every request reads it).
        clock: monotonic seconds (a fake clock in tests).

    Raises:
        ValueError: a negative or non-finite ``check_interval_s``.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        render: Callable[[list[dict[str, object]]], tuple[bytes, str]],
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (math.isfinite(check_interval_s) and check_interval_s >= 0):
            raise ValueError(f"check_interval_s: must be a finite number of seconds >= 0, got {check_interval_s!r}")
        self._sessionmaker = sessionmaker
        self._render = render
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._table: CachedTable | None = None
        self._checked_at = -math.inf
        self._generation = 0  # raised by invalidate(): a check in flight then does not count
        self._ahead: asyncio.Task[CachedTable] | None = None  # the check started ahead by a poll
        self._lock = asyncio.Lock()
        #: True while the last check failed and the table served is the last one rendered.
        self.serving_stale = False
        #: Counter reads and renders made (for tests and benchmarks).
        self.counter_reads = 0
        self.renders = 0

    def invalidate(self) -> None:
        """Make the next request read the counter (call after this process changed the table).

        A check already in flight may have read the counter before the change committed: its
        result is still served to the requests waiting on it, but the next request checks again.
        """
        self._generation += 1
        self._checked_at = -math.inf

    def fresh(self) -> CachedTable | None:
        """The cached table when it was checked within ``check_interval_s``, else None (no I/O)."""
        if self._table is not None and self._clock() - self._checked_at < self._check_interval_s:
            return self._table
        return None

    async def current(self) -> CachedTable:
        """The table, checking the counter first when the last check is older than the interval.

        A fresh table past half its interval is returned at once and a check is started in the
        background (one at a time; none while :meth:`invalidate` is pending, as then the next
        request checks anyway). One check at a time: requests arriving during a check wait for
        it and share its result.

        When the check fails (the store is down: a driver, pool or socket error) and a table was
        rendered before, that table is served (stale if error, as HTTP caches do): clients keep
        the thresholds they would have kept anyway, and a client process that starts during an
        outage gets them instead of its defaults. The next check comes ``check_interval_s``
        later; the start and the end of such a stretch are logged once each.

        Raises:
            sqlalchemy.exc.SQLAlchemyError / OSError (``store_errors.STORE_ERRORS``): the store
                cannot be read and nothing was cached yet.
        """
        table = self.fresh()
        if table is None:
            return await self._check(self._check_interval_s)
        half = self._check_interval_s / 2
        if self._clock() - self._checked_at >= half:
            self._start_check(half)
        return table

    def check_soon(self) -> None:
        """Start a check in the background now, unless one is running (call after :meth:`invalidate`
        when this process changed the table: the requests that follow wait for less of it)."""
        self._start_check(0.0)

    def _start_check(self, max_age_s: float) -> None:
        if self._ahead is None or self._ahead.done():
            self._ahead = asyncio.create_task(self._check(max_age_s), name="hedgerow-threshold-check")
            self._ahead.add_done_callback(_log_failure)

    async def aclose(self) -> None:
        """Cancel a check started ahead and wait for it (at shutdown, before the engine closes)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and not ahead.done():
            ahead.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ahead

    async def _check(self, max_age_s: float) -> CachedTable:
        """Check the counter under the lock, unless a check that ended meanwhile left the table
        younger than ``max_age_s``; render the table again when the counter moved."""
        async with self._lock:
            if self._table is not None and self._clock() - self._checked_at < max_age_s:
                return self._table
            started, generation = self._clock(), self._generation
            try:
                async with self._sessionmaker() as session:
                    version = await read_change_counter(session)
                    self.counter_reads += 1
                    table = self._table
                    if table is None or version is None or version != table.version:
                        body, etag = self._render(await list_thresholds(session))
                        self.renders += 1
                        table = CachedTable(body, etag, version)
            except STORE_ERRORS as exc:
                if self._table is None:
                    raise
                if not self.serving_stale:
                    log.warning("threshold table: the store cannot be read (%s); serving the last table", exc)
                    self.serving_stale = True
                self._checked_at = started
                return self._table
            if self.serving_stale:
                log.info("threshold table: the store can be read again")
                self.serving_stale = False
            self._table = table
            if generation == self._generation:
                self._checked_at = started
            return table


def _log_failure(task: asyncio.Task[CachedTable]) -> None:
    """Log a check started ahead that failed otherwise than the store being down (handled inside)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("threshold table: a background check failed", exc_info=task.exception())
