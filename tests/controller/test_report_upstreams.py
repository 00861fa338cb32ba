"""The weekly report's per-upstream table: the same figures as ``upstream_stats`` over the week,
in every format, with names escaped per format (CSV formulas, Markdown pipes, HTML tags), and a
note when retention has deleted the start of the week.

Every test runs on SQLite and PostgreSQL (the ``sessionmaker`` fixture).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_render import render
from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Call
from hedgerow.controller.store.upstreams import upstream_stats
from hedgerow.settings import Settings

WEEK = IsoWeek.parse("2026-W48")
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)  # the week after: W48 is complete
NAMES = ('=HYPERLINK("x")', "a|b`c", "<i>up</i>")


def _records() -> list[CallRecord]:
    out = []
    for i in range(30):
        at = WEEK.since + timedelta(hours=5 * i + 1)
        slow, fast = NAMES[i % 3], NAMES[(i + 1) % 3]
        if i % 2:
            atts: tuple[AttemptRecord, ...] = (
                AttemptRecord(slow, "primary", 0.0, None, 0.9, "cancelled", 200, None, 2),
                AttemptRecord(fast, "backup", 0.5, 0.9, 2.0, "won", 200, None, 20),
            )
            out.append(CallRecord(f"h{i}", "chat", "m1", at, hedged=True, hedge_reason="ttft_timeout",
                                  winner="backup", ttft_s=0.9, prompt_tokens=300, attempts=atts))  # fmt: skip
        else:
            atts = (AttemptRecord(slow, "primary", 0.0, 0.3, 1.0, "won", 200, None, 20),)
            out.append(CallRecord(f"p{i}", "chat", "m1", at, winner="primary", ttft_s=0.3, attempts=atts))
    return out


async def _fill(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, _records(), defaults=route_defaults(Settings()))


async def test_the_table_in_every_format(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _fill(sessionmaker)
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    async with sessionmaker() as session:
        direct = await upstream_stats(session, since=WEEK.since, until=WEEK.until)
    table = report["upstreams"]
    assert table["rows"] == direct["upstreams"] and table["hedges"] == 15 and len(table["rows"]) == 3
    assert json.loads(render(report, "json"))["upstreams"]["rows"][0]["upstream"] in NAMES

    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    upstream_rows = [r for r in rows if r["scope"] == "upstream"]
    assert [r["scope"] for r in rows] == ["route", "total", "upstream", "upstream", "upstream"]
    by_name = {r["upstream"]: r for r in upstream_rows}
    assert set(by_name) == {'\'=HYPERLINK("x")', "a|b`c", "<i>up</i>"}  # the formula is text
    for row in table["rows"]:
        shown = "'" + row["upstream"] if row["upstream"].startswith("=") else row["upstream"]
        cells = by_name[shown]
        assert int(cells["attempts"]) == row["attempts"] and int(cells["hedges_caused"]) == row["hedges_caused"]
        assert int(cells["loser_completion_tokens"]) == row["loser_completion_tokens"]
        assert int(cells["loser_prompt_tokens"]) == row["loser_prompt_tokens"]
    # each of the 15 cancelled primaries re-sent the call's 300-token prompt: the loser's real cost
    assert sum(row["loser_prompt_tokens"] for row in table["rows"]) == 15 * 300
    assert all(r["route"] == "" and r["calls"] == "" for r in upstream_rows)

    md = render(report, "md")
    assert "## Upstreams" in md and "a\\|b\\`c" in md and "\\<i\\>up\\</i\\>" in md
    table_lines = [line for line in md.splitlines() if line.startswith("| ") and "\\<i\\>" in line]
    assert table_lines and all(line.count(" | ") == 11 for line in table_lines)  # 12 cells: no extra column
    assert any(" | 1,500 | " in line for line in table_lines)  # 5 losing primaries x 300 prompt tokens
    assert "still kept" not in md

    html = render(report, "html")
    assert "<h2>Upstreams</h2>" in html and "&lt;i&gt;up&lt;/i&gt;" in html and "<i>up</i>" not in html
    assert '<td data-label="loser prompt tokens">1,500</td>' in html

    # a report stored before the prompt tokens were counted still renders (an en dash, an empty cell)
    for row in report["upstreams"]["rows"]:
        del row["loser_prompt_tokens"]
    assert '<td data-label="loser prompt tokens">–</td>' in render(report, "html")
    assert " | – | " in render(report, "md")
    old_csv = [r for r in csv.DictReader(io.StringIO(render(report, "csv"))) if r["scope"] == "upstream"]
    assert {r["loser_prompt_tokens"] for r in old_csv} == {""}


async def test_a_week_partly_deleted_by_retention_says_so(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _fill(sessionmaker)
    cut = WEEK.since + timedelta(days=3, hours=2)
    from hedgerow.controller.store.rollups import fold_hours

    await fold_hours(sessionmaker, now=NOW)  # the rollup job ran before retention
    async with sessionmaker() as session, session.begin():
        await session.execute(delete(Call).where(Call.started_at < cut))
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    assert report["total"]["calls"] == 30 and report["upstreams"]["calls"] == 15
    md = render(report, "md")
    assert "15 of the week's 30 calls are still kept" in md
    assert "15 of the week&#39;s 30 calls are still kept" in render(report, "html")


async def test_a_week_without_calls_has_no_upstream_table(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    report = await weekly_report(sessionmaker, WEEK, now=NOW)
    assert report["upstreams"]["rows"] == []
    assert "## Upstreams" not in render(report, "md") and "<h2>Upstreams</h2>" not in render(report, "html")
    assert [r["scope"] for r in csv.DictReader(io.StringIO(render(report, "csv")))] == ["total"]
