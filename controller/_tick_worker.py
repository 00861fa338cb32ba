"""The controller tick computed in a worker process, so that it never holds the api's interpreter lock.

A ``serve`` process answers threshold polls and takes telemetry on its event loop; a tick's
observation and decision are CPU-bound Python and numpy that hold the GIL for seconds (a thread
does not help). :class:`TickWorker` runs :func:`hedgerow.controller.jobs.run_tick` in one
persistent worker process (``spawn``; a pebble ``ProcessPool`` of one worker, started at the first
tick and kept), which opens the store itself on an event loop of its own (made once: asyncpg
connections are bound to their loop) and hands back the history rows written.

The worker runs at a lower CPU priority (:data:`WORKER_NICE`): on a machine short of CPU the
api's own work goes first. On Linux it is killed when its parent dies (``PR_SET_PDEATHSIG``), so
a ``serve`` killed outright leaves no tick running. What stays as in a tick on the loop:

- **Lease fence.** The worker's publishing transaction runs both checks of the scheduler's fence:
  the parent's hold (its last successful renewal started less than the safety fraction of the TTL
  ago), shared as a deadline on the system-wide monotonic clock (a shared double the parent keeps
  up to date while it renews during the tick), and
  :func:`~hedgerow.controller.lease.check_lease_held` for the parent's holder id in the same
  transaction. :class:`~hedgerow.controller.lease.LeaseLost` comes back to the parent as such.
- **Cancellation.** Cancelling :meth:`TickWorker.tick` (the scheduler's ``shutdown(timeout_s=0)``)
  cancels the pool's future, which terminates the worker: its open transaction rolls back (the
  database sees the connection close). :meth:`TickWorker.close` stops and joins the worker; the
  scheduler does it before it releases the lease, so nothing can commit after the release.
- **Crashes.** A worker that dies during a tick (killed, out of memory) makes that tick raise
  :class:`TickWorkerError` (nothing is committed: its transaction dies with it); the pool starts a
  new worker, and a pool broken by a worker that died while idle is replaced at the next tick.
- **Logs.** The worker's log records (``threshold_changed`` lines, a route's failure, a route
  changed while deciding) go through a queue to the parent, which hands each to its logger of the
  same name when that logger is enabled for its level (stdlib cookbook: logging to a single
  destination from multiple processes). The worker logs at the levels the parent's loggers have
  at each tick's start, and every record of a tick is handed on before :meth:`TickWorker.tick`
  returns (an end marker follows them in the queue). A traceback travels as text
  (``record.exc_text``).

pebble was chosen over hand-written ``multiprocessing``: its futures' ``cancel()`` terminates the
worker running the task, a worker's death fails only its task (``ProcessExpired``) and the pool
starts another, and its initializer runs once per worker (the engine and loop are kept across
ticks), which is what the lease and shutdown rules need, without a home-made supervision loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import itertools
import logging
import logging.handlers
import math
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pebble import ProcessExpired, ProcessPool
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from hedgerow.client.errors import describe
from hedgerow.controller.errors import ControllerError
from hedgerow.controller.lease import CONTROLLER_LEASE, LeaseLost, check_lease_held

__all__ = ["LOG_DRAIN_TIMEOUT_S", "WORKER_NICE", "TickWorker", "TickWorkerError", "worker_url"]

log = logging.getLogger(__name__)

#: Seconds a finished tick waits at most for its last log records to arrive from the worker.
LOG_DRAIN_TIMEOUT_S = 10.0
#: Seconds :meth:`TickWorker.close` waits for the pool's threads and worker to end.
CLOSE_TIMEOUT_S = 15.0
#: Niceness added to the worker process: when CPUs are short, the api's polls and ingest (this
#: process) run before the tick, which has a whole interval to finish (Linux CFS weight 110 vs 1024).
WORKER_NICE = 10
#: prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


#: The error of a tick whose worker :meth:`TickWorker.close` stopped.
_STOPPED = "the controller tick worker was stopped (shutdown); nothing was published"


class TickWorkerError(ControllerError):
    """The tick failed in its worker process, or the worker died during it; nothing was published."""


class _RemoteTraceback(Exception):
    """The worker's traceback, chained as the cause of a :class:`TickWorkerError`."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


def worker_url(sessionmaker: async_sessionmaker[AsyncSession]) -> str | None:
    """The store url a worker process can open for ``sessionmaker``'s engine, or None.

    None when the sessionmaker is not bound to one engine or the store is an in-memory SQLite
    database (a worker would open a new, empty one).
    """
    bind = sessionmaker.kw.get("bind")
    if not isinstance(bind, AsyncEngine):
        return None
    url = bind.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return None
    return url.render_as_string(hide_password=False)


def _levels() -> tuple[int, dict[str, int]]:
    """The parent's root level and the levels set on its other loggers (name -> level)."""
    manager = logging.Logger.manager
    named = {
        name: logger.level
        for name, logger in list(manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
    }
    return logging.getLogger().level, named


# --------------------------------------------------------------------------------------------------
# In the worker process


class _ForwardingHandler(logging.handlers.QueueHandler):
    """Puts each record on the queue as a picklable copy: message rendered, traceback as text."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """A copy of ``record`` that pickles: ``msg`` rendered, no ``args``, the traceback as text."""
        record = copy.copy(record)
        record.msg = record.getMessage()
        record.args = None
        record.message = record.msg
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_info = None
        try:
            pickle.dumps(record)
        except Exception:  # an extra field that does not pickle: keep what the formatters need
            fields = {"name": record.name, "levelno": record.levelno, "levelname": record.levelname}
            plain = logging.makeLogRecord(fields)
            plain.__dict__.update({k: record.__dict__[k] for k in ("msg", "message", "created", "exc_text")})
            plain.args = None
            record = plain
        return record


@dataclass
class _WorkerState:
    loop: asyncio.AbstractEventLoop
    sessionmaker: async_sessionmaker[AsyncSession]
    settings: Any
    hold_until: Any  # multiprocessing shared double: monotonic deadline of the parent's hold
    log_queue: Any
    named_levels: dict[str, int]


_STATE: _WorkerState | None = None


def _start_worker(url: str, settings: Any, hold_until: Any, log_queue: Any) -> None:
    """The worker's initializer: its logging to the queue, its event loop, engine and sessionmaker."""
    global _STATE
    import hedgerow.controller.jobs  # noqa: F401  the estimation stack, imported before the nice

    with contextlib.suppress(OSError):  # raising one's own niceness needs no privilege; never fatal
        os.nice(WORKER_NICE)
    _die_with_parent()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ForwardingHandler(log_queue))
    from hedgerow.controller.store.db import make_engine, make_sessionmaker

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    if url.startswith("sqlite"):
        engine = make_engine(url)
    else:  # a pool of the size of serve's jobs pool (the tick's connections are here now)
        engine = make_engine(url, pool_size=max(1, int(getattr(settings, "db_jobs_pool_size", 3))), max_overflow=0)
    _STATE = _WorkerState(loop, make_sessionmaker(engine), settings, hold_until, log_queue, {})


def _die_with_parent() -> None:
    """Linux: be killed when the parent dies (a ``serve`` killed with SIGKILL leaves no tick behind)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl: the worker still ends at its next read of the pool
        return
    if os.getppid() == 1:  # the parent died before the call
        os._exit(1)


def _apply_levels(state: _WorkerState, levels: tuple[int, dict[str, int]]) -> None:
    root_level, named = levels
    logging.getLogger().setLevel(root_level)
    for name in set(state.named_levels) - set(named):
        logging.getLogger(name).setLevel(logging.NOTSET)
    for name, level in named.items():
        logging.getLogger(name).setLevel(level)
    state.named_levels = dict(named)


def _tick_in_worker(tick_id: int, holder: str, now: datetime | None, levels: tuple[int, dict[str, int]]) -> Any:
    """Run one tick in the worker; returns ``("rows", rows)``, ``("lease_lost", (lease, holder, why))``
    or ``("error", (summary, traceback text))`` (values, so that no exception has to pickle)."""
    from hedgerow.controller.jobs import run_tick

    state = _STATE
    if state is None:  # pragma: no cover - the initializer always ran
        return ("error", ("the tick worker was not initialised", ""))
    _apply_levels(state, levels)
    state.log_queue.put(("tick_started", tick_id))

    async def fence(session: AsyncSession) -> None:
        if time.monotonic() >= state.hold_until.value:
            raise LeaseLost(CONTROLLER_LEASE, holder, "no renewal succeeded in time")
        await check_lease_held(session, CONTROLLER_LEASE, holder)

    try:
        rows = state.loop.run_until_complete(run_tick(state.sessionmaker, state.settings, now=now, fence=fence))
        return ("rows", rows)
    except LeaseLost as exc:
        return ("lease_lost", (exc.lease, exc.holder, exc.why))
    except Exception as exc:
        return ("error", (describe(exc), traceback.format_exc()))
    finally:
        state.log_queue.put(("tick_done", tick_id))  # after every record of this tick


# --------------------------------------------------------------------------------------------------
# In the parent process


class TickWorker:
    """Runs controller ticks in one persistent worker process (see the module docstring).

    Args:
        url: the store's url (:func:`worker_url`; not an in-memory SQLite database).
        settings: a ``hedgerow.settings.Settings`` (picklable), given to ``run_tick``.

    Nothing is started before the first :meth:`tick`.
    """

    def __init__(self, url: str, settings: Any) -> None:  # nothing starts here
        self.url = url
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._hold_until: Any = None
        self._logs: Any = None
        self._listener: threading.Thread | None = None
        self._pool: ProcessPool | None = None
        self._ticks = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        self._waiting_lock = threading.Lock()
        self._closed = False
        self._inflight: set[Future[Any]] = set()
        self._hold_deadline = -math.inf
        #: The id of the last tick the worker said it started (0: none); ticks are numbered from 1.
        self.last_started = 0

    def set_hold_until(self, deadline_s: float) -> None:
        """Set the end of the parent's hold (``time.monotonic()`` seconds; ``-inf``: not holding).

        The worker's publish fence refuses to publish from that moment on.
        """
        self._hold_deadline = deadline_s
        if self._hold_until is not None:
            self._hold_until.value = deadline_s

    async def _start(self) -> ProcessPool:
        """The running pool: made at the first tick, remade when a worker's death broke it."""
        if self._closed:
            raise TickWorkerError("the tick worker is closed")
        if self._logs is None:
            self._hold_until = self._context.Value("d", self._hold_deadline, lock=False)
            self._logs = self._context.Queue()
            self._listener = threading.Thread(target=self._forward_logs, name="hedgerow-tick-logs", daemon=True)
            self._listener.start()
        if self._pool is not None and not self._pool.active:
            log.warning("the controller tick worker died outside a tick; starting a new one")
            broken, self._pool = self._pool, None
            broken.stop()  # type: ignore[no-untyped-call]
            await asyncio.to_thread(broken.join, CLOSE_TIMEOUT_S)
        if self._pool is None:
            self._pool = ProcessPool(
                max_workers=1,
                initializer=_start_worker,
                initargs=(self.url, self.settings, self._hold_until, self._logs),
                context=self._context,
            )
            if not self._pool.active:  # reading it starts the pool: its worker process is spawned now
                raise TickWorkerError("the controller tick worker pool did not start")
        return self._pool

    async def start(self) -> None:
        """Start the worker process now (it imports the estimation stack), before the first tick."""
        await self._start()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live worker processes (at most one; empty before the first tick)."""
        if self._pool is None:
            return []
        manager = getattr(self._pool, "_pool_manager", None)
        workers = getattr(getattr(manager, "worker_manager", None), "workers", {})
        return [pid for pid, process in list(workers.items()) if process.is_alive()]

    async def tick(self, holder: str, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Run one tick in the worker, publishing under ``holder``'s lease.

        Args:
            holder: the parent's holder id of the controller lease (the fence checks it).
            now: the tick's time (aware UTC; default: the worker's clock at the tick's start).

        Returns:
            The history rows written (see :func:`hedgerow.controller.jobs.run_tick`).

        Raises:
            LeaseLost: the fence found the lease lost; nothing was published.
            TickWorkerError: the tick failed in the worker, or the worker died during it.
        """
        for attempt in (1, 2):
            tick_id = next(self._ticks)
            try:
                kind, payload = await self._run(tick_id, holder, now)
                break
            except BrokenProcessPool:  # the worker died before it took this tick (e.g. while idle)
                if attempt == 2 or self.last_started >= tick_id or self._closed:
                    raise TickWorkerError(
                        "the controller tick worker died during the tick; nothing was published,"
                        " a new worker takes the next tick"
                    ) from None
                log.warning("the controller tick worker died before taking the tick; starting a new one")
        if kind == "lease_lost":
            raise LeaseLost(*payload)
        if kind == "error":
            summary, remote = payload
            raise TickWorkerError(f"the controller tick failed in its worker process: {summary}") from (
                _RemoteTraceback(remote.rstrip("\n"))
            )
        rows: list[dict[str, Any]] = payload
        return rows

    async def _run(self, tick_id: int, holder: str, now: datetime | None) -> tuple[str, Any]:
        """Hand tick ``tick_id`` to the worker; its outcome once its log records are forwarded.

        Raises:
            BrokenProcessPool: the pool broke (its worker died) before the tick was taken.
            TickWorkerError: the worker died while running the tick.
        """
        pool = await self._start()
        loop = asyncio.get_running_loop()
        drained: asyncio.Future[None] = loop.create_future()
        with self._waiting_lock:
            self._waiting[tick_id] = (loop, drained)
        try:
            future = pool.schedule(_tick_in_worker, args=(tick_id, holder, now, _levels()))
            self._inflight.add(future)
            future.add_done_callback(self._inflight.discard)
            try:
                outcome: tuple[str, Any] = await asyncio.wrap_future(future)
            except (ProcessExpired, BrokenProcessPool) as exc:
                if self._closed:
                    raise TickWorkerError(_STOPPED) from None
                if isinstance(exc, BrokenProcessPool):
                    raise
                raise TickWorkerError(
                    f"the controller tick worker (pid {exc.pid}, exit code {exc.exitcode}) died during the tick;"
                    " nothing was published, a new worker takes the next tick"
                ) from None
            try:  # every record of the tick reaches the parent's logging before the tick returns
                async with asyncio.timeout(LOG_DRAIN_TIMEOUT_S):
                    await drained
            except TimeoutError:
                log.warning("controller tick: the worker's last log records did not arrive in time")
            return outcome
        finally:
            with self._waiting_lock:
                self._waiting.pop(tick_id, None)

    def _forward_logs(self) -> None:
        """The listener thread: hand each record to the parent's logger; wake a tick at its marker."""
        while True:
            try:
                item = self._logs.get()
            except (EOFError, OSError):
                return
            if item is None:
                return
            if isinstance(item, logging.LogRecord):
                logger = logging.getLogger(item.name)
                if logger.isEnabledFor(item.levelno):
                    try:
                        logger.handle(item)
                    except Exception:  # never let one record stop the forwarding
                        logging.getLogger(__name__).exception("could not log a record of the tick worker")
            elif isinstance(item, tuple) and item and item[0] == "tick_started":
                self.last_started = max(self.last_started, item[1])
            elif isinstance(item, tuple) and item and item[0] == "tick_done":
                with self._waiting_lock:
                    waiter = self._waiting.get(item[1])
                if waiter is not None:
                    loop, drained = waiter
                    loop.call_soon_threadsafe(_set_done, drained)

    async def close(self) -> None:
        """Stop the worker (terminating a tick it runs: its transaction rolls back) and wait for it.

        Idempotent. After it returns no worker process is left to publish, and the log queue's
        semaphores are released (unlinked), so a process that then ends by a signal leaks none.
        """
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # type: ignore[no-untyped-call]
            try:
                await asyncio.to_thread(pool.join, CLOSE_TIMEOUT_S)
            except Exception:
                log.exception("the controller tick worker did not stop cleanly")
        for future in list(self._inflight):  # a tick awaited elsewhere (POST /v1/controller/run) ends too
            with contextlib.suppress(InvalidStateError):
                future.set_exception(TickWorkerError(_STOPPED))
        if self._listener is not None:
            self._logs.put(None)
            await asyncio.to_thread(self._listener.join, CLOSE_TIMEOUT_S)
            self._listener = None
            self._logs.close()
            self._logs.join_thread()
        # The queue's three locks are named semaphores the resource tracker knows of; the last
        # reference going unlinks them. ``serve`` ends by re-raising SIGTERM/SIGINT (no atexit
        # finalizers run), so a queue still referenced then would be reported as leaked.
        self._logs = None
        self._hold_until = None


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
