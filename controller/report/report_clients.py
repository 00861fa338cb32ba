"""The weekly report's per-client table: who made the week's calls (a gateway caller's key name,
an app's tag), each client's calls, hedges, failures, TTFT and spend; its rows in Markdown and CSV
(the HTML template renders the same JSON).

``report["clients"]`` (added by :func:`~hedgerow.controller.report.report_store.weekly_report`)
is ``{"rows": [row...], "truncated", "calls", "calls_without_client"}``: a row per ``client`` of
the week's calls (the record's field: the name of the gateway key that made a gateway call, a
library app's tag, by default its host's name), most calls first, at most :data:`MAX_CLIENTS`
(``truncated`` says when more were left out). Only calls with a client are grouped;
``calls_without_client`` counts the others, and every format says how many. A row is
``{"client", "calls", "calls_by_status", "hedges", "hedge_rate", "failovers", "failed_calls",
"failure_rate", "ttft_s": {"p50", "p99"}, "spend_usd", "price_status"}``.

Each figure follows the rule of the report's route sections
(:func:`~hedgerow.controller.report.report.section_figures`): the client's calls of each (route,
model) and hour are folded as the hourly rollups fold a route's
(:func:`~hedgerow.controller.store.rollups.fold_rows`), then merged: ``hedge_rate`` is hedges (a
backup started because the primary was slow) over calls, ``failovers`` the calls given a backup
because the primary failed, ``failed_calls`` those of status ``error``, ``timeout`` or ``stalled``
(:data:`~hedgerow.controller.calls_filters.FAILED_STATUSES`, the calls explorer's ``failed``),
``ttft_s`` the delivered TTFT quantiles of the call-level histogram (within 2.33 %), and
``spend_usd`` every attempt's tokens at the price in force at its hour's start for its (model,
upstream) (``price_status`` as a route's: ``priced``, ``partial``, ``no price``).

The rollups have no client dimension, so the table is read from the raw calls, one (route, hour)
with client calls at a time as the rollup job reads an hour (on the ``(route_id, started_at)``
index; memory bounded by one route's hour of calls, and a client's hours of a route merged while no
price of its model changes): it covers only the calls retention has kept
(``HEDGEROW_RETENTION_S``), and ``calls`` counts them; the formats say so when the rollups count
more (:func:`~hedgerow.controller.report.report_upstreams.coverage_note`).

Names are escaped per format as the routes are (:mod:`hedgerow.controller.report.report_render`):
Markdown by ``markdown_text``, CSV by ``csv_text``, HTML by autoescaping after ``visible``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.calls_filters import FAILED_STATUSES
from hedgerow.controller.report.report import HourRollup, IsoWeek, section_figures
from hedgerow.controller.report.report_upstreams import coverage_note
from hedgerow.controller.store.models import Attempt, Call, Route
from hedgerow.controller.store.prices import PriceBook
from hedgerow.controller.store.rollups import (
    FOLD_ATTEMPT_COLUMNS,
    FOLD_CALL_COLUMNS,
    HOUR_S,
    Rollup,
    fold_rows,
    hour_index_sql,
    hour_of_index,
)

__all__ = [
    "CSV_CLIENT_COLUMNS",
    "MAX_CLIENTS",
    "calls_without_client",
    "client_rows",
    "csv_rows",
    "markdown_lines",
    "week_clients",
    "without_client_note",
]

#: Most clients in the table (those with the most calls).
MAX_CLIENTS = 500
#: Columns the CSV report adds for the clients: ``client`` and ``failed_calls`` (filled in the
#: ``client`` rows, which fill the route columns of the same figures too) and
#: ``calls_without_client`` (filled in the ``total`` row).
CSV_CLIENT_COLUMNS = ("client", "failed_calls", "calls_without_client")


async def _client_hours(session: AsyncSession, route_id: int, hour_start: datetime) -> dict[str, Rollup]:
    """The calls with a client of one (route, hour), folded per client (read as the rollup job
    reads an hour, on the ``(route_id, started_at)`` index)."""
    where = [
        Call.route_id == route_id,
        Call.started_at >= hour_start,
        Call.started_at < hour_start + timedelta(seconds=HOUR_S),
        Call.client.is_not(None),
    ]
    calls: list[Any] = list((await session.execute(select(Call.client, *FOLD_CALL_COLUMNS).where(*where))).all())
    client_of: dict[int, str] = {call[1]: call[0] for call in calls}  # call id -> client
    call_groups: dict[str, list[Any]] = {}
    for call in calls:
        call_groups.setdefault(call[0], []).append(call[1:])
    attempt_groups: dict[str, list[Any]] = {}
    attempts = await session.execute(
        select(*FOLD_ATTEMPT_COLUMNS)
        .join(Call, Call.id == Attempt.call_id)
        .where(*where)
        .order_by(Attempt.call_id, Attempt.attempt_index)
    )
    for attempt in attempts.all():
        attempt_groups.setdefault(client_of[attempt[0]], []).append(attempt)
    return {client: fold_rows(rows, attempt_groups.get(client, []))[0] for client, rows in call_groups.items()}


def client_rows(hours_by_client: Mapping[str, list[HourRollup]], prices: PriceBook) -> list[dict[str, Any]]:
    """The table's rows (JSON-ready), most calls first then by name, from each client's hours.

    Args:
        hours_by_client: per client, the rollups of its calls per (route, model) and hour (or
            span of hours with the same prices in force, priced at its first hour's start).
        prices: the price book.
    """
    rows = []
    for client, hours in hours_by_client.items():
        figures = section_figures(hours, prices)
        by_status = figures["calls_by_status"]
        failed = sum(by_status[status] for status in FAILED_STATUSES)
        calls = figures["calls"]
        rows.append(
            {
                "client": client,
                "calls": calls,
                "calls_by_status": by_status,
                "hedges": figures["hedges"],
                "hedge_rate": figures["hedge_rate"],
                "failovers": figures["failovers"],
                "failed_calls": failed,
                "failure_rate": failed / calls if calls else None,
                "ttft_s": {level: figures["ttft_s"][level] for level in ("p50", "p99")},
                "spend_usd": figures["cost"]["spend_usd"],
                "price_status": figures["cost"]["price_status"],
            }
        )
    rows.sort(key=lambda row: (-row["calls"], row["client"]))
    return rows


async def week_clients(session: AsyncSession, week: IsoWeek, prices: PriceBook) -> dict[str, Any]:
    """The per-client table of the calls started in ``week`` (JSON-ready; see the module docstring).

    Args:
        session: an open session.
        week: the ISO week.
        prices: the price book.

    Returns:
        ``{"rows", "truncated", "calls", "calls_without_client"}``: ``calls`` is the week's calls
        still kept raw (those the table and the count without a client cover).
    """
    hour = hour_index_sql(session.get_bind().dialect.name).label("hour")
    per_hour = (
        await session.execute(
            select(Call.route_id, hour, func.count(), func.count(Call.client))
            .where(Call.started_at >= week.since, Call.started_at < week.until)
            .group_by(Call.route_id, hour)
        )
    ).all()
    kept = sum(int(total) for _, _, total, _ in per_hour)
    with_client = sum(int(named) for _, _, _, named in per_hour)
    names = {
        rid: (route, model)
        for rid, route, model in (await session.execute(select(Route.id, Route.route, Route.model))).all()
    }
    # A client's hours of one route are merged while no price of its model changes: priced at the
    # first one's start they cost what they cost hour by hour, and memory holds one rollup per
    # (client, route, price period), not per hour.
    periods: dict[tuple[str, int, int], HourRollup] = {}
    for route_id, index, _total, named in sorted(per_hour):
        if not named:
            continue
        hour_start = hour_of_index(index)
        route, model = names[route_id]
        period = bisect_right(prices.change_times(model), hour_start)
        for client, rollup in (await _client_hours(session, route_id, hour_start)).items():
            key = (client, route_id, period)
            before = periods.get(key)
            merged = rollup if before is None else before.rollup.merged(rollup)
            periods[key] = HourRollup(route, model, hour_start if before is None else before.hour_start, merged)
    hours_by_client: dict[str, list[HourRollup]] = {}
    for (client, _route_id, _period), hours in periods.items():
        hours_by_client.setdefault(client, []).append(hours)
    rows = client_rows(hours_by_client, prices)
    return {
        "rows": rows[:MAX_CLIENTS],
        "truncated": len(rows) > MAX_CLIENTS,
        "calls": kept,
        "calls_without_client": kept - with_client,
    }


def calls_without_client(report: Mapping[str, Any]) -> int | None:
    """The week's raw calls without a client, or None in a report without the table (stored before it)."""
    table = report.get("clients")
    return None if not table else int(table["calls_without_client"])


def without_client_note(report: Mapping[str, Any]) -> str | None:
    """The sentences under the table: how many calls had no client, what the table leaves out
    (more clients than :data:`MAX_CLIENTS`, calls retention deleted); None without a table."""
    table = report.get("clients")
    if not table:
        return None
    missing = table["calls_without_client"]
    sentences = [f"{missing:,} of the week's calls carry no client and are in no row." if missing else ""]
    if table["truncated"]:
        sentences.append(f"Only the {MAX_CLIENTS} clients with the most calls are listed.")
    sentences.append(coverage_note(report, "clients", "Per-client") or "")
    return " ".join(s for s in sentences if s) or None


def markdown_lines(
    report: Mapping[str, Any],
    text: Callable[[str], str],
    seconds: Callable[[Any], str],
    pct: Callable[[Any], str],
    usd: Callable[[Any, str | None], str],
) -> list[str]:
    """The per-client table as Markdown lines (empty when the report has none or the week no call).

    Args:
        report: the JSON report.
        text: the Markdown escape of a name (``markdown_text``).
        seconds, pct, usd: the report's formats of seconds, fractions and USD (with a price status).
    """
    table = report.get("clients")
    if not table or not table["calls"]:
        return []
    lines = ["", "## Clients", ""]
    if table["rows"]:
        lines += [
            "| client | calls | hedge rate | failovers | failed | TTFT P50 | TTFT P99 | spend |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in table["rows"]:
            lines.append(
                f"| {text(row['client'])} | {row['calls']:,} | {pct(row['hedge_rate'])} | {row['failovers']:,} "
                f"| {row['failed_calls']:,} ({pct(row['failure_rate'])}) | {seconds(row['ttft_s']['p50'])} "
                f"| {seconds(row['ttft_s']['p99'])} | {usd(row['spend_usd'], row['price_status'])} |"
            )
        lines.append("")
    note = without_client_note(report)
    if note:
        lines.append(note)
    return lines


def csv_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``scope=client`` row per client for the CSV report (before its cells are escaped): the
    ``client`` column and the route columns of the same figures."""
    table = report.get("clients")
    if not table:
        return []
    out = []
    for row in table["rows"]:
        status = row["calls_by_status"]
        out.append(
            {
                "week": report["week"],
                "scope": "client",
                "partial": report["partial"],
                "client": row["client"],
                "calls": row["calls"],
                **{f"{name}_calls": count for name, count in status.items()},
                "failed_calls": row["failed_calls"],
                "ttft_p50_s": row["ttft_s"]["p50"],
                "ttft_p99_s": row["ttft_s"]["p99"],
                "hedges": row["hedges"],
                "hedge_rate": row["hedge_rate"],
                "failovers": row["failovers"],
                "spend_usd": row["spend_usd"],
                "price_status": row["price_status"],
            }
        )
    return out
