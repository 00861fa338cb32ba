"""The scheduled weekly report: files, a webhook that fails twice then succeeds, and one delivery per week."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from hedgerow.controller.models import ReportDelivery
from hedgerow.controller.report import IsoWeek
from hedgerow.controller.report_job import claim_delivery, deliver_weekly_report
from hedgerow.controller.report_store import weekly_report
from hedgerow.settings import Settings
from tests.controller.report_store_helpers import fill_store
from tests.controller.webhook_receiver import WebhookReceiver

#: Monday of W49, after the job's 00:10 run: the week to deliver is W48.
NOW = datetime(2026, 11, 30, 0, 10, tzinfo=UTC)


def _settings(tmp_path: Path, url: str, **overrides) -> Settings:
    return Settings(
        report_dir=str(tmp_path / "reports"),
        report_formats="html,json,csv,md",
        report_webhook_url=url,
        report_webhook_backoff_s=0.05,
        **overrides,
    )


async def test_webhook_failing_twice_then_succeeding_delivers_once(sessionmaker, tmp_path: Path) -> None:
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
    assert (row.period, row.status, row.attempts, row.claimed_by) == ("2026-W48", "sent", 3, "holder-1")
    assert len(row.files or []) == 4 and row.finished_at is not None


async def test_a_receiver_that_never_accepts_leaves_a_failed_delivery(sessionmaker, tmp_path: Path) -> None:
    await fill_store(sessionmaker, per_route=50)
    with WebhookReceiver(fail_first=100, fail_status=500) as receiver:
        settings = _settings(tmp_path, receiver.url, report_webhook_attempts=3, report_webhook_format="json")
        result = await deliver_weekly_report(sessionmaker, settings, "h", now=NOW)
        assert (result.status, result.attempts) == ("failed", 3) and "HTTP 500" in (result.error or "")
        assert len(receiver.bodies) == 3 and receiver.bodies[0]["schema"] == "hedgerow.weekly_report/1"
        assert (await deliver_weekly_report(sessionmaker, settings, "h", now=NOW)).status == "taken"
        assert len(receiver.bodies) == 3


async def test_a_week_without_calls_is_not_claimed(sessionmaker, tmp_path: Path) -> None:
    with WebhookReceiver() as receiver:
        result = await deliver_weekly_report(sessionmaker, _settings(tmp_path, receiver.url), "h", now=NOW)
    assert (result.status, receiver.bodies) == ("empty", [])


async def test_concurrent_claims_of_one_week_have_one_winner(sessionmaker) -> None:
    week = str(IsoWeek.parse("2026-W48"))
    answers = await asyncio.gather(*(claim_delivery(sessionmaker, "weekly", week, f"p{i}") for i in range(6)))
    winners = [i for i, holder in enumerate(answers) if holder is None]
    assert len(winners) == 1
    assert {holder for holder in answers if holder is not None} == {f"p{winners[0]}"}
