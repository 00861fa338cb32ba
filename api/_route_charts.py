"""The charts of a route's console page: the threshold with the primary's and each upstream's P90,
and the hedge rate against the budget.

Behind :mod:`hedgerow.api.pages` (the route page): ``chart_start`` fits a new route's range to its
data, ``upstream_line_series`` draws :func:`~hedgerow.controller.store.upstream_series.upstream_ttft_series`
as lines, and ``route_charts`` builds both SVG charts (:mod:`hedgerow.api.charts`), their dots
linking to the calls behind them (:func:`~hedgerow.api.calls_pages.calls_links`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hedgerow.api.calls_pages import calls_links, calls_url
from hedgerow.api.charts import PointLink, SeriesData, seconds_label, time_chart
from hedgerow.controller.store.upstream_series import SERIES_MIN_FIRST_TOKENS, SERIES_MIN_SAMPLES, SERIES_UPSTREAMS

__all__ = [
    "MIN_FITTED_SPAN_S",
    "UPSTREAM_CLASSES",
    "chart_start",
    "route_charts",
    "row_time",
    "upstream_line_series",
]

#: The shortest time a route's charts show when fitted to a new route's data, seconds.
MIN_FITTED_SPAN_S = 600.0


def row_time(row: dict[str, Any], key: str) -> datetime:
    """A time of a history row (ISO 8601 text) as an aware datetime."""
    return datetime.fromisoformat(row[key].replace("Z", "+00:00"))


def chart_start(series: list[dict[str, Any]], since: datetime, now: datetime, range_key: str) -> tuple[datetime, str]:
    """Where a route's charts start, and the note that says why when it is not ``since``.

    A route whose first decision falls inside the range (a new route) would have its data
    squeezed against the right edge; its charts start shortly before that decision instead
    (10% of its age earlier, and at least :data:`MIN_FITTED_SPAN_S` before ``now``).

    Args:
        series: the route's history rows for the charts, oldest first; the first one is the row
            in force at ``since`` when there is one (see ``history_series``).
        since, now: the range asked for (aware UTC).
        range_key: the range's name (``24h``), for the note.

    Returns:
        ``(start, note)``: ``since`` and an empty note, or the fitted start and a sentence.
    """
    if not series:
        return since, ""
    first = row_time(series[0], "computed_at")
    if first <= since:
        return since, ""
    span_s = max((now - first).total_seconds() * 1.1, MIN_FITTED_SPAN_S)
    start = now - timedelta(seconds=span_s)
    if start <= since:
        return since, ""
    return (
        start,
        f"Fitted to the route's data: its first decision was at {first:%Y-%m-%d %H:%M} UTC, "
        f"within the {range_key} range.",
    )


#: CSS classes of the per-upstream lines, busiest first (colour and dash pattern each).
UPSTREAM_CLASSES = tuple(f"s-up s-up{i}" for i in range(1, SERIES_UPSTREAMS + 1))


def _slot_label(width_s: int) -> str:
    """A slot width in words: ``20 s``, ``15 min``, ``1 h``, ``1 day``."""
    if width_s >= 86_400:
        return f"{width_s // 86_400:g} day"
    if width_s >= 3600:
        return f"{width_s / 3600:g} h"
    if width_s >= 60:
        return f"{width_s / 60:g} min"
    return f"{width_s} s"


def upstream_line_series(found: dict[str, Any] | None) -> tuple[list[SeriesData], str]:
    """The latency chart's per-upstream P90 lines (:func:`upstream_ttft_series`) and the sentence
    saying how they are drawn (empty when there is no line).

    Each slot's P90 is drawn at the middle of the slot's part of the range; a slot without traffic
    breaks the line, a slot without a point (too few samples) too; a lower bound is an open
    triangle, not joined to the line.
    """
    if not found or not found["upstreams"]:
        return [], ""
    data: list[SeriesData] = []
    for css, upstream in zip(UPSTREAM_CLASSES, found["upstreams"], strict=False):
        points: list[tuple[datetime, float | None]] = []
        bounds: list[tuple[datetime, float]] = []
        previous_end: datetime | None = None
        for point in upstream["points"]:
            middle = point["start"] + (point["end"] - point["start"]) / 2
            if previous_end is not None and point["start"] != previous_end:
                points.append((previous_end, None))  # a slot without traffic: a gap
            previous_end = point["end"]
            p90 = point["p90"]
            points.append((middle, None if p90 is None else p90["value_s"]))
            if p90 is not None and p90["value_s"] is None:
                bounds.append((middle, p90["low_s"]))
        if bounds or any(value is not None for _when, value in points):  # else nothing to draw or key
            data.append(SeriesData(f"{upstream['upstream']} P90", css, "line", points, bounds))
    slot = _slot_label(found["slot_s"])
    if not data:
        return [], f"Per-upstream lines: no upstream had {SERIES_MIN_SAMPLES} TTFT samples in one {slot} slot."
    drawn, listed = len(data), min(len(found["upstreams"]), len(UPSTREAM_CLASSES))
    which = (
        f"the {listed} busiest upstreams (others not drawn)"
        if found["truncated"]
        else ("its one upstream" if listed == 1 else f"each of its {listed} upstreams")
    )
    sparse = f" ({listed - drawn} with too few samples in every slot)" if drawn < listed else ""
    sentence = (
        f"Per-upstream lines: the P90 TTFT of {which}{sparse}, per {slot}, Kaplan-Meier with attempts "
        f"cancelled before a first token counted as censored; no point for a slot with fewer than "
        f"{SERIES_MIN_SAMPLES} samples or {SERIES_MIN_FIRST_TOKENS} first tokens; an open triangle "
        f"where so many attempts were cancelled that the P90 is only known to be at least that."
    )
    return data, sentence


def failure_chart(route: dict[str, Any], failures: dict[str, Any], since: datetime, until: datetime, note: str) -> Any:
    """The failed-call rate per time slot (:func:`~hedgerow.controller.store.call_failures.failure_series`),
    each slot with a failure a point linking to its failed calls (``outcome=failed`` over the slot)."""
    rate: list[tuple[datetime, float | None]] = []
    links: list[PointLink] = []
    previous_end: datetime | None = None
    for point in failures["points"]:
        middle = point["start"] + (point["end"] - point["start"]) / 2
        if previous_end is not None and point["start"] != previous_end:
            rate.append((previous_end, None))  # a slot without calls: a gap
        previous_end = point["end"]
        rate.append((middle, point["rate"]))
        if point["failed"]:
            href = calls_url(route["route"], route["model"], outcome="failed", since=point["start"], until=point["end"])
            label = (
                f"{point['failed']} of {point['calls']} calls failed ({point['rate'] * 100:.3g}%) from"
                f" {point['start']:%Y-%m-%d %H:%M} UTC: the failed calls"
            )
            links.append(PointLink(middle, point["rate"], href, label, "s-failed"))
    slot = _slot_label(failures["slot_s"])
    return time_chart(
        [SeriesData(f"failed calls (per {slot})", "s-failed", "line", rate)],
        since,
        until,
        title=f"Failed calls: the share of calls that failed entirely, per {slot}",
        y_format=lambda v: f"{v * 100:g}%",
        y_floor=0.01,
        height=160,
        note=note,
        links=links,
    )


def route_charts(
    series: list[dict[str, Any]],
    route: dict[str, Any],
    since: datetime,
    until: datetime,
    note: str = "",
    upstream_lines: dict[str, Any] | None = None,
    failures: dict[str, Any] | None = None,
    min_link_window_s: float = 300.0,
) -> list[Any]:
    """The threshold chart (with the per-upstream P90 lines of ``upstream_lines``, from
    :func:`upstream_ttft_series`), the hedge-rate chart and, with ``failures``
    (:func:`~hedgerow.controller.store.call_failures.failure_series`), the failed-call chart of a
    route's page over ``[since, until]``, each with ``note`` under it. A point of the first two
    links to the calls started since the point before, at least ``min_link_window_s`` (the short
    window) before it, at most the row's window (:func:`~hedgerow.api.calls_pages.calls_links`)."""
    lines, key_note = upstream_line_series(upstream_lines)
    threshold = [(row_time(row, "computed_at"), row["hedge_after_s"]) for row in series]
    if not threshold and route["threshold"] is not None:  # published before the range, nothing since
        threshold = [(since, route["threshold"]["hedge_after_s"])]
    measured = [row for row in series if row["actor"] is None]
    p90 = [(row_time(row, "last_at"), row["p90_s"]) for row in measured]
    p99 = [(row_time(row, "last_at"), row["p99_s"]) for row in measured]
    rate = [(row_time(row, "last_at"), row["observed_hedge_rate"]) for row in measured]
    budget = [(row_time(row, "computed_at"), row["budget"]) for row in series] or [(since, route["budget"])]
    p99_links, rate_links = calls_links(route["route"], route["model"], measured, min_link_window_s)
    charts = [
        time_chart(
            [
                SeriesData("hedge_after_s (published)", "s-threshold", "step", threshold),
                SeriesData("primary P90", "s-p90", "line", p90),
                SeriesData("primary P99", "s-p99", "line", p99),
                *lines,
            ],
            since,
            until,
            title="Published threshold and the primary's P90/P99 TTFT"
            + (", with each upstream's P90" if lines else "")
            + " (log scale)",
            y_format=seconds_label,
            y_scale="log",  # the 30 s cold start would flatten the 0.1-1 s working range
            note=note,
            links=p99_links,
            key_note=key_note,
        ),
        time_chart(
            [
                SeriesData("within budget", "s-budget-band", "band", budget),
                SeriesData("hedge rate (window)", "s-rate", "line", rate),
                SeriesData("budget", "s-budget", "step", budget),
            ],
            since,
            until,
            title="Observed hedge rate against the budget",
            y_format=lambda v: f"{v * 100:g}%",
            y_floor=route["budget"] * 1.25,
            note=note,
            links=rate_links,
        ),
    ]
    if failures is not None:
        charts.append(failure_chart(route, failures, since, until, note))
    return charts
