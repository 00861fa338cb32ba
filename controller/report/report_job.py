"""The scheduled weekly report: write its files and post it to a webhook, once per ISO week.

Run by :class:`hedgerow.controller.scheduler.ControllerScheduler` on the lease holder, at
``HEDGEROW_REPORT_CRON`` (default Monday 00:10 UTC) and once shortly after start (so a week whose
Monday run was missed, the process being down, is still delivered), whenever
``HEDGEROW_REPORT_DIR`` or ``HEDGEROW_REPORT_WEBHOOK_URL`` is set. It reports the ISO week that
ended before the run.

Once per week, retried until delivered
--------------------------------------
Before anything is written or sent, the job claims the week: ``INSERT INTO report_deliveries
(kind, period, ...) ... ON CONFLICT (kind, period) DO NOTHING``. The unique key makes the insert
succeed for one process only, on SQLite and PostgreSQL alike, even when two ``serve`` processes
(a lease handover, a clock skew) run the job at the same moment; the loser logs who holds it and
does nothing. A week without calls is not claimed (nothing to report; a later run may still send it).

A claim is one *delivery run* (``attempts`` counts the runs of the week). A run that fails
(files not written, or every webhook post refused) is marked ``failed`` and run again, on a later
look of the lease holder (every ``HEDGEROW_REPORT_RETRY_INTERVAL_S``, and with each scheduled
run), once ``HEDGEROW_REPORT_RETRY_BACKOFF_S * 2 ** (runs - 1)`` has passed since it ended, up
to ``HEDGEROW_REPORT_DELIVERY_RUNS`` runs; then it stays ``failed`` with its last error (delete
the row to have it sent again). A claim still ``sending`` after ``HEDGEROW_REPORT_SENDING_STALE_S``
belonged to a process that died mid-delivery: it is taken back and run again (a run past the
last one is marked ``failed`` instead). Taking a claim back is one compare-and-set ``UPDATE``
(same status and run count), so two processes never both take it, and a run whose claim was
taken back does not overwrite the outcome of the newer run.

Only the lease holder starts a run: the scheduler passes its lease check as ``fence``, run last
in every transaction that claims a run (the first claim, a take-back, giving up a stale claim),
so a process that lost the lease claims nothing and so writes and posts nothing. The outcome of a
run already claimed is recorded unfenced: it is what this process did under its own claim, the
compare-and-set on (holder, run) keeps it from overwriting a newer run, and dropping it would
only have the week sent again.

A delivered week (``sent``, or ``written`` without a webhook) is never sent again, with one
window (at-least-once): a process that dies after the webhook accepted the post and before the
row says ``sent``, or a post whose answer is lost (a timeout after the receiver took it), has
the week sent again by the retry; receivers see a duplicate, never a gap.

Files are ``<report_dir>/hedgerow-weekly-<week>.<format>`` for each of ``HEDGEROW_REPORT_FORMATS``,
written to a temporary name and renamed (a reader never sees half a file). The webhook gets
``{"text": summary}`` (Slack-compatible, ``HEDGEROW_REPORT_WEBHOOK_FORMAT=slack``) or the JSON report
(``json``), retried on a connection error or a non-2xx answer up to
``HEDGEROW_REPORT_WEBHOOK_ATTEMPTS`` times, waiting ``backoff_s * 2 ** (attempt - 1)`` between
attempts; each attempt and the outcome are logged, one line each.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_render import render, summary_text
from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.db import WriteFence, dialect_insert, rowcount
from hedgerow.controller.store.models import ReportDelivery, utc_now

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "WEEKLY",
    "DeliveryResult",
    "claim_delivery",
    "deliver_weekly_report",
    "post_webhook",
    "report_job_enabled",
    "retry_deliveries",
    "run_again_at",
]

log = logging.getLogger(__name__)

#: ``report_deliveries.kind`` of the weekly report.
WEEKLY = "weekly"


@dataclass
class DeliveryResult:
    """What one run of the job did.

    Attributes:
        week: the ISO week (``2026-W48``).
        claimed: False when another process had claimed the week (nothing else was done).
        status: ``sent``, ``failed``, ``written`` (files, no webhook), ``empty`` (no calls, not
            claimed) or ``taken`` (claimed elsewhere, or delivered, or not due for a retry).
        files: the files written; attempts: webhook attempts made in this run; error: the last error.
        run: which delivery run of the week this was (1 the first; 0 when nothing was run).
        retry_at: when a failed run will be run again (None: delivered, or no runs left).
    """

    week: str
    claimed: bool
    status: str
    files: list[str] = field(default_factory=list)
    attempts: int = 0
    error: str | None = None
    run: int = 0
    retry_at: datetime | None = None


def report_job_enabled(settings: Settings) -> bool:
    """Whether the scheduled report has anywhere to go (``report_dir`` or ``report_webhook_url`` set)."""
    return bool(settings.report_dir or settings.report_webhook_url)


async def claim_delivery(
    sessionmaker: async_sessionmaker[AsyncSession],
    kind: str,
    period: str,
    holder: str,
    *,
    now: datetime | None = None,
    fence: WriteFence | None = None,
) -> str | None:
    """Claim the first delivery run of (kind, period) for ``holder``, atomically; safe to call from
    many processes. The row starts ``sending`` with ``attempts`` (runs) 1.

    Args:
        sessionmaker: the store; kind, period: the delivery (``weekly``, ``2026-W48``);
        holder: the claimer's holder id; now: the claim's time (aware UTC; default: now);
        fence: run last in the claiming transaction (the lease check); None: no check.

    Returns:
        None when this call claimed it; else the holder id of the process that had.

    Raises:
        Exception: what ``fence`` raises (``LeaseLost``); nothing is claimed.
    """
    now = utc_now() if now is None else now
    async with sessionmaker() as session, session.begin():
        stmt = (
            dialect_insert(session, ReportDelivery)
            .values(kind=kind, period=period, claimed_by=holder, claimed_at=now, status="sending", attempts=1)
            .on_conflict_do_nothing(index_elements=["kind", "period"])
            .returning(ReportDelivery.id)
        )
        inserted = (await session.execute(stmt)).first()
        if fence is not None:
            await fence(session)
        if inserted is not None:
            return None
        row = (
            await session.execute(
                ReportDelivery.__table__.select().where(ReportDelivery.kind == kind, ReportDelivery.period == period)
            )
        ).first()
        return "unknown" if row is None else str(row.claimed_by)


async def post_webhook(
    url: str,
    payload: dict[str, Any],
    *,
    attempts: int,
    backoff_s: float,
    timeout_s: float,
    what: str = "report webhook",
) -> tuple[bool, int, str | None]:
    """POST ``payload`` as JSON to ``url``, retrying with exponential backoff.

    Args:
        url: the webhook; payload: the JSON body; what: how the log lines name it.
        attempts: the most attempts (>= 1); backoff_s: the wait after the first failure,
            doubled after each further one; timeout_s: per attempt.

    Returns:
        ``(delivered, attempts made, last error or None)``; a 2xx answer is delivered.
    """
    error: str | None = None
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for attempt in range(1, attempts + 1):
            try:
                response = await client.post(url, json=payload)
                if 200 <= response.status_code < 300:
                    log.info("%s: delivered on attempt %d (HTTP %d)", what, attempt, response.status_code)
                    return True, attempt, None
                error = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            log.warning("%s: attempt %d of %d failed: %s", what, attempt, attempts, error)
            if attempt < attempts:
                await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    return False, attempts, error


def _write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    partial = directory / f".{name}.{os.getpid()}.tmp"
    partial.write_text(text, encoding="utf-8")
    partial.replace(target)
    return target


def run_again_at(row: ReportDelivery, settings: Settings) -> datetime | None:
    """When the delivery in ``row`` may be run again, or None when never.

    A ``failed`` run: ``report_retry_backoff_s * 2 ** (runs - 1)`` after it ended; a claim still
    ``sending``: ``report_sending_stale_s`` after it was claimed (its process is taken to have
    died). None for a delivered row (``sent``, ``written``) and once ``report_delivery_runs``
    runs were made.

    Args:
        row: a ``report_deliveries`` row; settings: ``hedgerow.settings.Settings``.
    """
    runs = max(row.attempts, 1)
    if runs >= settings.report_delivery_runs:
        return None
    if row.status == "failed":
        backoff_s = settings.report_retry_backoff_s * 2 ** (runs - 1)
        return (row.finished_at or row.claimed_at) + timedelta(seconds=backoff_s)
    if row.status == "sending":
        return row.claimed_at + timedelta(seconds=settings.report_sending_stale_s)
    return None


async def _take_back(
    sessionmaker: async_sessionmaker[AsyncSession],
    row: ReportDelivery,
    holder: str,
    now: datetime,
    fence: WriteFence | None,
) -> bool:
    """Claim the next run of ``row`` for ``holder`` if it is still as read (compare-and-set on its
    status and run count; ``fence`` run last); True when this call took it."""
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            update(ReportDelivery)
            .where(
                ReportDelivery.id == row.id,
                ReportDelivery.status == row.status,
                ReportDelivery.attempts == row.attempts,
            )
            .values(claimed_by=holder, claimed_at=now, status="sending", attempts=row.attempts + 1, finished_at=None)
        )
        if fence is not None:
            await fence(session)
        return rowcount(result) == 1


async def _run_delivery(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    holder: str,
    week: IsoWeek,
    run: int,
    report: dict[str, Any],
    clock: Callable[[], datetime],
) -> DeliveryResult:
    """Write the files and post the webhook of one claimed run; record and log its outcome."""
    result = DeliveryResult(str(week), True, "written", run=run)
    try:
        if settings.report_dir:
            directory = Path(settings.report_dir)
            for fmt in settings.report_formats.split(","):
                text = await asyncio.to_thread(render, report, fmt)
                path = await asyncio.to_thread(_write, directory, f"hedgerow-weekly-{week}.{fmt}", text)
                result.files.append(str(path))
        if settings.report_webhook_url:
            payload = {"text": summary_text(report)} if settings.report_webhook_format == "slack" else report
            sent, result.attempts, result.error = await post_webhook(
                settings.report_webhook_url,
                payload,
                attempts=settings.report_webhook_attempts,
                backoff_s=settings.report_webhook_backoff_s,
                timeout_s=settings.report_webhook_timeout_s,
            )
            result.status = "sent" if sent else "failed"
    except Exception as exc:
        result.status, result.error = "failed", f"{type(exc).__name__}: {exc}"
        log.exception("weekly report %s: delivery run %d failed", week, run)
    finished_at = clock()
    async with sessionmaker() as session, session.begin():
        recorded = await session.execute(
            update(ReportDelivery)
            .where(
                ReportDelivery.kind == WEEKLY,
                ReportDelivery.period == str(week),
                ReportDelivery.claimed_by == holder,
                ReportDelivery.attempts == run,  # not when the claim was taken back meanwhile
            )
            .values(
                status=result.status,
                files=result.files,
                error=None if result.error is None else result.error[:1000],
                finished_at=finished_at,
            )
        )
    if rowcount(recorded) == 0:
        log.warning("weekly report %s: run %d was taken back by another process; outcome not recorded", week, run)
    if result.status == "failed":
        if run < settings.report_delivery_runs:
            result.retry_at = finished_at + timedelta(seconds=settings.report_retry_backoff_s * 2 ** (run - 1))
            log.warning(
                "weekly report %s: run %d of %d failed (%s); next run at %s",
                week, run, settings.report_delivery_runs, result.error, result.retry_at.isoformat(),
            )  # fmt: skip
        else:
            log.error(
                "weekly report %s: run %d of %d failed (%s); giving up (delete its report_deliveries row to resend)",
                week, run, settings.report_delivery_runs, result.error,
            )  # fmt: skip
    log.info(
        "weekly report %s: %s (run %d; files: %s; webhook attempts: %d)",
        week,
        result.status,
        run,
        ", ".join(result.files) or "none",
        result.attempts,
    )
    return result


def _clock(now: datetime | None) -> Callable[[], datetime]:
    """The time source of a run: ``now`` frozen when given, else the wall clock."""
    return utc_now if now is None else (lambda: now)


async def _delivery_row(sessionmaker: async_sessionmaker[AsyncSession], week: str) -> ReportDelivery | None:
    async with sessionmaker() as session:
        return (
            await session.scalars(
                select(ReportDelivery).where(ReportDelivery.kind == WEEKLY, ReportDelivery.period == week)
            )
        ).first()


async def deliver_weekly_report(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    holder: str,
    *,
    week: IsoWeek | None = None,
    now: datetime | None = None,
    fence: WriteFence | None = None,
) -> DeliveryResult:
    """Claim, build, write and post the weekly report of ``week`` (default: the week before ``now``'s).

    A week claimed before is run again only when its last run failed or its claim is stale and
    the retry is due (:func:`run_again_at`); otherwise nothing is done (``taken``).

    Args:
        sessionmaker: the store; settings: ``hedgerow.settings.Settings`` (``report_*``);
        holder: this process's holder id (recorded as the claimer).
        week: the week to deliver; now: the current time (aware UTC; default the wall clock,
            read at each step).
        fence: the lease check, run last in the claiming transaction; None: no check.

    Returns:
        A :class:`DeliveryResult` (also logged).

    Raises:
        Exception: what ``fence`` raises (``LeaseLost``): nothing claimed, written or posted.
    """
    clock = _clock(now)
    week = IsoWeek.of(clock()).previous() if week is None else week
    report = await weekly_report(sessionmaker, week, now=clock())
    if report["total"]["calls"] == 0:
        log.info("weekly report %s: no calls, nothing to deliver", week)
        return DeliveryResult(str(week), False, "empty")
    holder_before = await claim_delivery(sessionmaker, WEEKLY, str(week), holder, now=clock(), fence=fence)
    run = 1
    if holder_before is not None:
        row = await _delivery_row(sessionmaker, str(week))
        due = None if row is None else run_again_at(row, settings)
        if (
            row is None
            or due is None
            or due > clock()
            or not await _take_back(sessionmaker, row, holder, clock(), fence)
        ):
            status = "none" if row is None else row.status
            log.info("weekly report %s: claimed by %s (%s), not sent again now", week, holder_before, status)
            return DeliveryResult(str(week), False, "taken")
        run = row.attempts + 1
    return await _run_delivery(sessionmaker, settings, holder, week, run, report, clock)


async def retry_deliveries(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    holder: str,
    *,
    now: datetime | None = None,
    fence: WriteFence | None = None,
) -> list[DeliveryResult]:
    """Run again every weekly delivery whose retry is due (:func:`run_again_at`): failed runs
    after their backoff, and claims left ``sending`` by a process that died. A stale claim with
    no runs left is marked ``failed``.

    Args:
        sessionmaker: the store; settings: ``hedgerow.settings.Settings``; holder: this process's
            holder id; now: the current time (aware UTC; default the wall clock).
        fence: the lease check, run last in each transaction that takes a run back or gives a
            claim up; None: no check.

    Returns:
        The result of each run made (oldest week first); empty when none was due.

    Raises:
        Exception: what ``fence`` raises (``LeaseLost``): that claim is left as it was.
    """
    clock = _clock(now)
    async with sessionmaker() as session:
        rows = (
            await session.scalars(
                select(ReportDelivery)
                .where(ReportDelivery.kind == WEEKLY, ReportDelivery.status.in_(("failed", "sending")))
                .order_by(ReportDelivery.period)
            )
        ).all()
    results: list[DeliveryResult] = []
    for row in rows:
        due = run_again_at(row, settings)
        if due is None and row.status == "sending":
            stale_at = row.claimed_at + timedelta(seconds=settings.report_sending_stale_s)
            if stale_at <= clock():
                await _give_up_stale(sessionmaker, row, clock(), fence)
            continue
        if due is None or due > clock() or not await _take_back(sessionmaker, row, holder, clock(), fence):
            continue
        week = IsoWeek.parse(row.period)
        if row.status == "sending":
            log.warning(
                "weekly report %s: claim of %s from %s never finished; running it again",
                week, row.claimed_by, row.claimed_at.isoformat(),
            )  # fmt: skip
        report = await weekly_report(sessionmaker, week, now=clock())
        results.append(await _run_delivery(sessionmaker, settings, holder, week, row.attempts + 1, report, clock))
    return results


async def _give_up_stale(
    sessionmaker: async_sessionmaker[AsyncSession], row: ReportDelivery, now: datetime, fence: WriteFence | None
) -> None:
    """Mark a stale ``sending`` claim with no runs left ``failed`` (if still as read; ``fence`` run last)."""
    error = f"run {row.attempts} claimed by {row.claimed_by} at {row.claimed_at.isoformat()} never finished"
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            update(ReportDelivery)
            .where(
                ReportDelivery.id == row.id,
                ReportDelivery.status == "sending",
                ReportDelivery.attempts == row.attempts,
            )
            .values(status="failed", error=error, finished_at=now)
        )
        if fence is not None:
            await fence(session)
    if rowcount(result):
        log.error("weekly report %s: %s; no runs left, giving up", row.period, error)
