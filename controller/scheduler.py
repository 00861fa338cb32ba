"""The job runner: an APScheduler 3 ``AsyncIOScheduler`` that ticks the controller under a lease.

Two interval jobs run on the caller's event loop:

- ``lease``: every third of ``lease_ttl_s``, take or renew the controller lease;
- ``controller_tick``: every ``controller_interval_s``, renew the lease and, while holding it, run
  :func:`hedgerow.controller.jobs.run_tick`;
- ``rollup``: every ``rollup_interval_s`` (first run ``min(60 s, rollup_interval_s)`` after start),
  renew the lease and, while holding it, fold hourly rollups and delete raw calls older than
  ``retention_s`` (:func:`hedgerow.controller.store.retention.run_retention`);
- after each tick, the flags that went up or down are posted to ``settings.flag_webhook_url``
  when set (:mod:`hedgerow.controller.flag_webhook`; compared with each route's newest history
  row in the store, so a new lease holder posts only real changes);
- ``weekly_report``: at ``report_cron`` (a cron trigger, UTC) and once :data:`REPORT_START_DELAY_S`
  after start, renew the lease and, while holding it, deliver the weekly report of the week that
  ended (:func:`hedgerow.controller.report.report_job.deliver_weekly_report`, once per week whatever
  the number of processes); only when ``report_dir`` or ``report_webhook_url`` is set. Every
  ``report_retry_interval_s`` (and after each run) the deliveries that failed or were left
  ``sending`` by a dead process are run again once due
  (:func:`hedgerow.controller.report.report_job.retry_deliveries`).

So of several api replicas sharing one database, only the lease holder ticks; when it stops (or
dies), another takes over within one TTL.

The lease is renewed through a sessionmaker of its own (``lease_sessionmaker``: on PostgreSQL a
pool of its own, :func:`hedgerow.controller.store.db.make_store_engines`), so ingest filling the other
pools cannot delay a renewal. A renewal that has not answered within a third of the TTL is
abandoned (counted as failed). The process counts itself the holder (:attr:`ControllerScheduler.holding`)
only until :data:`~hedgerow.controller.lease.LEASE_SAFETY_FRACTION` of the TTL has passed since
its last successful renewal started (monotonic clock): a holder whose renewals stall starts no
tick, and each tick's publish checks the lease row in its own transaction
(:func:`~hedgerow.controller.lease.check_lease_held`), so a stale holder never publishes after
another took over. The rollup/retention and weekly report jobs run the same fence last in each of
their writing transactions (``fence=`` of :func:`~hedgerow.controller.store.retention.run_retention`,
:func:`~hedgerow.controller.report.report_job.deliver_weekly_report` and
:func:`~hedgerow.controller.report.report_job.retry_deliveries`): a job that finds the lease lost
rolls that transaction back, stops, and the process steps down as after a refused publish.

Where the tick computes (``settings.controller_tick_in``): ``"process"`` runs it in a worker
process of its own (:mod:`hedgerow.controller._tick_worker`), so that its observation and
decision never hold the interpreter lock of the api that shares this process; the hold deadline
is shared with the worker and its publish runs the same fence. The worker is started by the
``tick_worker_warm_up`` job :data:`WORKER_WARM_UP_S` after start (half the interval if shorter),
or by the first tick if sooner, on every process, holder or not, and kept until
:meth:`ControllerScheduler.shutdown`. ``"loop"`` runs the tick here (the decision in a thread). A
store that a worker cannot open (in-memory SQLite) ticks here, said once in the log.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, timedelta
from typing import TYPE_CHECKING, Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.errors import describe
from hedgerow.controller._tick_worker import TickWorker, worker_url
from hedgerow.controller.events import log_flag_changes, log_lease_change
from hedgerow.controller.flag_webhook import FlagWebhook, flag_changes, latest_reasons, undecided_flags
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.lease import (
    CONTROLLER_LEASE,
    LEASE_SAFETY_FRACTION,
    LeaseLost,
    acquire_lease,
    check_lease_held,
    make_holder_id,
    release_lease,
)
from hedgerow.controller.report.report_job import (
    DeliveryResult,
    deliver_weekly_report,
    report_job_enabled,
    retry_deliveries,
)
from hedgerow.controller.store.models import utc_now
from hedgerow.controller.store.overview import flags_of
from hedgerow.controller.store.retention import RetentionReport, run_retention

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = ["REPORT_START_DELAY_S", "WORKER_WARM_UP_S", "ControllerScheduler"]

#: Seconds after start before the weekly report job's catch-up run (the lease is taken by then).
REPORT_START_DELAY_S = 5.0
#: Seconds after start before the tick worker process is started (or half the tick interval if
#: shorter); a process that stops sooner (e.g. a short-lived test app) never starts one.
WORKER_WARM_UP_S = 30.0

log = logging.getLogger(__name__)


class ControllerScheduler:
    """Runs the controller tick every ``settings.controller_interval_s`` while holding the lease.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings`` (``controller_interval_s``, ``lease_ttl_s`` and
            the policy settings).
        holder: this process's holder id (default: :func:`make_holder_id`).
        lease_sessionmaker: sessions for the lease's renewals and release (default:
            ``sessionmaker``); give it a pool of its own so that other work cannot delay them.
        clock: monotonic seconds (a fake clock in tests).

    Attributes:
        holding: True while this process holds the lease: its last renewal succeeded and
            started less than ``LEASE_SAFETY_FRACTION * lease_ttl_s`` ago (read-only).
        safe_hold_s: that span, seconds.
        ticks: how many ticks this process ran.
        last_tick: the history rows written by the last tick (empty before the first).
        rollups: how many rollup + retention runs this process ran.
        last_rollup: the report of the last one (None before the first).
        on_tick: called after each tick this process ran, with its duration (seconds) and the
            Unix time it finished (e.g. the api's metrics); None by default.
        on_lease: called with True/False whenever this process acquires or loses the lease.
        tick_in: where ticks compute, ``"process"`` (a worker process) or ``"loop"`` (here): the
            ``controller_tick_in`` setting, or ``"loop"`` when a worker cannot open the store.

    Lease changes and each flag raised or cleared are logged (:mod:`hedgerow.controller.events`);
    flags are compared with each route's newest history row in the store before the tick (so a
    process that has just started or taken the lease over logs, and posts to the flag webhook, only
    real changes), and a flag whose check did not run on the new row keeps its state
    (:func:`hedgerow.controller.flag_webhook.undecided_flags`). When that read fails, the flags of
    the previous tick this process ran are used.
    """

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        *,
        holder: str | None = None,
        lease_sessionmaker: async_sessionmaker[AsyncSession] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessionmaker = sessionmaker
        self.lease_sessionmaker = lease_sessionmaker or sessionmaker
        self.settings = settings
        self.holder = holder or make_holder_id()
        self.safe_hold_s = LEASE_SAFETY_FRACTION * settings.lease_ttl_s
        self._clock = clock
        self._held = False  # the last renewal succeeded
        self._renewed_at = -math.inf  # when it started (clock)
        self._reported = False  # what on_lease and the log were last told
        self.ticks = 0
        self.last_tick: list[dict[str, Any]] = []
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._lock = asyncio.Lock()
        self._renew_lock = asyncio.Lock()
        self.rollups = 0
        self.last_rollup: RetentionReport | None = None
        self._rollup_lock = asyncio.Lock()
        self._stopping = False
        self.last_report: DeliveryResult | None = None
        self._report_lock = asyncio.Lock()
        self.on_tick: Callable[[float, float], None] | None = None
        self.on_lease: Callable[[bool], None] | None = None
        self._flags: dict[tuple[str, str], list[str]] = {}
        #: posts each tick's flag changes (``settings.flag_webhook_url``), or None
        self.flag_webhook = FlagWebhook.from_settings(settings)
        self.tick_in = self._tick_mode(sessionmaker, settings)
        self._worker: TickWorker | None = None

    def _tick_mode(self, sessionmaker: async_sessionmaker[AsyncSession], settings: Any) -> str:
        """``"process"`` or ``"loop"``: the setting, or the loop when a worker cannot open the store."""
        mode = str(getattr(settings, "controller_tick_in", "loop"))
        if mode == "process" and worker_url(sessionmaker) is None:
            log.info("controller tick runs on the event loop: a worker process cannot open an in-memory SQLite store")
            return "loop"
        return mode

    @property
    def tick_worker(self) -> TickWorker | None:
        """The worker that computes the ticks (``tick_in == "process"``), None before the first tick."""
        return self._worker

    def _share_hold(self) -> None:
        """Give the tick worker the end of this process's hold on the monotonic clock (-inf: none)."""
        if self._worker is None:
            return
        if self._held:
            remaining_s = self.safe_hold_s - (self._clock() - self._renewed_at)
            self._worker.set_hold_until(time.monotonic() + remaining_s)
        else:
            self._worker.set_hold_until(-math.inf)

    @property
    def holding(self) -> bool:
        """True while the last renewal succeeded and started less than :attr:`safe_hold_s` ago."""
        return self._held and self._clock() - self._renewed_at < self.safe_hold_s

    async def renew(self) -> bool:
        """Take or renew the lease now; returns whether this process holds it.

        A renewal that fails, or has not answered within a third of the TTL (it is then
        cancelled), leaves this process not holding the lease until one succeeds. A process
        that is shutting down (:meth:`shutdown` called) never takes or renews it.
        """
        if self._stopping:
            return False
        # the tick, rollup and report jobs renew on their own: one renewal at a time, so that a
        # change of the lease is seen (and logged) once
        async with self._renew_lock:
            started = self._clock()
            try:
                async with asyncio.timeout(max(self.settings.lease_ttl_s / 3.0, 0.1)):
                    held = await acquire_lease(
                        self.lease_sessionmaker, CONTROLLER_LEASE, self.holder, self.settings.lease_ttl_s
                    )
            except Exception as exc:
                # one line: while the store is down this repeats every renewal
                why = "no answer within a third of the TTL" if isinstance(exc, TimeoutError) else describe(exc)
                log.warning("could not renew the controller lease: %s", why)
                held = False
            self._held = held
            if held:
                self._renewed_at = started
            self._share_hold()
            self._report_lease()
            return self.holding

    def _report_lease(self, *, released: bool = False) -> None:
        """Log and report (``on_lease``) a change of :attr:`holding` since the last report."""
        holding = self.holding
        if holding == self._reported:
            return
        self._reported = holding
        log_lease_change(CONTROLLER_LEASE, self.holder, holding, released=released)
        if self.on_lease is not None:
            self.on_lease(holding)

    async def _fence(self, session: AsyncSession) -> None:
        """The jobs' write fence (the tick's publish, rollups and retention, report claims): still
        holding here, and in the lease row (same transaction).

        Raises:
            LeaseLost: the hold lapsed here, or the row names another holder or expired.
        """
        if not self.holding:
            raise LeaseLost(CONTROLLER_LEASE, self.holder, "no renewal succeeded in time")
        await check_lease_held(session, CONTROLLER_LEASE, self.holder)

    async def tick(self) -> list[dict[str, Any]] | None:
        """Renew the lease and, when held, run one controller tick.

        Returns:
            The history rows written, or None when another process holds the lease.
        """
        async with self._lock:  # never two ticks at once in this process
            if not await self.renew():
                return None
            before = await self._reasons_before()
            started = time.perf_counter()
            try:
                rows = await self._run_tick()
            except LeaseLost as exc:
                self._step_down("controller tick not published", exc)
                return None
            duration_s = time.perf_counter() - started
            self.ticks += 1
            self.last_tick = rows
            at = utc_now()
            changes = []
            for row in rows:
                key = (row["route"], row["model"])
                previous = before.get(key, []) if before is not None else self._flags.get(key, [])
                undecided = undecided_flags(row)
                after = row["reason"].split(",")
                kept = [code for code in after if code not in undecided] + [c for c in previous if c in undecided]
                flags = flags_of(",".join(kept))
                log_flag_changes(row["route"], row["model"], flags_of(",".join(previous)), flags)
                self._flags[key] = flags
                changes += flag_changes(row["route"], row["model"], previous, after, at, undecided)
            if self.flag_webhook is not None:
                self.flag_webhook.submit(changes)
            if self.on_tick is not None:
                self.on_tick(duration_s, time.time())
            return rows

    def _step_down(self, what: str, exc: LeaseLost) -> None:
        """A job's fence found the lease lost: log it (``what``: what was not done), count this
        process no longer the holder until a renewal succeeds, and report the change."""
        log.warning("%s: %s", what, exc)
        self._held = False
        self._share_hold()
        self._report_lease()

    async def _run_tick(self) -> list[dict[str, Any]]:
        """One tick under the fence, here or in the worker process (:attr:`tick_in`)."""
        if self.tick_in != "process":
            return await run_tick(self.sessionmaker, self.settings, fence=self._fence)
        worker = self._tick_worker()
        self._share_hold()
        return await worker.tick(self.holder)

    def _tick_worker(self) -> TickWorker:
        """The tick worker, made (not started) on first use."""
        if self._worker is None:
            url = worker_url(self.sessionmaker)
            assert url is not None  # checked by _tick_mode
            self._worker = TickWorker(url, self.settings)
            self._share_hold()
        return self._worker

    async def warm_up(self) -> None:
        """Start the tick worker process now, if ticks run in one (``tick_in == "process"``).

        :meth:`start` has it run :data:`WORKER_WARM_UP_S` (at most half an interval) after the
        start, on every process, holder or not, so that neither the first tick nor the first
        tick after a takeover waits for a worker to start.
        """
        if self.tick_in == "process" and not self._stopping:
            await self._tick_worker().start()

    async def _reasons_before(self) -> dict[tuple[str, str], list[str]] | None:
        """Each route's reason codes before this tick, from the store (None, logged, on failure:
        the flags of the previous tick this process ran stand in)."""
        try:
            async with self.sessionmaker() as session:
                return await latest_reasons(session)
        except Exception as exc:
            log.warning("could not read the routes' last flags: %s", describe(exc))
            return None

    async def rollup(self) -> RetentionReport | None:
        """Renew the lease and, when held, fold hourly rollups and apply retention once.

        Returns:
            What was folded and deleted, or None when another process holds the lease (or took
            it during the run: its fence stopped it).
        """
        async with self._rollup_lock:  # a slow backlog never runs twice at once here
            if not await self.renew():
                return None
            try:
                report = await run_retention(self.sessionmaker, self.settings, fence=self._fence)
            except LeaseLost as exc:
                self._step_down("rollup and retention stopped", exc)
                return None
            self.rollups += 1
            self.last_rollup = report
            return report

    async def report(self) -> DeliveryResult | None:
        """Renew the lease and, when held, deliver the weekly report of the week that ended.

        Returns:
            What the delivery did, or None when another process holds the lease.
        """
        async with self._report_lock:
            if not await self.renew():
                return None
            try:
                self.last_report = await deliver_weekly_report(
                    self.sessionmaker, self.settings, self.holder, fence=self._fence
                )
                await retry_deliveries(self.sessionmaker, self.settings, self.holder, fence=self._fence)
            except LeaseLost as exc:
                self._step_down("weekly report not claimed", exc)
                return None
            return self.last_report

    async def report_retries(self) -> list[DeliveryResult] | None:
        """Renew the lease and, when held, run again the report deliveries whose retry is due
        (:func:`hedgerow.controller.report.report_job.retry_deliveries`).

        Returns:
            The runs made, or None when another process holds the lease.
        """
        async with self._report_lock:
            if not await self.renew():
                return None
            try:
                return await retry_deliveries(self.sessionmaker, self.settings, self.holder, fence=self._fence)
            except LeaseLost as exc:
                self._step_down("weekly report retries not claimed", exc)
                return None

    async def _report_job(self) -> None:
        await self._job(self.report)

    async def _report_retry_job(self) -> None:
        await self._job(self.report_retries)

    async def _job(self, fn: Any) -> None:
        """Run one scheduled job: failures are logged; at shutdown it does not start, and a
        cancellation by the stopping process ends it quietly (the lease is released after it)."""
        if self._stopping:
            return
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            await fn()
        except Exception:
            log.exception("scheduled controller job failed")
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            log.info("scheduled controller job cancelled at shutdown")
        finally:
            if task is not None:
                self._running.discard(task)

    async def _warm_up_job(self) -> None:
        await self._job(self.warm_up)

    async def _renew_job(self) -> None:
        await self._job(self.renew)

    async def _tick_job(self) -> None:
        await self._job(self.tick)

    async def _rollup_job(self) -> None:
        await self._job(self.rollup)

    def start(self) -> None:
        """Start the scheduler on the running event loop (takes the lease at once)."""
        scheduler = AsyncIOScheduler(timezone=UTC)
        scheduler.add_job(
            self._renew_job,
            "interval",
            seconds=max(self.settings.lease_ttl_s / 3.0, 0.1),
            id="lease",
            next_run_time=utc_now(),
            max_instances=1,
            coalesce=True,
        )
        scheduler.add_job(
            self._tick_job,
            "interval",
            seconds=self.settings.controller_interval_s,
            id="controller_tick",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        scheduler.add_job(
            self._rollup_job,
            "interval",
            seconds=self.settings.rollup_interval_s,
            id="rollup",
            next_run_time=utc_now() + timedelta(seconds=min(60.0, self.settings.rollup_interval_s)),
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        if self.tick_in == "process":
            warm_up_s = min(WORKER_WARM_UP_S, self.settings.controller_interval_s / 2.0)
            scheduler.add_job(
                self._warm_up_job, "date", run_date=utc_now() + timedelta(seconds=warm_up_s), id="tick_worker_warm_up"
            )
        if report_job_enabled(self.settings):
            trigger = CronTrigger.from_crontab(self.settings.report_cron, timezone=UTC)
            scheduler.add_job(self._report_job, trigger, id="weekly_report", max_instances=1, coalesce=True)
            scheduler.add_job(
                self._report_job,
                "date",
                run_date=utc_now() + timedelta(seconds=REPORT_START_DELAY_S),
                id="weekly_report_at_start",
            )
            scheduler.add_job(
                self._report_retry_job,
                "interval",
                seconds=self.settings.report_retry_interval_s,
                id="weekly_report_retry",
                max_instances=1,
                coalesce=True,
            )
        scheduler.start()
        self._scheduler = scheduler

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the jobs, wait (up to ``timeout_s``) for a running one, and release the lease.

        Idempotent. From the first call on the lease is never renewed again; ``timeout_s=0``
        cancels a running job at once (its transaction rolls back) so the lease is released
        without waiting (what ``hedgerow serve`` does on SIGTERM, before draining requests).
        """
        self._stopping = True
        if self._scheduler is not None:
            # no new run, but a running job finishes: APScheduler's shutdown would cancel it at once
            # (and log the CancelledError's traceback)
            self._scheduler.pause()
        running = [t for t in self._running if t is not asyncio.current_task()]
        if running:
            _done, pending = (set(), set(running)) if timeout_s <= 0 else await asyncio.wait(running, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if self._worker is not None:  # gone before the release: nothing it runs can commit after it
            self._worker.set_hold_until(-math.inf)
            await self._worker.close()
        if self.flag_webhook is not None:
            await self.flag_webhook.aclose(timeout_s=min(max(timeout_s, 0.0), 5.0))
        if self._held:
            try:
                await release_lease(self.lease_sessionmaker, CONTROLLER_LEASE, self.holder)
            except Exception:
                log.exception("could not release the controller lease")
            self._held = False
            self._report_lease(released=True)
