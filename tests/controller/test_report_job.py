"""The scheduled weekly report: files, a webhook that fails twice then succeeds, and one delivery per week."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_job import claim_delivery, deliver_weekly_report, retry_deliveries
from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.models import ReportDelivery
from hedgerow.settings import Settings
from tests.controller.report_store_helpers import fill_store
from tests.controller.webhook_receiver import WebhookReceiver

#: Monday of W49, after the job's 00:10 run: the week to deliver is W48.
NOW = datetime(2026, 11, 30, 0, 10, tzinfo=UTC)


def _settings(tmp_path: Path, url: str, **overrides: Any) -> Settings:
    return Settings(
        report_dir=str(tmp_path / "reports"),
        report_formats="html,json,csv,md",
        report_webhook_url=url,
        report_webhook_backoff_s=0.05,
        **overrides,
    )


async def test_webhook_failing_twice_then_succeeding_delivers_once(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=100)
    with WebhookReceiver(fail_first=2) as receiver:
        settings = _settings(tmp_path, receiver.url)
        result = await deliver_weekly_report(sessionmaker, settings, "holder-1", now=NOW)
        assert (result.week, result.status, result.attempts) == ("2026-W48", "sent", 3)
        assert receiver.statuses == [503, 503, 200]
        [body] = receiver.delivered
        assert set(body) == {"text"} and "2026-W48" in body["text"] and "spend $" in body["text"]
        # a second run, by this process or another, sends nothing
        again = await deliver_weekly_report(sessionmaker, settings, "holder-2", now=NOW)
        assert (again.claimed, again.status) == (False, "taken")
        assert len(receiver.bodies) == 3
    files = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert files == [f"hedgerow-weekly-2026-W48.{fmt}" for fmt in ("csv", "html", "json", "md")]
    written = json.loads((tmp_path / "reports" / "hedgerow-weekly-2026-W48.json").read_text())
    expected = await weekly_report(sessionmaker, "2026-W48", now=NOW)
    assert written == expected  # the job, the api and the CLI share one report
    async with sessionmaker() as session:
        row = (await session.scalars(select(ReportDelivery))).one()
    # one delivery run (its three posts are in the result)
    assert (row.period, row.status, row.attempts, row.claimed_by) == ("2026-W48", "sent", 1, "holder-1")
    assert len(row.files or []) == 4 and row.finished_at is not None


async def test_a_receiver_that_never_accepts_leaves_a_failed_delivery(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=50)
    with WebhookReceiver(fail_first=100, fail_status=500) as receiver:
        settings = _settings(tmp_path, receiver.url, report_webhook_attempts=3, report_webhook_format="json")
        result = await deliver_weekly_report(sessionmaker, settings, "h", now=NOW)
        assert (result.status, result.attempts) == ("failed", 3) and "HTTP 500" in (result.error or "")
        assert len(receiver.bodies) == 3 and receiver.bodies[0]["schema"] == "hedgerow.weekly_report/1"
        assert (await deliver_weekly_report(sessionmaker, settings, "h", now=NOW)).status == "taken"
        assert len(receiver.bodies) == 3


async def test_a_week_without_calls_is_not_claimed(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    with WebhookReceiver() as receiver:
        result = await deliver_weekly_report(sessionmaker, _settings(tmp_path, receiver.url), "h", now=NOW)
    assert (result.status, receiver.bodies) == ("empty", [])


async def test_concurrent_claims_of_one_week_have_one_winner(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    week = str(IsoWeek.parse("2026-W48"))
    answers = await asyncio.gather(*(claim_delivery(sessionmaker, "weekly", week, f"p{i}") for i in range(6)))
    winners = [i for i, holder in enumerate(answers) if holder is None]
    assert len(winners) == 1
    assert {holder for holder in answers if holder is not None} == {f"p{winners[0]}"}


async def _row(sessionmaker: async_sessionmaker[AsyncSession]) -> ReportDelivery:
    async with sessionmaker() as session:
        return (await session.scalars(select(ReportDelivery))).one()


async def test_a_failed_delivery_is_run_again_after_its_backoff_until_delivered(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=50)
    with WebhookReceiver(fail_first=2) as receiver:
        # one post per run: each failure is a failed run, retried after 600 s, then 1200 s
        settings = _settings(tmp_path, receiver.url, report_webhook_attempts=1, report_retry_backoff_s=600.0)
        first = await deliver_weekly_report(sessionmaker, settings, "h1", now=NOW)
        assert (first.status, first.run, first.retry_at) == ("failed", 1, NOW + timedelta(seconds=600))
        assert (await _row(sessionmaker)).status == "failed"
        # not due yet: the scheduled run and the retry look send nothing
        assert (await deliver_weekly_report(sessionmaker, settings, "h1", now=NOW + timedelta(seconds=599))).status == (
            "taken"
        )
        assert await retry_deliveries(sessionmaker, settings, "h1", now=NOW + timedelta(seconds=599)) == []
        assert len(receiver.bodies) == 1
        t2 = NOW + timedelta(seconds=600)
        [second] = await retry_deliveries(sessionmaker, settings, "h2", now=t2)  # another process may retry it
        assert (second.week, second.status, second.run) == ("2026-W48", "failed", 2)
        assert await retry_deliveries(sessionmaker, settings, "h2", now=t2 + timedelta(seconds=1199)) == []
        [third] = await retry_deliveries(sessionmaker, settings, "h2", now=t2 + timedelta(seconds=1200))
        assert (third.status, third.run, third.retry_at) == ("sent", 3, None)
        assert receiver.statuses == [503, 503, 200] and len(receiver.delivered) == 1
        row = await _row(sessionmaker)
        assert (row.status, row.attempts, row.claimed_by, row.error) == ("sent", 3, "h2", None)
        # delivered: never sent again, by a retry look or by a scheduled run, however late
        later = NOW + timedelta(days=30)
        assert await retry_deliveries(sessionmaker, settings, "h1", now=later) == []
        again = await deliver_weekly_report(sessionmaker, settings, "h1", week=IsoWeek.parse("2026-W48"), now=later)
        assert again.status == "taken" and len(receiver.bodies) == 3


async def test_retries_stop_after_the_last_run(sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path) -> None:
    await fill_store(sessionmaker, per_route=50)
    with WebhookReceiver(fail_first=1000, fail_status=500) as receiver:
        settings = _settings(
            tmp_path, receiver.url, report_webhook_attempts=2, report_retry_backoff_s=60.0, report_delivery_runs=3
        )
        assert (await deliver_weekly_report(sessionmaker, settings, "h", now=NOW)).run == 1
        runs = []
        for minutes in range(5, 60 * 24, 5):  # a look every 5 minutes for a day
            runs += await retry_deliveries(sessionmaker, settings, "h", now=NOW + timedelta(minutes=minutes))
        assert [(r.run, r.status) for r in runs] == [(2, "failed"), (3, "failed")]
        assert runs[-1].retry_at is None and len(receiver.bodies) == 3 * 2  # three runs of two posts
    row = await _row(sessionmaker)
    assert (row.status, row.attempts) == ("failed", 3) and "HTTP 500" in (row.error or "")


async def test_a_claim_left_sending_by_a_dead_process_is_taken_back(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=50)
    # a process claimed W48 and died before recording an outcome: the claim says `sending`
    assert await claim_delivery(sessionmaker, "weekly", "2026-W48", "dead-process", now=NOW) is None
    with WebhookReceiver(fail_first=1) as receiver:
        settings = _settings(tmp_path, receiver.url, report_sending_stale_s=3600.0, report_retry_backoff_s=600.0)
        before = NOW + timedelta(seconds=3599)  # it may still be sending: left alone
        assert (await deliver_weekly_report(sessionmaker, settings, "h", now=before)).status == "taken"
        assert await retry_deliveries(sessionmaker, settings, "h", now=before) == [] and receiver.bodies == []
        [taken_back] = await retry_deliveries(sessionmaker, settings, "h", now=NOW + timedelta(seconds=3600))
        # run 2; its first post fails, the second (in-run backoff) is accepted
        assert (taken_back.status, taken_back.run, taken_back.attempts) == ("sent", 2, 2)
        assert receiver.statuses == [503, 200]
    row = await _row(sessionmaker)
    assert (row.status, row.attempts, row.claimed_by) == ("sent", 2, "h")


async def test_a_stale_claim_with_no_runs_left_is_marked_failed(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=50)
    assert await claim_delivery(sessionmaker, "weekly", "2026-W48", "dead-process", now=NOW) is None
    with WebhookReceiver() as receiver:
        settings = _settings(tmp_path, receiver.url, report_delivery_runs=1)
        assert await retry_deliveries(sessionmaker, settings, "h", now=NOW + timedelta(hours=2)) == []
        assert receiver.bodies == []
    row = await _row(sessionmaker)
    assert row.status == "failed" and "dead-process" in (row.error or "") and "never finished" in (row.error or "")


async def test_two_processes_retrying_at_once_run_a_week_once(
    sessionmaker: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    await fill_store(sessionmaker, per_route=50)
    with WebhookReceiver(fail_first=1) as receiver:
        settings = _settings(tmp_path, receiver.url, report_webhook_attempts=1, report_retry_backoff_s=60.0)
        assert (await deliver_weekly_report(sessionmaker, settings, "a", now=NOW)).status == "failed"
        due = NOW + timedelta(seconds=60)
        answers = await asyncio.gather(*(retry_deliveries(sessionmaker, settings, f"p{i}", now=due) for i in range(4)))
        assert sorted(len(a) for a in answers) == [0, 0, 0, 1]
        assert receiver.statuses == [503, 200]
