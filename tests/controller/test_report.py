"""The weekly report's figures equal those computed straight from the raw records (SQLite and PostgreSQL).

The week spans folded hours (the rollup job ran on Thursday noon) and hours not folded yet, a
price change on Wednesday noon, an upstream with a price of its own, and a route without a price.
Counts and token sums must be exact, money equal to rounding, quantiles within the histogram's
stated error (delivered, TPOT, e2e: 2.33 %; the primary's Kaplan-Meier quantile: inside the
reported ``[low_s, high_s)`` interval).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.policy.estimation import estimate_ttft
from hedgerow.controller.policy.ttft_histogram import MAX_RELATIVE_ERROR
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.report.report_store import weekly_report
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.prices import PriceBook, list_prices, parse_price, set_price
from hedgerow.controller.store.rollups import fold_hours
from hedgerow.settings import Settings
from tests.controller.report_workload import (
    EDGE_CALLS,
    MONDAY,
    PRICES,
    direct_figures,
    exact_quantile,
    week_records,
)

#: Reports are made "on Tuesday 2026-12-01 06:00 UTC": the week is complete.
NOW = datetime(2026, 12, 1, 6, tzinfo=UTC)
#: The rollup job last ran on Thursday noon: every hour before is folded, none after.
FOLDED_UNTIL = datetime(2026, 11, 26, 12, tzinfo=UTC)


async def _store(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord]) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))
        for price in PRICES:
            spec = parse_price(
                {
                    "upstream": price.upstream or None,
                    "effective_from": price.since.isoformat(),
                    "input_usd_per_mtok": price.input_usd,
                    "output_usd_per_mtok": price.output_usd,
                    "cached_input_usd_per_mtok": price.cached_usd,
                },
                model="m-priced",
            )
            await set_price(session, spec, source="api", actor="test")


def _in_week(records: list[CallRecord]) -> list[CallRecord]:
    return [r for r in records if MONDAY <= r.started_at < MONDAY + timedelta(days=7)]


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * abs(b) + 1e-12


def _check_section(section: dict[str, Any], records: list[CallRecord]) -> None:
    expected = direct_figures(records)
    assert section["calls"] == expected["calls"]
    assert section["calls_by_status"]["ok"] == expected["ok"]
    assert section["calls_by_status"]["error"] == expected["error"]
    assert section["hedges"] == expected["hedges"]
    assert section["hedge_denied"] == expected["denied"]
    assert section["backup_wins"] == expected["backup_wins"]
    assert section["failovers"] == expected["failovers"]
    tokens = section["tokens"]
    assert tokens["prompt"] == expected["prompt"]
    assert tokens["completion"] == expected["completion"]
    assert tokens["extra_prompt"] == expected["extra_prompt"]
    assert tokens["extra_completion"] == expected["extra_completion"]
    assert tokens["extra_prompt"] > 0  # a backup re-sends the prompt: the real price of a hedge
    for level, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)):
        assert _close(section["ttft_s"][level], exact_quantile(expected["ttfts"], q), MAX_RELATIVE_ERROR), level
    assert _close(section["tpot_s"]["p90"], exact_quantile(expected["tpots"], 0.9), MAX_RELATIVE_ERROR)
    assert _close(section["e2e_s"]["p99"], exact_quantile(expected["e2es"], 0.99), MAX_RELATIVE_ERROR)
    km = estimate_ttft(expected["primary"], expected["censored"])
    for level, name in (("p50", "p50_s"), ("p90", "p90_s"), ("p99", "p99_s")):
        exact = getattr(km, name)
        reported = section["primary_ttft_s"][level]
        if exact is None:  # censoring hides it from the exact KM curve: no bound above either
            assert reported["high_s"] is None and reported["low_s"] <= km.max_observed_s, level
            continue
        assert reported["low_s"] <= exact, level
        assert reported["high_s"] is None or exact < reported["high_s"], level
    assert section["primary_censored"] == sum(expected["censored"])


@pytest.mark.slow
async def test_report_figures_equal_the_raw_records(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    records = week_records()
    await _store(sessionmaker, records)
    before_fold = await weekly_report(sessionmaker, "2026-W48", now=NOW)
    folded = await fold_hours(sessionmaker, now=FOLDED_UNTIL)
    assert folded  # some hours of the week are folded, the rest are read from raw calls
    report = await weekly_report(sessionmaker, "2026-W48", now=NOW)
    assert report == before_fold  # the same figures whether or not the job ran
    assert report["partial"] is False and report["week"] == "2026-W48"

    week = _in_week(records)
    by_route = {(s["route"], s["model"]): s for s in report["routes"]}
    assert set(by_route) == {("batch", "m-free"), ("chat", "m-priced")}
    for (route, model), section in by_route.items():
        _check_section(section, [r for r in week if (r.route, r.model) == (route, model)])
    _check_section(report["total"], week)

    # money: the priced route at the prices of each hour (the change on Wednesday noon included)
    priced = by_route[("chat", "m-priced")]["cost"]
    expected = direct_figures([r for r in week if r.route == "chat"])
    assert priced["price_status"] == "priced"
    assert math.isclose(priced["spend_usd"], expected["spend_usd"], rel_tol=1e-9)
    assert math.isclose(priced["overhead_usd"], expected["overhead_usd"], rel_tol=1e-9)
    assert math.isclose(priced["overhead_share"], expected["overhead_usd"] / expected["spend_usd"], rel_tol=1e-9)
    # a route without a price says so and invents nothing; the total covers the priced tokens
    free = by_route[("batch", "m-free")]["cost"]
    assert free["price_status"] == "no price" and free["spend_usd"] is None and free["overhead_usd"] is None
    assert free["unpriced_tokens"] == direct_figures([r for r in week if r.route == "batch"])["unpriced"]
    assert report["total"]["cost"]["price_status"] == "partial"
    assert math.isclose(report["total"]["cost"]["spend_usd"], priced["spend_usd"], rel_tol=1e-9)

    # the previous week is compared
    change = by_route[("chat", "m-priced")]["change"]
    previous = direct_figures(
        [r for r in records if r.request_id.startswith("prev-") or r.request_id == "edge-previous-week"]
    )
    assert change["calls"]["previous"] == previous["calls"]
    assert change["calls"]["delta"] == by_route[("chat", "m-priced")]["calls"] - previous["calls"]
    assert report["moved_most"]["p99"][0]["route"] == "chat"


@pytest.mark.parametrize("when", [edge for edge in EDGE_CALLS])
async def test_iso_week_edges(sessionmaker: async_sessionmaker[AsyncSession], when: tuple[str, datetime, bool]) -> None:
    request_id, at, in_week = when
    records = [r for r in week_records(per_route=5) if r.request_id == request_id]
    await _store(sessionmaker, records)
    report = await weekly_report(sessionmaker, "2026-W48", now=NOW)
    assert report["total"]["calls"] == (1 if in_week else 0)
    other = IsoWeek.of(at)
    assert (str(other) == "2026-W48") is in_week
    assert (await weekly_report(sessionmaker, other, now=NOW))["total"]["calls"] == 1


async def test_a_week_in_progress_is_partial_and_not_empty_before_any_fold(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime(2026, 11, 25, 10, 30, tzinfo=UTC)
    records = [r for r in week_records(per_route=200) if MONDAY <= r.started_at < now]
    await _store(sessionmaker, records)
    report = await weekly_report(sessionmaker, None, now=now)
    assert report["week"] == "2026-W48" and report["partial"] is True
    assert report["total"]["calls"] == len(records) > 0  # the current hour included


async def test_price_rows_are_an_audit_trail_and_reloading_adds_nothing(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    async with sessionmaker() as session, session.begin():
        spec = parse_price(
            {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2, "effective_from": "2026-11-23"}, model="m"
        )
        _, added = await set_price(session, spec, source="file", actor="file:p.json")
        _, again = await set_price(session, spec, source="file", actor="file:p.json")
        corrected = parse_price(
            {"input_usd_per_mtok": 1.5, "output_usd_per_mtok": 2, "effective_from": "2026-11-23"}, model="m"
        )
        await set_price(session, corrected, source="api", actor="alice")
    assert added and not again
    async with sessionmaker() as session:
        prices = await list_prices(session)
    assert [(p.input_usd_per_mtok, p.actor) for p in prices] == [(1.0, "file:p.json"), (1.5, "alice")]
    newest = PriceBook(prices).lookup("m", "any", MONDAY)
    assert newest is not None and newest.input_usd_per_mtok == 1.5  # the newest correction
    assert PriceBook(prices).lookup("m", "any", MONDAY - timedelta(hours=1)) is None


async def test_small_and_near_one_second_figures_are_written_as_measured(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A 0.5 ms TPOT was printed as "0 ms" and a 0.9996 s P99 as "1000 ms" in the HTML and
    Markdown reports; now "0.5 ms" and "1.00 s"."""
    from hedgerow.controller.report.report_render import to_html, to_markdown

    await _store(sessionmaker, week_records(per_route=60))
    report = await weekly_report(sessionmaker, "2026-W48", now=datetime(2026, 12, 1, tzinfo=UTC))
    report["total"]["tpot_s"]["p50"] = 0.0005
    report["total"]["ttft_s"]["p99"] = 0.9996
    html, md = to_html(report), to_markdown(report)
    html = re.sub(r"<[^>]+>", "", html)  # the text, without the tags that keep a value on one line
    assert "0.5 ms / " in html and "0 ms / " not in html
    assert "TTFT P99 1.00 s delivered" in md and "1000 ms" not in md + html


async def test_the_calls_card_says_when_the_previous_week_has_no_data(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """With no calls in the previous week the calls card read "vs 2026-W46" with no figure before it.

    ``week_records`` puts 150 calls in W47 and none in W46, so W47's report has no previous week
    and W48's has one.
    """
    from hedgerow.controller.report.report_render import to_html

    await _store(sessionmaker, week_records(per_route=20))
    now = datetime(2026, 12, 1, tzinfo=UTC)
    first = await weekly_report(sessionmaker, "2026-W47", now=now)
    assert first["total"]["calls"] > 0 and first["total"]["change"]["calls"]["delta"] is None
    html = to_html(first)
    assert "<span>no data in 2026-W46</span>" in html and "<span> vs 2026-W46</span>" not in html
    second = to_html(await weekly_report(sessionmaker, "2026-W48", now=now))
    assert " vs 2026-W47</span>" in second and "no data in" not in second


async def test_a_week_without_calls_says_so_and_claims_no_price_or_rate(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A week before any data read "0 calls ... spend $0.0000, price_status priced": a priced,
    measured week of nothing. Now its cost is "no calls" with null sums, ``no_calls`` is true, and
    no format shows a $0 spend, a 0% rate or a "priced" status; the summary says no calls were
    recorded. The week after (with calls) is unchanged: priced, with figures."""
    from hedgerow.controller.report.report_render import to_csv, to_html, to_markdown

    await _store(sessionmaker, week_records(per_route=20))  # calls in W47 and W48, none in W40
    now = datetime(2026, 12, 1, tzinfo=UTC)
    empty = await weekly_report(sessionmaker, "2026-W40", now=now)
    assert empty["no_calls"] is True and empty["total"]["calls"] == 0
    cost = empty["total"]["cost"]
    assert cost["price_status"] == "no calls", cost
    assert cost["spend_usd"] is None and cost["overhead_usd"] is None and cost["overhead_share"] is None
    assert empty["total"]["hedge_rate"] is None and empty["total"]["backup_win_rate"] is None
    md, html, csv_text = to_markdown(empty), to_html(empty), to_csv(empty)
    for text in (md, html):
        assert "no calls were recorded in this week (Mon 2026-09-28 to Sun 2026-10-04, UTC)" in text, text[:600]
        assert "$0" not in text and "0.0%" not in text and "priced" not in text
    assert "spend_usd" in csv_text and ",no calls," in csv_text and ",priced," not in csv_text
    busy = await weekly_report(sessionmaker, "2026-W48", now=now)
    assert busy["no_calls"] is False and busy["total"]["cost"]["price_status"] in ("priced", "partial")
    assert busy["total"]["cost"]["spend_usd"] > 0
    assert "no calls were recorded" not in to_markdown(busy)


@pytest.mark.parametrize(
    ("saved_s", "said"),
    [
        (0.12, "(saved 120 ms)"),
        (0.0, "(no P99 saving: the backups did not beat the primaries' own tail)"),
        (-0.012, "(no P99 saving: delivered 12 ms above the primaries' own P99)"),
        (None, "(P99 saving unknown)"),
    ],
)
async def test_the_summary_says_what_a_zero_or_negative_p99_saving_means(
    sessionmaker: async_sessionmaker[AsyncSession], saved_s: float | None, said: str
) -> None:
    """The summary (a demo's report pools its three ways) read "saved 0 ms" or "saved -12 ms":
    a saving that is none. It now says there was none, and by how much the delivered P99 was
    above the primaries' own when it was."""
    from hedgerow.controller.report.report_render import summary_text, to_html, to_markdown

    await _store(sessionmaker, week_records(per_route=20))
    report = await weekly_report(sessionmaker, "2026-W48", now=datetime(2026, 12, 1, tzinfo=UTC))
    report["total"]["p99_saved_s"] = saved_s
    summary = summary_text(report)
    assert said in summary, summary
    assert "saved 0 ms" not in summary and "saved -" not in summary and "saved –" not in summary
    assert said in to_markdown(report)
    assert said.replace("'", "&#39;") in to_html(report)


async def test_the_summary_says_no_backups_ran_in_a_week_without_hedges_or_failovers(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A week with 0% hedges read "the backups did not beat the primaries' own tail" though no
    backup ran; with neither hedges nor failovers it now says that no backups ran."""
    from hedgerow.controller.report.report_render import summary_text

    await _store(sessionmaker, week_records(per_route=20))
    report = await weekly_report(sessionmaker, "2026-W48", now=datetime(2026, 12, 1, tzinfo=UTC))
    report["total"]["p99_saved_s"] = 0.0
    report["total"]["hedges"], report["total"]["failovers"] = 0, 0
    summary = summary_text(report)
    assert "(no P99 saving: no backups ran)" in summary, summary
    assert "did not beat" not in summary
    report["total"]["hedges"] = 3
    assert "(no P99 saving: the backups did not beat the primaries' own tail)" in summary_text(report)
