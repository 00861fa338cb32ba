"""Two ``hedgerow serve`` processes on one PostgreSQL store send the weekly report once.

Both run the report job every minute (``HEDGEROW_REPORT_CRON="* * * * *"``) and once 5 s after
start, with a webhook on a local receiver and a report directory each. The lease holder delivers
the week that just ended; then it is stopped, the other process takes the lease and runs the job
at the next minute: the week is already claimed, so nothing is posted or written again. Skipped
without ``HEDGEROW_TEST_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import ReportDelivery
from hedgerow.settings import Settings
from tests.conftest import fresh_pg_database, make_call
from tests.controller.webhook_receiver import WebhookReceiver
from tests.e2e.test_lease_two_serve import _lease_holder_pid
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.fixture
async def fresh_pg_url() -> AsyncIterator[str]:
    """A new, empty PostgreSQL database, dropped after the test."""
    async with fresh_pg_database("hedgerow_report") as url:
        yield url


async def _fill_previous_week(url: str) -> str:
    """Calls spread over the ISO week before now; returns that week."""
    week = IsoWeek.of(datetime.now(UTC)).previous()
    records = [
        make_call(f"w{i}", started_at=week.since + timedelta(hours=2 * i + 1), primary_ttft_s=0.2 + (i % 10) / 10)
        for i in range(60)
    ]
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            await ingest_calls(session, records, defaults=route_defaults(Settings()))
    finally:
        await engine.dispose()
    return str(week)


async def _deliveries(url: str) -> list[tuple[str, str, str]]:
    from sqlalchemy import select

    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            rows = (await session.scalars(select(ReportDelivery))).all()
            return [(r.period, r.status, r.claimed_by) for r in rows]
    finally:
        await engine.dispose()


async def _wait(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what} within {timeout_s:.0f} s")


async def test_two_serve_processes_send_one_weekly_report(fresh_pg_url: str, tmp_path: Path) -> None:
    upgrade_database(fresh_pg_url)
    week = await _fill_previous_week(fresh_pg_url)
    with WebhookReceiver(fail_first=1) as receiver:
        servers: list[ServeProcess] = []
        try:
            for name in ("a", "b"):
                workdir = tmp_path / name
                workdir.mkdir()
                env = {
                    "HEDGEROW_CONTROLLER_INTERVAL_S": "3600",
                    "HEDGEROW_LEASE_TTL_S": "3",
                    "HEDGEROW_REPORT_CRON": "* * * * *",
                    "HEDGEROW_REPORT_DIR": str(workdir / "reports"),
                    "HEDGEROW_REPORT_WEBHOOK_URL": receiver.url,
                    "HEDGEROW_REPORT_WEBHOOK_BACKOFF_S": "0.2",
                }
                servers.append(ServeProcess(fresh_pg_url, workdir, env))

            async def delivered() -> bool:
                return any(status == "sent" for _, status, _ in await _deliveries(fresh_pg_url))

            await _wait(delivered, 120, "no report delivered")
            [(period, status, claimed_by)] = await _deliveries(fresh_pg_url)
            assert (period, status) == (week, "sent")
            holder_pid = int(claimed_by.split(":")[-2])
            holder = next(s for s in servers if s.proc.pid == holder_pid)
            survivor = next(s for s in servers if s is not holder)
            holder.stop()  # releases the lease; the survivor takes it and runs the job next minute

            async def survivor_holds() -> bool:
                return await _lease_holder_pid(fresh_pg_url) == survivor.proc.pid

            await _wait(survivor_holds, 30, "the survivor did not take the lease")
            took_over = datetime.now(UTC)
            next_run = took_over.replace(second=0, microsecond=0) + timedelta(minutes=1)
            await asyncio.sleep((next_run - took_over).total_seconds() + 10)  # its cron run came and went
            assert await _lease_holder_pid(fresh_pg_url) == survivor.proc.pid
        finally:
            for server in servers:
                server.stop()
    assert receiver.statuses == [503, 200]  # retried once, delivered once, never again
    assert week in receiver.delivered[0]["text"]
    assert await _deliveries(fresh_pg_url) == [(week, "sent", claimed_by)]
    holder_dir = Path(holder.log).parent / "reports"
    survivor_dir = Path(survivor.log).parent / "reports"
    assert sorted(p.name for p in holder_dir.iterdir()) == [
        f"hedgerow-weekly-{week}.html",
        f"hedgerow-weekly-{week}.json",
    ]
    assert not survivor_dir.exists()
