"""Flag changes posted to a webhook: the changes, the bodies, the delivery, and a real tick's flag."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.flag_webhook import (
    FlagChange,
    FlagWebhook,
    flag_changes,
    latest_reasons,
    slack_escape,
    undecided_flags,
    webhook_payload,
)
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.conftest import CallFactory
from tests.controller.flag_workload import slow_backup_calls
from tests.controller.webhook_receiver import WebhookReceiver

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_changes_are_the_notified_codes_that_went_up_or_down() -> None:
    before = ["hysteresis_hold", "backups_rarely_win"]
    after = ["raise_over_budget", "hedges_did_not_lower_p99", "step_down_limited"]
    changes = flag_changes("chat", "m", before, after, NOW)
    assert [(c.flag, c.raised) for c in changes] == [
        ("hedges_did_not_lower_p99", True),
        ("raise_over_budget", True),
        ("backups_rarely_win", False),
    ]
    assert flag_changes("chat", "m", after, after, NOW) == []  # nothing changed, nothing posted


def test_slack_body_escapes_names_and_json_body_carries_each_change() -> None:
    changes = [
        FlagChange("<!channel> & co\n", "m", "backups_rarely_win", True, NOW),
        FlagChange("chat", "m", "raise_over_budget", False, NOW),
    ]
    text = webhook_payload(changes, "slack")["text"]
    lines = text.split("\n")
    assert lines[0] == "hedgerow: 2 flag changes" and len(lines) == 3  # the name's newline did not split a line
    assert "route &lt;!channel&gt; &amp; co\\n (model m)" in lines[1]  # no mention, no raw newline
    assert "backups win rarely" in lines[1]
    assert lines[2] == "• raise_over_budget cleared on route chat (model m)"
    assert slack_escape("a<b>") == "a&lt;b&gt;"
    body = webhook_payload(changes, "json")
    assert body["event"] == "hedgerow.flags"
    assert body["changes"][0] == {
        "route": "<!channel> & co\n",
        "model": "m",
        "flag": "backups_rarely_win",
        "change": "raised",
        "at": NOW.isoformat(),
        "meaning": "(flag) backups win rarely: they may share the primary's queue",
    }


async def test_posts_are_retried_and_delivered_once() -> None:
    with WebhookReceiver(fail_first=1) as receiver:
        webhook = FlagWebhook(receiver.url, "json", attempts=3, backoff_s=0.01, timeout_s=5)
        webhook.submit(flag_changes("chat", "m", [], ["backups_rarely_win"], NOW))
        await webhook.drain(timeout_s=10)
        await webhook.aclose()
    assert receiver.statuses == [503, 200]
    assert [c["flag"] for c in receiver.delivered[0]["changes"]] == ["backups_rarely_win"]
    assert (webhook.posted, webhook.failed, webhook.dropped) == (1, 0, 0)


async def test_a_webhook_that_is_down_drops_the_oldest_changes_beyond_the_bound_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with WebhookReceiver(fail_first=100) as receiver:
        webhook = FlagWebhook(receiver.url, "json", attempts=1, backoff_s=0.0, timeout_s=5, max_pending=3)
        changes = [FlagChange(f"r{i}", "m", "backups_rarely_win", True, NOW) for i in range(5)]
        webhook.submit(changes)  # the task has not run yet: 5 wait, 2 dropped
        await webhook.drain(timeout_s=10)
        await webhook.aclose()
    assert webhook.dropped == 2 and webhook.failed == 1 and webhook.posted == 0
    assert [c["route"] for c in receiver.bodies[0]["changes"]] == ["r2", "r3", "r4"]
    assert "dropping the oldest" in caplog.text and "not delivered after 1 attempt" in caplog.text


def test_off_unless_configured() -> None:
    assert FlagWebhook.from_settings(Settings()) is None
    webhook = FlagWebhook.from_settings(Settings(flag_webhook_url="http://127.0.0.1:9/hook", report_webhook_attempts=2))
    assert webhook is not None and webhook.attempts == 2 and webhook.fmt == "slack"


async def test_a_real_tick_raises_a_flag_that_the_store_shows(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    """Hedges whose backups never win: the tick flags ``backups_rarely_win``; the flags of the newest
    history row (what a new lease holder starts from) show it; the change is what gets posted."""
    settings = Settings()
    records = slow_backup_calls(call_factory, "slow-backup", NOW, seed=7)
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(settings))
    async with sessionmaker() as session:
        assert await latest_reasons(session) == {}  # no history yet: every flag counts as raised
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    after = row["reason"].split(",")
    assert "backups_rarely_win" in after
    async with sessionmaker() as session:
        before = await latest_reasons(session)
    assert before == {("chat", "m1"): after}
    raised = flag_changes("chat", "m1", [], after, NOW)
    assert "backups_rarely_win" in [c.flag for c in raised if c.raised]
    assert flag_changes("chat", "m1", before[("chat", "m1")], after, NOW) == []
    with WebhookReceiver() as receiver:
        webhook = FlagWebhook(receiver.url, "slack", attempts=1, backoff_s=0.0, timeout_s=5)
        webhook.submit(raised)
        await webhook.drain(timeout_s=10)
        await webhook.aclose()
    assert "backups_rarely_win raised on route chat (model m1)" in receiver.delivered[0]["text"]


def test_a_check_that_did_not_run_neither_clears_nor_raises_its_flag() -> None:
    """A tick whose window was shrunk to the data since a change has no P99 check: the flag stays."""
    before = ["tail_min", "hedges_did_not_lower_p99"]
    shrunk: dict[str, Any] = {"reason": "tail_min,drift_window", "details": {"binding": "tail"}, "backup_win_rate": 0.5}
    undecided = undecided_flags(shrunk)
    assert undecided == {"hedges_did_not_lower_p99"}
    assert flag_changes("chat", "m", before, shrunk["reason"].split(","), NOW, undecided) == []
    full = {"reason": "tail_min", "details": {"p99_check": {"flagged": False}}, "backup_win_rate": None}
    assert undecided_flags(full) == {"backups_rarely_win"}
    [cleared] = flag_changes("chat", "m", before, ["tail_min"], NOW, undecided_flags(full))
    assert (cleared.flag, cleared.raised) == ("hedges_did_not_lower_p99", False)
    # an undecided flag is not raised either
    assert flag_changes("chat", "m", [], ["hedges_did_not_lower_p99"], NOW, {"hedges_did_not_lower_p99"}) == []


async def test_a_new_lease_holder_logs_and_posts_only_real_flag_changes(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The flags already up in the newest history row (a previous holder's tick) are not logged as
    raised again by a process's first tick, and not posted."""
    import logging

    from hedgerow.controller.events import EVENT_LOGGER
    from hedgerow.controller.scheduler import ControllerScheduler

    settings = Settings(controller_tick_in="loop")
    now = datetime.now(UTC)
    records = slow_backup_calls(call_factory, "restart", now, seed=5)
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(settings))
    [first] = await run_tick(sessionmaker, settings)  # the previous holder's tick
    assert "backups_rarely_win" in first["reason"]
    caplog.set_level(logging.INFO, logger=EVENT_LOGGER)
    with WebhookReceiver() as receiver:
        scheduler = ControllerScheduler(
            sessionmaker, settings.model_copy(update={"flag_webhook_url": receiver.url}), holder="new"
        )
        try:
            [row] = await scheduler.tick() or []
            assert "backups_rarely_win" in row["reason"]
            assert scheduler.flag_webhook is not None
            await scheduler.flag_webhook.drain(timeout_s=10)
        finally:
            await scheduler.shutdown(timeout_s=5)
        assert receiver.bodies == []
    raised = [r for r in caplog.records if getattr(r, "event", None) == "flag_raised"]
    assert raised == []
