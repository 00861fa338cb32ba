"""The rollup/retention and weekly report jobs write nothing once their process lost the lease.

A takeover the old holder did not see is made real: the lease in the store is taken by ``new``
(expired from the point of view of a clock past the old holder's TTL). Every writing transaction
of the jobs runs the fence last, so with the old holder's fence nothing is folded, sealed,
deleted, pruned or claimed, and no report is written or posted; with the new holder's fence the
same calls write. The scheduler test renews through a store of its own (what the old process
saw: its renewals succeed) while the jobs' store names another holder (what it did not see).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import Table, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.lease import CONTROLLER_LEASE, LeaseLost, acquire_lease, check_lease_held
from hedgerow.controller.report.report_job import deliver_weekly_report, retry_deliveries
from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.db import WriteFence, make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.models import (
    Call,
    HourlyRollup,
    MinuteAggregate,
    ReportDelivery,
    ThresholdHistory,
    utc_now,
)
from hedgerow.controller.store.retention import run_retention
from hedgerow.settings import Settings
from tests.controller.report_store_helpers import fill_store
from tests.controller.webhook_receiver import WebhookReceiver

#: Monday of W49 after the job's 00:10 run: the week to deliver is W48 (the week fill_store fills).
REPORT_NOW = datetime(2026, 11, 30, 0, 10, tzinfo=UTC)
#: The lease's TTL, seconds: long enough that no holder's hold lapses during a run on a loaded machine
#: (the jobs are not started, so nothing renews in the background).
LEASE_TTL_S = 600.0
#: A retention run late enough that every call of W48 is past a one-day retention age.
RETENTION_NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


async def _counts(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    """Rows per table the jobs write."""
    out: dict[str, int] = {}
    async with sessionmaker() as session:
        for model in (Call, HourlyRollup, MinuteAggregate, ThresholdHistory, ReportDelivery):
            table = model.__table__
            assert isinstance(table, Table)
            out[table.name] = int(await session.scalar(select(func.count()).select_from(table)) or 0)
    return out


async def _take_over(sessionmaker: async_sessionmaker[AsyncSession], ttl_s: float) -> None:
    """``new`` takes the controller lease, as it would once the old holder's TTL ran out."""
    later = utc_now() + timedelta(seconds=ttl_s + 1.0)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "new", 3600.0, now=later)


def _settings(tmp_path: Path, webhook_url: str) -> Settings:
    return Settings(
        lease_ttl_s=LEASE_TTL_S,
        retention_s=86400.0,
        history_retention_s=3600.0,
        applied_history_retention_s=3600.0,
        max_window_s=3600.0,
        report_dir=str(tmp_path / "reports"),
        report_formats="json",
        report_webhook_url=webhook_url,
        report_webhook_attempts=1,
        report_retry_backoff_s=0.0,
    )


def _reports(tmp_path: Path) -> list[str]:
    folder = tmp_path / "reports"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _fence(holder: str) -> WriteFence:
    """The lease check of ``holder``'s writes."""
    return partial(check_lease_held, name=CONTROLLER_LEASE, holder=holder)


async def test_retention_and_report_writes_are_refused_to_a_holder_that_lost_the_lease(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=10)
    assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "old", LEASE_TTL_S)
    await _take_over(sessionmaker, LEASE_TTL_S)
    before = await _counts(sessionmaker)
    assert before["calls"] > 0 and before["hourly_rollups"] == 0
    with WebhookReceiver() as receiver:
        settings = _settings(tmp_path, receiver.url)
        with pytest.raises(LeaseLost, match="new holds it"):
            await run_retention(sessionmaker, settings, now=RETENTION_NOW, fence=_fence("old"))
        with pytest.raises(LeaseLost, match="new holds it"):
            await deliver_weekly_report(sessionmaker, settings, "old", now=REPORT_NOW, fence=_fence("old"))
        assert await _counts(sessionmaker) == before  # nothing folded, deleted, pruned or claimed
        assert receiver.bodies == [] and _reports(tmp_path) == []

        # the holder's own runs go through the same fence and write
        report = await run_retention(sessionmaker, settings, now=RETENTION_NOW, fence=_fence("new"))
        after = await _counts(sessionmaker)
        assert report.folded and after["hourly_rollups"] == len(report.folded)
        delivered = await deliver_weekly_report(sessionmaker, settings, "new", now=REPORT_NOW, fence=_fence("new"))
        assert delivered.status == "sent" and len(receiver.delivered) == 1


async def test_a_failed_delivery_is_not_taken_back_by_a_holder_that_lost_the_lease(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=10)
    with WebhookReceiver(fail_first=1, fail_status=500) as receiver:
        settings = _settings(tmp_path, receiver.url)
        assert (await deliver_weekly_report(sessionmaker, settings, "old", now=REPORT_NOW)).status == "failed"
        assert await acquire_lease(sessionmaker, CONTROLLER_LEASE, "old", LEASE_TTL_S)
        await _take_over(sessionmaker, LEASE_TTL_S)
        due = REPORT_NOW + timedelta(hours=1)
        with pytest.raises(LeaseLost, match="new holds it"):
            await retry_deliveries(sessionmaker, settings, "old", now=due, fence=_fence("old"))
        async with sessionmaker() as session:
            row = (await session.scalars(select(ReportDelivery))).one()
        assert (row.status, row.attempts, row.claimed_by) == ("failed", 1, "old")  # not taken back
        assert len(receiver.bodies) == 1
        [again] = await retry_deliveries(sessionmaker, settings, "new", now=due, fence=_fence("new"))
        assert (again.status, again.run) == ("sent", 2) and len(receiver.bodies) == 2


async def test_the_scheduler_jobs_step_down_when_their_fence_finds_the_lease_taken(
    migrated_url: str, tmp_path: Path
) -> None:
    """Renewals succeed (in the store the process renews through) while the jobs' store names
    another holder: the rollup and report retry jobs write nothing and the process steps down."""
    jobs_engine = make_engine(migrated_url)
    lease_url = f"sqlite+aiosqlite:///{tmp_path / 'lease.db'}"
    upgrade_database(lease_url)
    lease_engine = make_engine(lease_url)
    jobs = make_sessionmaker(jobs_engine)
    try:
        await fill_store(jobs, per_route=10)
        with WebhookReceiver(fail_first=1, fail_status=500) as receiver:
            settings = _settings(tmp_path, receiver.url)
            assert (await deliver_weekly_report(jobs, settings, "old", now=REPORT_NOW)).status == "failed"
            assert await acquire_lease(jobs, CONTROLLER_LEASE, "old", LEASE_TTL_S)
            await _take_over(jobs, LEASE_TTL_S)
            before = await _counts(jobs)
            leader = ControllerScheduler(
                jobs, settings, holder="old", lease_sessionmaker=make_sessionmaker(lease_engine)
            )
            changes: list[bool] = []
            leader.on_lease = changes.append
            assert await leader.rollup() is None and leader.rollups == 0
            assert not leader.holding and changes == [True, False]
            assert await leader.report_retries() is None
            assert await _counts(jobs) == before and len(receiver.bodies) == 1
            await leader.shutdown()

            successor = ControllerScheduler(jobs, settings, holder="new")
            report = await successor.rollup()
            assert report is not None and report.folded
            retried = await successor.report_retries()
            assert retried is not None and [r.status for r in retried] == ["sent"]
            await successor.shutdown()
    finally:
        await lease_engine.dispose()
        await jobs_engine.dispose()
