"""The weekly report's per-client table: each client's figures by the route sections' rules (a
client that made every call of a route has that route's figures), only calls with a client
grouped and the others counted, in every format, with names escaped per format (a CSV formula,
Markdown pipes and brackets, HTML tags).

Every test runs on SQLite and PostgreSQL (the ``sessionmaker`` fixture).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.calls_filters import FAILED_STATUSES
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_render import render
from hedgerow.controller.report.report_store import weekly_report
from tests.controller.report_store_helpers import fill_store
from tests.controller.report_workload import week_records

WEEK = IsoWeek.parse("2026-W48")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)  # the week after: W48 is complete
FORMULA = '=HYPERLINK("x")'
TAGGED = "<i>gw</i>|b"


def _same_figures(row: dict[str, Any], section: dict[str, Any]) -> None:
    """A client row has the figures of a route section (or the total) over the same calls."""
    assert row["calls"] == section["calls"] and row["calls_by_status"] == section["calls_by_status"]
    assert row["hedges"] == section["hedges"] and row["hedge_rate"] == section["hedge_rate"]
    assert row["failovers"] == section["failovers"]
    assert row["failed_calls"] == sum(section["calls_by_status"][s] for s in FAILED_STATUSES) > 0
    assert row["ttft_s"] == {"p50": section["ttft_s"]["p50"], "p99": section["ttft_s"]["p99"]}
    assert row["price_status"] == section["cost"]["price_status"]
    if section["cost"]["spend_usd"] is None:
        assert row["spend_usd"] is None
    else:
        assert row["spend_usd"] == pytest.approx(section["cost"]["spend_usd"])


async def test_one_client_of_every_call_has_the_totals_figures(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await fill_store(sessionmaker, per_route=150)  # every call's client is "t"
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    table = report["clients"]
    assert [row["client"] for row in table["rows"]] == ["t"]
    assert table["calls_without_client"] == 0 and table["calls"] == report["total"]["calls"]
    assert table["truncated"] is False
    _same_figures(table["rows"][0], report["total"])
    assert "carry no client" not in render(report, "md")


async def test_clients_by_route_escaped_in_every_format(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """``chat`` calls by a gateway key named like a spreadsheet formula, ``batch`` calls half by a
    key with markup in its name and half without a client."""
    records = []
    for record in week_records(per_route=150):
        if record.route == "chat":
            client: str | None = FORMULA
        else:
            client = TAGGED if int(record.request_id.rsplit("-", 1)[1]) % 2 else None
        records.append(dataclasses.replace(record, client=client))
    await fill_store(sessionmaker, records=records)
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    table = report["clients"]
    chat = next(s for s in report["routes"] if s["route"] == "chat")
    batch = next(s for s in report["routes"] if s["route"] == "batch")
    formula, tagged = table["rows"]  # most calls first: chat's 150 (+2 edge calls), then 75 of batch's
    assert formula["client"] == FORMULA and tagged["client"] == TAGGED
    _same_figures(formula, chat)
    assert tagged["calls"] + table["calls_without_client"] == batch["calls"] == 150
    assert table["calls_without_client"] == 75 and tagged["spend_usd"] is None
    assert tagged["price_status"] == "no price"  # batch's model has no price

    assert json.loads(render(report, "json"))["clients"] == table

    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert [r["scope"] for r in rows][-2:] == ["client", "client"]
    by_name = {r["client"]: r for r in rows if r["scope"] == "client"}
    assert set(by_name) == {"'" + FORMULA, TAGGED}  # the formula is text
    cells = by_name["'" + FORMULA]
    assert int(cells["calls"]) == formula["calls"] and int(cells["failed_calls"]) == formula["failed_calls"]
    assert float(cells["hedge_rate"]) == pytest.approx(formula["hedge_rate"], rel=1e-5)
    assert float(cells["ttft_p99_s"]) == pytest.approx(formula["ttft_s"]["p99"], rel=1e-5)
    assert float(cells["spend_usd"]) == pytest.approx(formula["spend_usd"], rel=1e-5)
    assert cells["route"] == "" and by_name[TAGGED]["spend_usd"] == "" and by_name[TAGGED]["price_status"] == "no price"
    [total] = [r for r in rows if r["scope"] == "total"]
    assert total["calls_without_client"] == "75"

    md = render(report, "md")
    assert "## Clients" in md and "\\<i\\>gw\\</i\\>\\|b" in md and "<i>gw</i>" not in md
    lines = [line for line in md.splitlines() if line.startswith(("| =HYPERLINK", "| \\<i\\>"))]
    assert len(lines) == 2 and all(line.count(" | ") == 7 for line in lines)  # 8 cells: no extra column
    assert "75 of the week's calls carry no client and are in no row." in md

    html = render(report, "html")
    assert "<h2>Clients</h2>" in html and "&lt;i&gt;gw&lt;/i&gt;|b" in html and "<i>gw</i>" not in html
    assert "75 of the week&#39;s calls carry no client" in html


async def test_a_report_stored_before_the_table_renders_without_it(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    await fill_store(sessionmaker, per_route=20)
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    del report["clients"]
    assert "## Clients" not in render(report, "md") and "<h2>Clients</h2>" not in render(report, "html")
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert "client" not in {r["scope"] for r in rows} and {r["calls_without_client"] for r in rows} == {""}


async def test_a_week_without_calls_has_no_client_table(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    assert report["clients"] == {"rows": [], "truncated": False, "calls": 0, "calls_without_client": 0}
    assert "## Clients" not in render(report, "md") and "<h2>Clients</h2>" not in render(report, "html")


async def test_a_week_partly_deleted_by_retention_says_so(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    from sqlalchemy import delete

    from hedgerow.controller.store.models import Call
    from hedgerow.controller.store.rollups import fold_hours

    await fill_store(sessionmaker, per_route=40)
    await fold_hours(sessionmaker, now=NOW)  # the rollup job ran before retention
    async with sessionmaker() as session, session.begin():
        await session.execute(delete(Call).where(Call.started_at < WEEK.since + timedelta(days=3)))
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    kept, total = report["clients"]["calls"], report["total"]["calls"]
    assert 0 < kept < total and report["clients"]["rows"][0]["calls"] == kept
    assert f"Per-client figures are read from raw calls: {kept:,} of the week's {total:,} calls" in render(report, "md")
