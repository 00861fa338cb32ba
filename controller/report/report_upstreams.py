"""The weekly report's per-upstream table: its data (read from the raw attempts) and its rows in
Markdown and CSV (the HTML template renders the same JSON).

``report["upstreams"]`` (added by :func:`~hedgerow.controller.report.report_store.weekly_report`)
is ``{"rows": [row...], "truncated", "hedges", "attempts", "covered_from"}``: a row per upstream
of the week's calls, most attempts first, as :func:`hedgerow.controller.store.upstreams.upstream_stats`
defines it (attempts, Kaplan-Meier TTFT P50/P90/P99 with censored attempts, error/timeout/stall
rates, win rate in races, hedges caused, the prompt and output tokens spent by its losing attempts).
A report stored before the prompt tokens were counted has no ``loser_prompt_tokens``: its formats
show an en dash (CSV an empty cell) there. The figures are read
from the raw attempts, not the hourly rollups, so they cover only calls retention has kept
(``HEDGEROW_RETENTION_S``, 14 days by default: a past week is covered until then); ``calls``
counts the week's raw calls kept, and every format says so when the rollups count more
(:func:`coverage_note`).

Names are escaped per format as the routes are (:mod:`hedgerow.controller.report.report_render`):
Markdown by ``markdown_text``, CSV by ``csv_text``, HTML by autoescaping after ``visible``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.records import format_timestamp
from hedgerow.controller.report.report import IsoWeek
from hedgerow.controller.store.models import Call
from hedgerow.controller.store.upstreams import upstream_stats

__all__ = [
    "CSV_UPSTREAM_COLUMNS",
    "coverage_note",
    "csv_rows",
    "loser_prompt_text",
    "markdown_lines",
    "quantile_text",
    "week_upstreams",
]

#: Columns the CSV report adds for its ``upstream`` rows (empty in the route and total rows).
CSV_UPSTREAM_COLUMNS = (
    "upstream", "attempts", "primary_attempts", "upstream_ttft_p50_s", "upstream_ttft_p90_s",
    "upstream_ttft_p99_s", "ttft_samples", "ttft_censored", "error_rate", "timeout_rate", "stall_rate",
    "raced", "race_wins", "race_win_rate", "hedges_caused", "hedge_share", "failovers_caused",
    "loser_completion_tokens", "loser_prompt_tokens",
)  # fmt: skip


async def week_upstreams(session: AsyncSession, week: IsoWeek) -> dict[str, Any]:
    """The per-upstream table of the calls started in ``week`` (JSON-ready).

    Args:
        session: an open session.
        week: the ISO week.

    Returns:
        ``{"calls", "rows", "truncated", "hedges", "attempts", "covered_from"}``: the week's calls
        still kept raw (those the table covers), the rows, and ``covered_from`` (the oldest raw call
        kept, an ISO ``Z`` time, or None).
    """
    table = await upstream_stats(session, since=week.since, until=week.until)
    covered = table["covered_from"]
    kept = await session.scalar(
        select(func.count()).select_from(Call).where(Call.started_at >= week.since, Call.started_at < week.until)
    )
    return {
        "calls": int(kept or 0),
        "rows": table["upstreams"],
        "truncated": table["truncated"],
        "hedges": table["hedges"],
        "attempts": table["attempts"],
        "covered_from": None if covered is None else format_timestamp(covered),
    }


def quantile_text(entry: Mapping[str, Any] | None, seconds: Callable[[Any], str]) -> str:
    """A TTFT quantile for people: ``seconds(value)``, ``> x (censored)`` when only bounded below,
    an en dash without samples (the report's wording for the primary's censored quantiles)."""
    if entry is None:
        return "–"
    if entry["value_s"] is None:
        return f"> {seconds(entry['low_s'])} (censored)"
    return seconds(entry["value_s"])


def loser_prompt_text(row: Mapping[str, Any]) -> str:
    """An upstream row's ``loser_prompt_tokens`` for people (``12,400``), an en dash in a report
    stored before they were counted."""
    value = row.get("loser_prompt_tokens")
    return "–" if value is None else f"{value:,}"


def coverage_note(report: Mapping[str, Any], key: str = "upstreams", what: str = "Per-upstream") -> str | None:
    """The sentence saying a table read from raw calls misses those retention deleted, or None.

    The route figures come from the hourly rollups, which outlive the raw rows; the per-upstream
    and per-client tables read the raw calls. When the week's rollups count more calls than raw
    rows remain, some were deleted (``HEDGEROW_RETENTION_S``), and the note says how many the
    table covers.

    Args:
        report: the JSON report.
        key: the table's key in the report (its ``calls`` counts the raw calls it covers).
        what: how the sentence names the table's figures (``Per-upstream``, ``Per-client``).
    """
    table = report.get(key) or {}
    kept = table.get("calls")
    total = report["total"]["calls"]
    if kept is None or kept >= total:
        return None
    return (
        f"{what} figures are read from raw calls: {kept:,} of the week's {total:,} calls are still kept "
        f"(raw calls are deleted after HEDGEROW_RETENTION_S), so the others are not in them."
    )


def markdown_lines(
    report: Mapping[str, Any], text: Callable[[str], str], seconds: Callable[[Any], str], pct: Callable[[Any], str]
) -> list[str]:
    """The per-upstream table as Markdown lines (empty when the report has none).

    Args:
        report: the JSON report.
        text: the Markdown escape of a name (``markdown_text``).
        seconds, pct: the report's formats of seconds and fractions.
    """
    table = report.get("upstreams")
    if not table or not table["rows"]:
        return []
    lines = [
        "",
        "## Upstreams",
        "",
        "| upstream | attempts | TTFT P50 | TTFT P90 | TTFT P99 | errors | timeouts | stalls | win rate "
        "| hedges caused | loser prompt tokens | loser output tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in table["rows"]:
        q = row["ttft_s"]
        lines.append(
            f"| {text(row['upstream'])} | {row['attempts']:,} | {quantile_text(q['p50'], seconds)} "
            f"| {quantile_text(q['p90'], seconds)} | {quantile_text(q['p99'], seconds)} | {pct(row['error_rate'])} "
            f"| {pct(row['timeout_rate'])} | {pct(row['stall_rate'])} | {pct(row['win_rate'])} "
            f"| {row['hedges_caused']:,} | {loser_prompt_text(row)} | {row['loser_completion_tokens']:,} |"
        )
    note = coverage_note(report)
    if note:
        lines += ["", note]
    return lines


def _value_s(entry: Mapping[str, Any] | None) -> float | None:
    return None if entry is None else entry["value_s"]


def csv_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``scope=upstream`` row per upstream for the CSV report (before its cells are escaped)."""
    table = report.get("upstreams")
    if not table:
        return []
    out = []
    for row in table["rows"]:
        q = row["ttft_s"]
        out.append(
            {
                "week": report["week"],
                "scope": "upstream",
                "partial": report["partial"],
                "upstream": row["upstream"],
                "attempts": row["attempts"],
                "primary_attempts": row["primary_attempts"],
                "upstream_ttft_p50_s": _value_s(q["p50"]),
                "upstream_ttft_p90_s": _value_s(q["p90"]),
                "upstream_ttft_p99_s": _value_s(q["p99"]),
                "ttft_samples": row["ttft_samples"],
                "ttft_censored": row["ttft_censored"],
                "error_rate": row["error_rate"],
                "timeout_rate": row["timeout_rate"],
                "stall_rate": row["stall_rate"],
                "raced": row["raced"],
                "race_wins": row["wins"],
                "race_win_rate": row["win_rate"],
                "hedges_caused": row["hedges_caused"],
                "hedge_share": row["hedge_share"],
                "failovers_caused": row["failovers_caused"],
                "loser_completion_tokens": row["loser_completion_tokens"],
                "loser_prompt_tokens": row.get("loser_prompt_tokens"),
            }
        )
    return out
