"""The weekly report in its four formats: JSON, CSV, self-contained HTML and Markdown.

Every format renders the JSON report of :func:`hedgerow.controller.report.report.build_weekly_report`
(pure functions; text in, text out):

* :func:`to_json`: the report itself (schema ``hedgerow.weekly_report/1``, documented in
  :mod:`hedgerow.controller.report.report`);
* :func:`to_csv`: one row per (route, model) plus a ``total`` row, columns :data:`CSV_COLUMNS`;
  empty cells for unknown figures;
* :func:`to_html`: one HTML file with inline CSS and inline SVG plots (matplotlib, Agg; see
  :mod:`hedgerow.controller.report.report_plots`), no script, no external request: readable offline
  and by mail. Template: ``templates/weekly_report.html.j2`` (Jinja2, autoescaped);
* :func:`to_markdown`: headline figures and a table per route, for chat;
* every format but JSON also renders the per-upstream table (``report["upstreams"]``,
  :mod:`hedgerow.controller.report.report_upstreams`) and the per-client table
  (``report["clients"]``, :mod:`hedgerow.controller.report.report_clients`) when the report has
  them (a report stored before a table existed has none);
* :func:`summary_text`: the one-paragraph summary posted to a webhook.

Route and model names are stored text: each format escapes them for itself (names stored before
the name rule of :mod:`hedgerow.client.names` may hold anything but C0 controls). JSON: the
encoder's escapes. CSV: quoted by the csv module, and a text cell starting with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return gets a leading ``'`` (:func:`csv_text`, OWASP's
advice against formula injection), so a spreadsheet shows it as text instead of running it.
HTML: Jinja2 autoescaping, on for the template (``.j2``); names in the plots' titles and labels
have matplotlib's ``$`` (mathtext) escaped. Markdown: :func:`markdown_text` (control and format
characters as visible escapes, Markdown's inline punctuation backslash-escaped, so a ``|``
cannot add a table column).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from hedgerow.client.names import visible
from hedgerow.controller.report import report_clients, report_upstreams
from hedgerow.controller.report.report_clients import CSV_CLIENT_COLUMNS
from hedgerow.controller.report.report_upstreams import CSV_UPSTREAM_COLUMNS

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "MEDIA_TYPES",
    "csv_text",
    "markdown_text",
    "render",
    "summary_text",
    "to_csv",
    "to_html",
    "to_json",
    "to_markdown",
]

#: The formats and their media types.
MEDIA_TYPES = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "html": "text/html; charset=utf-8",
    "md": "text/markdown; charset=utf-8",
}
FORMATS = tuple(MEDIA_TYPES)
#: Largest number of routes drawn in the HTML (the busiest); every route is in the tables.
MAX_PLOTTED_ROUTES = 20

#: CSV columns, in order.
CSV_COLUMNS = (
    "week", "scope", "route", "model", "partial", "calls", "ok_calls", "error_calls", "timeout_calls",
    "stalled_calls", "cancelled_calls", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_p999_s",
    "primary_ttft_p50_s", "primary_ttft_p90_s", "primary_ttft_p99_s", "primary_ttft_p999_s",
    "primary_ttft_p99_low_s", "primary_ttft_p99_high_s", "p99_saved_s", "tpot_p50_s", "tpot_p90_s",
    "e2e_p50_s", "e2e_p99_s", "hedges", "hedge_rate", "budget", "hedge_denied", "backup_wins",
    "backup_win_rate", "failovers", "prompt_tokens", "completion_tokens", "extra_prompt_tokens",
    "extra_completion_tokens", "estimated_prompt_tokens", "spend_usd", "overhead_usd", "overhead_share",
    "price_status", "threshold_start_s", "threshold_end_s", "threshold_min_s", "threshold_max_s",
    "threshold_changes", "backups_rarely_win", "hedges_did_not_lower_p99", "enabled", "pinned_hedge_after_s",
    "calls_change", "ttft_p99_s_change", "overhead_usd_change",
    *CSV_UPSTREAM_COLUMNS, *CSV_CLIENT_COLUMNS,
)  # fmt: skip


def to_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON text."""
    return json.dumps(report, indent=2) + "\n"


def _primary_value(section: Mapping[str, Any], level: str, key: str = "value_s") -> Any:
    found = section["primary_ttft_s"][level]
    return None if found is None else found[key]


def _row(report: Mapping[str, Any], section: Mapping[str, Any], scope: str) -> dict[str, Any]:
    status = section["calls_by_status"]
    threshold = section["threshold"]
    tokens = section["tokens"]
    cost = section["cost"]
    return {
        "week": report["week"],
        "scope": scope,
        "route": section["route"] or "",
        "model": section["model"] or "",
        "partial": report["partial"],
        "calls": section["calls"],
        **{f"{name}_calls": status[name] for name in ("ok", "error", "timeout", "stalled", "cancelled")},
        **{f"ttft_{level}_s": section["ttft_s"][level] for level in report["levels"]},
        **{f"primary_ttft_{level}_s": _primary_value(section, level) for level in report["levels"]},
        "primary_ttft_p99_low_s": _primary_value(section, "p99", "low_s"),
        "primary_ttft_p99_high_s": _primary_value(section, "p99", "high_s"),
        "p99_saved_s": section["p99_saved_s"],
        "tpot_p50_s": section["tpot_s"]["p50"],
        "tpot_p90_s": section["tpot_s"]["p90"],
        "e2e_p50_s": section["e2e_s"]["p50"],
        "e2e_p99_s": section["e2e_s"]["p99"],
        "hedges": section["hedges"],
        "hedge_rate": section["hedge_rate"],
        "budget": section["budget"],
        "hedge_denied": section["hedge_denied"],
        "backup_wins": section["backup_wins"],
        "backup_win_rate": section["backup_win_rate"],
        "failovers": section["failovers"],
        "prompt_tokens": tokens["prompt"],
        "completion_tokens": tokens["completion"],
        "extra_prompt_tokens": tokens["extra_prompt"],
        "extra_completion_tokens": tokens["extra_completion"],
        "estimated_prompt_tokens": tokens["estimated_prompt"],
        "spend_usd": cost["spend_usd"],
        "overhead_usd": cost["overhead_usd"],
        "overhead_share": cost["overhead_share"],
        "price_status": cost["price_status"],
        "threshold_start_s": threshold.get("start_s"),
        "threshold_end_s": threshold.get("end_s"),
        "threshold_min_s": threshold.get("min_s"),
        "threshold_max_s": threshold.get("max_s"),
        "threshold_changes": threshold["applied_changes"],
        **section["flags"],
        "enabled": section["enabled"],
        "pinned_hedge_after_s": section["pinned_hedge_after_s"],
        "calls_change": section["change"]["calls"]["delta"],
        "ttft_p99_s_change": section["change"]["ttft_p99_s"]["delta"],
        "overhead_usd_change": section["change"]["overhead_usd"]["delta"],
    }


def to_csv(report: Mapping[str, Any]) -> str:
    """One row per (route, model), a ``total`` row, one ``upstream`` row per upstream, then one
    ``client`` row per client (``scope`` column), columns :data:`CSV_COLUMNS` (the upstream rows
    fill the ``upstream`` columns, the client rows ``client`` and the route columns of the same
    figures, the route rows the others; the total row also ``calls_without_client``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for section in report["routes"]:
        writer.writerow(_cells(_row(report, section, "route")))
    total = _row(report, report["total"], "total")
    total["calls_without_client"] = report_clients.calls_without_client(report)
    writer.writerow(_cells(total))
    for row in [*report_upstreams.csv_rows(report), *report_clients.csv_rows(report)]:
        writer.writerow(_cells(row))
    return buffer.getvalue()


#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text: str) -> str:
    """A text cell of the CSV report, safe to open in a spreadsheet.

    A cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading
    ``'`` (OWASP's advice against CSV/formula injection), so ``=HYPERLINK(...)`` is shown as text
    instead of being run; quoting (commas, quotes, newlines) is the csv module's. Only text cells
    go through it: numbers (a negative change, ``-0.5``) are written as they are.

    Args:
        text: the cell's text.

    Returns:
        The text, with ``'`` in front when it starts with one of those characters.
    """
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def _cells(row: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in row.items():
        if value is None:
            out[key] = ""
        elif isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, float):
            out[key] = f"{value:.6g}"
        elif isinstance(value, str):
            out[key] = csv_text(value)
        else:
            out[key] = str(value)
    return out


#: Characters backslash-escaped in a Markdown cell: CommonMark's inline punctuation (code,
#: emphasis, links, raw HTML, entities, strikethrough) and the table's ``|``.
_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|~&!#")


def markdown_text(text: str) -> str:
    """Stored text (a route or model name) as literal text in a Markdown table cell or line.

    Control, format and separator characters become visible escapes first
    (:func:`hedgerow.client.names.visible`: a newline cannot end the row), then every character
    of :data:`_MARKDOWN_SPECIAL` is backslash-escaped (CommonMark shows ``\\|`` as ``|``), so a
    name cannot add a column, open code, emphasis, a link or raw HTML.

    Args:
        text: the text to show.

    Returns:
        The escaped text.
    """
    return "".join("\\" + char if char in _MARKDOWN_SPECIAL else char for char in visible(text))


def _s(value: Any) -> str:
    """Seconds as ms or s for people; an en dash when unknown.

    Below 10 ms two significant digits (a 0.5 ms TPOT printed as "0 ms"), and a value that
    rounds to 1000 ms is written in seconds (0.9996 s printed as "1000 ms").
    """
    if value is None:
        return "–"
    size = abs(value)
    if size == 0:
        return "0 ms"
    if size < 0.01:
        return f"{value * 1000:.2g} ms"
    return f"{value * 1000:.0f} ms" if size < 0.9995 else f"{value:.2f} s"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{value:.1%}"


def _usd(value: Any, status: str | None = None) -> str:
    if status in ("no price", "no calls"):
        return str(status)
    if value is None:
        return "–"
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:,.4f}"


def _delta(value: Any, kind: str) -> str:
    if value is None:
        return ""
    sign = "+" if value > 0 else ("−" if value < 0 else "±")
    magnitude = abs(value)
    text = {"s": _s(magnitude), "pct": f"{magnitude * 100:.1f} pt", "usd": _usd(magnitude), "n": f"{magnitude:,.0f}"}[
        kind
    ]
    return f"{sign}{text}"


def _primary_text(section: Mapping[str, Any], level: str) -> str:
    found = section["primary_ttft_s"][level]
    if found is None:
        return "–"
    if found["value_s"] is None:
        return f"> {_s(found['low_s'])} (censored)"
    return _s(found["value_s"])


def _flags(section: Mapping[str, Any]) -> str:
    raised = [name for name, count in section["flags"].items() if count]
    return ", ".join(raised) or "none"


#: The template's filters; ``shown`` is :func:`hedgerow.client.names.visible` (a name's control and
#: format characters as escapes; autoescaping then makes it HTML text).
_FILTERS = {
    "s": _s,
    "pct": _pct,
    "usd": _usd,
    "delta": _delta,
    "primary": _primary_text,
    "flags": _flags,
    "shown": visible,
    "upstream_q": lambda entry: report_upstreams.quantile_text(entry, _s),
    "loser_prompt": report_upstreams.loser_prompt_text,
}


def summary_text(report: Mapping[str, Any]) -> str:
    """The report's headline figures in one paragraph (what a webhook posts as Slack ``text``)."""
    t = report["total"]
    cost = t["cost"]
    partial = " (partial week)" if report["partial"] else ""
    if t["calls"] == 0:  # nothing measured: no rate, latency or spend to state, not even 0
        return (
            f"hedgerow weekly report {report['week']}{partial}: no calls were recorded in this week "
            f"({_days_of(report)}, UTC), so there is no latency, hedge rate or spend to report{_decided(report)}."
        )
    backups = t["hedges"] + t["failovers"]
    return (
        f"hedgerow weekly report {report['week']}{partial}: {t['calls']:,} calls on {len(report['routes'])} route(s); "
        f"TTFT P99 {_s(t['ttft_s']['p99'])} delivered vs {_primary_text(t, 'p99')} primary "
        f"({_saved_text(t['p99_saved_s'], backups)}); hedge rate {_pct(t['hedge_rate'])} (budget {_pct(t['budget'])}), "
        f"backups won {_pct(t['backup_win_rate'])}, {t['failovers']} failover(s); "
        f"spend {_usd(cost['spend_usd'], cost['price_status'])}, hedging overhead "
        f"{_usd(cost['overhead_usd'], cost['price_status'])} ({_pct(cost['overhead_share'])})."
    )


#: A P99 saving smaller than this, seconds (one microsecond, below any TTFT's resolution), is none.
_NO_SAVING_S = 1e-6


def _saved_text(saved_s: float | None, backups: int) -> str:
    """What hedging saved at P99 in words: ``saved 120 ms``, or why there is no saving to state.

    Args:
        saved_s: ``p99_saved_s``, the primaries' P99 minus the delivered P99, seconds (None when
            either is unknown).
        backups: backup attempts started in the period (hedges plus failovers).

    Returns:
        ``saved X``; for zero (under :data:`_NO_SAVING_S`) ``no P99 saving: no backups ran`` when
        ``backups`` is 0, else ``no P99 saving: the backups did not beat the primaries' own
        tail``; for a negative value ``no P99 saving: delivered X above the primaries' own P99``;
        for None ``P99 saving unknown``.
    """
    if saved_s is None:
        return "P99 saving unknown"
    if saved_s >= _NO_SAVING_S:
        return f"saved {_s(saved_s)}"
    if saved_s > -_NO_SAVING_S:
        if backups == 0:
            return "no P99 saving: no backups ran"
        return "no P99 saving: the backups did not beat the primaries' own tail"
    return f"no P99 saving: delivered {_s(-saved_s)} above the primaries' own P99"


def _days_of(report: Mapping[str, Any]) -> str:
    """``Mon 2026-09-28 to Sun 2026-10-04``: the report's week as its first and last day."""
    first = date.fromisoformat(report["since"][:10])
    return f"Mon {first.isoformat()} to Sun {(first + timedelta(days=6)).isoformat()}"


def _decided(report: Mapping[str, Any]) -> str:
    """``; 2 route(s) had threshold decisions``-style clause for a week without calls, or ''."""
    routes = len(report["routes"])
    return f"; {routes} route(s) had threshold decisions" if routes else ""


def to_markdown(report: Mapping[str, Any]) -> str:
    """Headline figures, the routes that moved most and one table row per route, as Markdown."""
    lines = [f"# hedgerow weekly report {report['week']}" + (" (partial)" if report["partial"] else ""), ""]
    lines += [summary_text(report), ""]
    if report["total"]["calls"] == 0 and not report["routes"]:
        return "\n".join(lines[:-1]) + "\n"
    lines += [
        "| route | model | calls | TTFT P99 | primary P99 | hedge rate | budget | backup wins | failovers "
        "| spend | overhead | share | threshold | flags |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for s in [*report["routes"], report["total"]]:
        cost = s["cost"]
        th = s["threshold"]
        threshold = "" if "start_s" not in th else f"{_s(th['start_s'])} → {_s(th['end_s'])} ({th['applied_changes']})"
        route = markdown_text(s["route"]) if s["route"] else "**total**"
        lines.append(
            f"| {route} | {markdown_text(s['model'] or '')} | {s['calls']:,} | {_s(s['ttft_s']['p99'])} "
            f"| {_primary_text(s, 'p99')} | {_pct(s['hedge_rate'])} | {_pct(s['budget'])} "
            f"| {_pct(s['backup_win_rate'])} | {s['failovers']} | {_usd(cost['spend_usd'], cost['price_status'])} "
            f"| {_usd(cost['overhead_usd'], cost['price_status'])} | {_pct(cost['overhead_share'])} "
            f"| {threshold} | {_flags(s)} |"
        )
    for key, title, kind in (("p99", "TTFT P99", "s"), ("overhead", "overhead", "usd")):
        moved = report["moved_most"][key]
        if moved:
            lines += ["", f"Moved most ({title}): " + "; ".join(
                f"{markdown_text(m['route'])}/{markdown_text(m['model'])} {_delta(m['delta'], kind)}"
                for m in moved)]  # fmt: skip
    lines += report_upstreams.markdown_lines(report, markdown_text, _s, _pct)
    lines += report_clients.markdown_lines(report, markdown_text, _s, _pct, _usd)
    return "\n".join(lines) + "\n"


_ENV = Environment(
    loader=PackageLoader("hedgerow.controller.report", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(_FILTERS)


def to_html(report: Mapping[str, Any]) -> str:
    """A self-contained HTML page of the report: inline CSS and inline SVG plots, no request out."""
    from hedgerow.controller.report import report_plots  # matplotlib: imported when a page is drawn, not at start

    # a route with decisions but no call this week has nothing to plot (its bars would be 0s)
    with_calls = [s for s in report["routes"] if s["calls"]]
    plotted = sorted(with_calls, key=lambda s: -s["calls"])[:MAX_PLOTTED_ROUTES]
    plots = []
    for s in plotted:
        # in a plot the name is plain text (:func:`_plot_text`); in the page, Jinja escapes it
        title = f"{_plot_text(s['route'])} · {_plot_text(s['model'])}"
        plots.append(
            {
                "name": f"{visible(s['route'])} · {visible(s['model'])}",
                "latency": report_plots.daily_latency_svg(s["daily"], f"{title}: TTFT per day"),
                "hedge_rate": report_plots.hedge_rate_svg(s["daily"], s["budget"], f"{title}: hedge rate per day"),
                "threshold": report_plots.threshold_svg(
                    s["threshold"]["steps"], report["since"], report["until"], f"{title}: hedge_after_s"
                ),
            }
        )
    with_calls = [{**s, "route": _plot_text(s["route"]), "model": _plot_text(s["model"])} for s in with_calls]
    overhead = report_plots.overhead_svg(with_calls) if with_calls else None
    template = _ENV.get_template("weekly_report.html.j2")
    return template.render(
        report=report,
        summary=summary_text(report),
        plots=plots,
        overhead=overhead,
        omitted=len(with_calls) - len(plotted),
        days=_days_of(report),
        upstream_note=report_upstreams.coverage_note(report),
        client_note=report_clients.without_client_note(report),
    )


def _plot_text(text: str | None) -> str:
    """A name as literal text for a matplotlib title or label: control characters as escapes,
    ``$`` escaped (a ``$`` starts matplotlib's mathtext, where a name such as ``a$\\x$`` failed
    the whole page)."""
    return visible(text or "").replace("$", "\\$")


def render(report: Mapping[str, Any], fmt: str) -> str:
    """The report in format ``fmt`` (one of :data:`FORMATS`).

    Raises:
        ValueError: an unknown format (named, with the known ones).
    """
    renderers = {"json": to_json, "csv": to_csv, "html": to_html, "md": to_markdown}
    if fmt not in renderers:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    return renderers[fmt](report)
