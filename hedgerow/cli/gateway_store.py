"""``hedgerow gateway --db URL``: the gateway's records written straight into a store and its
thresholds read from it, in the gateway's process, with no ``serve`` in between.

:class:`GatewayStore` is both the gateway's ``RecordSink`` and its ``ThresholdSource``, and an
async context manager the gateway enters at start-up (after :func:`migrate_store`, which brings
the store to the newest revision as ``serve`` does, before the gateway listens):

* **Records.** ``submit`` appends to a bounded in-memory queue (a call never waits on the store);
  a background task writes what is queued every ``flush_interval_s``, at most ``batch_size``
  records per transaction, with :func:`hedgerow.controller.store.ingest.ingest_calls` and the
  route defaults and bounds of ``hedgerow.settings.Settings`` (what ``POST /v1/calls`` does). A
  store that cannot be reached keeps the batch (held apart, written before anything newer);
  once ``max_queue`` more records wait, the oldest are dropped (counted in ``dropped``, logged).
  A batch the store refuses for its routes (an archived route, a route past ``max_routes``) is
  dropped, counted and logged. At exit what is held and queued is written once more.
* **Thresholds.** The published thresholds (:func:`hedgerow.controller.store.queries.list_thresholds`)
  are read once at start-up and every ``interval_s`` after; ``lookup`` is a dictionary read, and
  answers None (the route's policy value) for a route without a threshold or once the table is
  older than ``max_stale_s``, as ``ThresholdPoller`` does.

Neither logs a record's contents or the database URL's password (:func:`safe_url`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from hedgerow.client import CallRecord

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = ["GatewayStore", "migrate_store"]

log = logging.getLogger("hedgerow.gateway.store")


async def migrate_store(settings: Settings) -> None:
    """Migrate ``settings.database_url`` to the newest revision (under the store's migration lock).

    Raises:
        StoreNotReady: the database cannot be reached or migrated.
    """
    from hedgerow.controller.store.db import make_engine, migrate_engine

    engine = make_engine(settings.database_url)
    try:
        await migrate_engine(engine, lock_timeout_s=settings.migration_lock_timeout_s)
    finally:
        await engine.dispose()


class GatewayStore:
    """The gateway's link to a store: a record sink and a threshold source (module docstring).

    Args:
        settings: the database URL, the route defaults and bounds of new routes.
        flush_interval_s: seconds between writes of the queued records (default 1).
        batch_size: most records written in one transaction (default 500).
        max_queue: most records waiting; past it the oldest are dropped (default 10,000).
        interval_s: seconds between reads of the thresholds (default 5).
        max_stale_s: after this many seconds without a good read, ``lookup`` answers None (300).
        close_timeout_s: most seconds spent writing the last records at exit (default 5).

    Attributes:
        written: records stored; duplicates: records already stored; dropped: records lost (queue
            full, or refused by the store for their routes).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        flush_interval_s: float = 1.0,
        batch_size: int = 500,
        max_queue: int = 10_000,
        interval_s: float = 5.0,
        max_stale_s: float = 300.0,
        close_timeout_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.max_queue = max_queue
        self.interval_s = interval_s
        self.max_stale_s = max_stale_s
        self.close_timeout_s = close_timeout_s
        self._queue: collections.deque[CallRecord] = collections.deque()
        self._held: list[CallRecord] = []
        self._writing = asyncio.Lock()
        self._table: dict[tuple[str, str], tuple[float, int | None, bool]] = {}
        self._read_at: float | None = None
        self._engine: Any = None
        self._sessionmaker: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self.written = 0
        self.duplicates = 0
        self.dropped = 0

    @property
    def pending(self) -> list[CallRecord]:
        """The records not written yet, oldest first (the held batch, then the queue)."""
        return [*self._held, *self._queue]

    # -- the sink and the source ----------------------------------------------------------------

    def submit(self, record: CallRecord) -> None:
        """Queue one record for the next write (never blocks; the oldest goes past ``max_queue``)."""
        self._queue.append(record)
        if len(self._queue) > self.max_queue:
            self._queue.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("gateway store: %d record(s) dropped, the queue is full", self.dropped)
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def lookup(self, route: str, model: str) -> tuple[float, int | None, bool] | None:
        """The published threshold of (route, model): ``(hedge_after_s, version, enabled)``, or None
        for an unknown route or a table older than ``max_stale_s``."""
        if self._read_at is None or time.monotonic() - self._read_at > self.max_stale_s:
            return None
        return self._table.get((route, model))

    # -- life -----------------------------------------------------------------------------------

    async def __aenter__(self) -> GatewayStore:
        """Open the engine, read the thresholds once, start the writer and the reader."""
        from hedgerow.controller.store.db import make_engine, make_sessionmaker

        self._engine = make_engine(self.settings.database_url)
        self._sessionmaker = make_sessionmaker(self._engine)
        await self.read_thresholds()
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="hedgerow-gateway-store-writer"),
            asyncio.create_task(self._read_loop(), name="hedgerow-gateway-store-reader"),
        ]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Stop both tasks, write what is held and queued (for at most ``close_timeout_s``), close
        the engine."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        try:
            async with asyncio.timeout(self.close_timeout_s):
                while (self._held or self._queue) and await self.write_batch():
                    pass
        except TimeoutError:
            log.warning("gateway store: %d record(s) not written at exit (the store is slow)", len(self.pending))
        finally:
            if self._engine is not None:
                await self._engine.dispose()
                self._engine = None

    async def _write_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # woken early by a full batch
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            while (self._held or self._queue) and await self.write_batch():
                pass

    async def _read_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.read_thresholds()

    async def read_thresholds(self) -> bool:
        """Read the published thresholds now; returns whether the read succeeded (else the last
        table is kept and one warning is logged)."""
        from hedgerow.controller.store.queries import list_thresholds

        try:
            async with self._sessionmaker() as session:
                rows = await list_thresholds(session)
        except Exception as exc:  # the store down: keep the last table until it is stale
            log.warning("gateway store: reading the thresholds failed (%s)", type(exc).__name__)
            return False
        self._table = {
            (row["route"], row["model"]): (float(row["hedge_after_s"]), row["version"], bool(row["enabled"]))
            for row in rows
        }
        self._read_at = time.monotonic()
        return True

    async def write_batch(self) -> bool:
        """Write the held batch, else up to ``batch_size`` queued records, in one transaction;
        returns whether the batch is done (written, or dropped as refused), False when the store
        failed (the batch is held, and written before anything newer)."""
        from hedgerow.controller.errors import RouteArchived, RouteLimitExceeded
        from hedgerow.controller.store.ingest import ingest_calls, route_defaults

        async with self._writing:  # one write at a time: the held batch goes first
            if not self._held:
                queue = self._queue
                self._held = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
            batch = self._held
            if not batch:
                return False
            settings = self.settings
            try:
                async with self._sessionmaker() as session, session.begin():
                    accepted, duplicates = await ingest_calls(
                        session,
                        batch,
                        defaults=route_defaults(settings),
                        max_routes=settings.max_routes,
                        max_models_per_route=settings.max_models_per_route,
                    )
            except (RouteArchived, RouteLimitExceeded) as exc:
                self._held = []
                self.dropped += len(batch)
                log.warning("gateway store: %d record(s) refused by the store: %s", len(batch), exc)
                return True
            except Exception as exc:  # the store down: the batch is held for the next write
                log.warning("gateway store: writing %d record(s) failed (%s)", len(batch), type(exc).__name__)
                return False
            self._held = []
            self.written += accepted
            self.duplicates += duplicates
            return True
