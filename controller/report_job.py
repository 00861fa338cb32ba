"""The scheduled weekly report: write its files and post it to a webhook, once per ISO week.

Run by :class:`hedgerow.controller.scheduler.ControllerScheduler` on the lease holder, at
``HEDGEROW_REPORT_CRON`` (default Monday 00:10 UTC) and once shortly after start (so a week whose
Monday run was missed, the process being down, is still delivered), whenever
``HEDGEROW_REPORT_DIR`` or ``HEDGEROW_REPORT_WEBHOOK_URL`` is set. It reports the ISO week that
ended before the run.

Exactly once
------------
Before anything is written or sent, the job claims the week: ``INSERT INTO report_deliveries
(kind, period, ...) ... ON CONFLICT (kind, period) DO NOTHING``. The unique key makes the insert
succeed for one process only, on SQLite and PostgreSQL alike, even when two ``serve`` processes
(a lease handover, a clock skew) run the job at the same moment; the loser logs who holds it and
does nothing. A claimed week is never claimed again: a delivery that failed after every retry
stays ``failed`` (with its error) until an operator deletes the row to have it sent again. A week
without calls is not claimed (nothing to report; a later run may still send it).

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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.db import dialect_insert
from hedgerow.controller.models import ReportDelivery, utc_now
from hedgerow.controller.report import IsoWeek
from hedgerow.controller.report_render import render, summary_text
from hedgerow.controller.report_store import weekly_report

__all__ = ["WEEKLY", "DeliveryResult", "claim_delivery", "deliver_weekly_report", "post_webhook", "report_job_enabled"]

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
            claimed) or ``taken`` (claimed elsewhere).
        files: the files written; attempts: webhook attempts made; error: the last error.
    """

    week: str
    claimed: bool
    status: str
    files: list[str] = field(default_factory=list)
    attempts: int = 0
    error: str | None = None


def report_job_enabled(settings: Any) -> bool:
    """Whether the scheduled report has anywhere to go (``report_dir`` or ``report_webhook_url`` set)."""
    return bool(settings.report_dir or settings.report_webhook_url)


async def claim_delivery(
    sessionmaker: async_sessionmaker[AsyncSession], kind: str, period: str, holder: str, *, now: datetime | None = None
) -> str | None:
    """Claim the delivery of (kind, period) for ``holder``, atomically; safe to call from many processes.

    Returns:
        None when this call claimed it; else the holder id of the process that had.
    """
    now = utc_now() if now is None else now
    async with sessionmaker() as session, session.begin():
        stmt = (
            dialect_insert(session, ReportDelivery)
            .values(kind=kind, period=period, claimed_by=holder, claimed_at=now, status="sending", attempts=0)
            .on_conflict_do_nothing(index_elements=["kind", "period"])
            .returning(ReportDelivery.id)
        )
        inserted = (await session.execute(stmt)).first()
        if inserted is not None:
            return None
        row = (
            await session.execute(
                ReportDelivery.__table__.select().where(ReportDelivery.kind == kind, ReportDelivery.period == period)
            )
        ).first()
        return "unknown" if row is None else str(row.claimed_by)


async def post_webhook(
    url: str, payload: dict[str, Any], *, attempts: int, backoff_s: float, timeout_s: float
) -> tuple[bool, int, str | None]:
    """POST ``payload`` as JSON to ``url``, retrying with exponential backoff.

    Args:
        url: the webhook; payload: the JSON body.
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
                    log.info("report webhook: delivered on attempt %d (HTTP %d)", attempt, response.status_code)
                    return True, attempt, None
                error = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            log.warning("report webhook: attempt %d of %d failed: %s", attempt, attempts, error)
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


async def deliver_weekly_report(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Any,
    holder: str,
    *,
    week: IsoWeek | None = None,
    now: datetime | None = None,
) -> DeliveryResult:
    """Claim, build, write and post the weekly report of ``week`` (default: the week before ``now``'s).

    Args:
        sessionmaker: the store; settings: ``hedgerow.settings.Settings`` (``report_*``);
        holder: this process's holder id (recorded as the claimer).
        week: the week to deliver; now: the current time (aware UTC; default now).

    Returns:
        A :class:`DeliveryResult` (also logged).
    """
    now = utc_now() if now is None else now
    week = IsoWeek.of(now).previous() if week is None else week
    report = await weekly_report(sessionmaker, week, now=now)
    if report["total"]["calls"] == 0:
        log.info("weekly report %s: no calls, nothing to deliver", week)
        return DeliveryResult(str(week), False, "empty")
    holder_before = await claim_delivery(sessionmaker, WEEKLY, str(week), holder, now=now)
    if holder_before is not None:
        log.info("weekly report %s: already claimed by %s, not sent again", week, holder_before)
        return DeliveryResult(str(week), False, "taken")
    result = DeliveryResult(str(week), True, "written")
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
        log.exception("weekly report %s: delivery failed", week)
    async with sessionmaker() as session, session.begin():
        await session.execute(
            update(ReportDelivery)
            .where(ReportDelivery.kind == WEEKLY, ReportDelivery.period == str(week))
            .values(
                status=result.status,
                attempts=result.attempts,
                files=result.files,
                error=None if result.error is None else result.error[:1000],
                finished_at=utc_now(),
            )
        )
    log.info(
        "weekly report %s: %s (files: %s; webhook attempts: %d)",
        week,
        result.status,
        ", ".join(result.files) or "none",
        result.attempts,
    )
    return result
