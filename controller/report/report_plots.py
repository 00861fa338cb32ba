"""Plots of the weekly report as inline SVG (matplotlib, Agg backend): no file, no external request.

Each function takes parts of the JSON report (:mod:`hedgerow.controller.report.report`) and returns one
``<svg>`` element as text, without the XML prolog, ready to be inlined in HTML. Text is drawn as
paths (``svg.fonttype = "path"``), so the SVG needs no font from anywhere.
"""

from __future__ import annotations

import io
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as _mdates
import matplotlib.pyplot as _plt

# matplotlib's annotations refuse datetimes on date axes (which it supports): use it untyped
mdates: Any = _mdates
plt: Any = _plt

__all__ = ["daily_latency_svg", "hedge_rate_svg", "overhead_svg", "threshold_svg"]

_STYLE: Any = {"svg.fonttype": "path", "font.size": 8, "axes.spines.top": False, "axes.spines.right": False}
_SIZE = (4.2, 2.4)
_HALF_DAY = timedelta(hours=12)


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    # a salt of its own per plot: clip-path ids stay unique when several SVGs share one page
    with plt.rc_context({"svg.hashsalt": uuid.uuid4().hex}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _days(daily: Sequence[Mapping[str, Any]]) -> list[datetime]:
    return [datetime.fromisoformat(d["date"]) for d in daily]


def _day_axis(ax: Any, first: datetime, last: datetime) -> None:
    """One labelled tick per day from ``first`` to ``last``, the x range padded by half a day.

    Set explicitly: days without data are NaN, and autoscaling on the days that have data alone
    (one point, say) gives a range of a fraction of a day with a "day" label at every tick.
    """
    ax.set_xlim(first - _HALF_DAY, last + _HALF_DAY)
    ax.xaxis.set_major_locator(mdates.DayLocator())
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%a %d"))


def _legend_below(ax: Any, columns: int) -> None:
    """The legend under the plot, off the data."""
    ax.legend(fontsize=6, ncols=columns, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14))


def _ms(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v * 1000.0 for v in values]


def daily_latency_svg(daily: Sequence[Mapping[str, Any]], title: str) -> str:
    """Daily delivered TTFT P50/P99 against the primary's KM P50/P99 (ms), as SVG.

    Args:
        daily: the ``daily`` list of a report section (one dict per UTC day).
        title: the plot's title.
    """
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=_SIZE)
        days = _days(daily)
        ax.plot(days, _ms([d["ttft_p99_s"] for d in daily]), "o-", color="#1b6ac9", label="delivered P99")
        ax.plot(days, _ms([d["primary_ttft_p99_s"] for d in daily]), "o--", color="#d1495b", label="primary P99")
        ax.plot(days, _ms([d["ttft_p50_s"] for d in daily]), "s-", color="#7fb3e6", label="delivered P50")
        ax.plot(days, _ms([d["primary_ttft_p50_s"] for d in daily]), "s--", color="#eb9aa5", label="primary P50")
        ax.set_ylabel("TTFT (ms)")
        ax.set_title(title)
        if days:
            _day_axis(ax, days[0], days[-1])
        ax.set_ylim(bottom=0)
        _legend_below(ax, 4)
        return _svg(fig)


def hedge_rate_svg(daily: Sequence[Mapping[str, Any]], budget: float | None, title: str) -> str:
    """Hedge rate per day (bars, %) against the budget (a dashed line), as SVG."""
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=_SIZE)
        days = _days(daily)
        # a day without calls has no hedge rate: no bar (NaN), not a bar of 0%
        rates = [math.nan if d["hedge_rate"] is None else d["hedge_rate"] * 100.0 for d in daily]
        ax.bar(days, rates, width=0.6, color="#2a9d8f", label="hedge rate")
        if budget is not None:
            ax.axhline(budget * 100.0, color="#e76f51", linestyle="--", label=f"budget {budget:.0%}")
        ax.set_ylabel("hedged calls (%)")
        ax.set_title(title)
        if days:
            _day_axis(ax, days[0], days[-1])
        _legend_below(ax, 2)
        return _svg(fig)


def threshold_svg(steps: Sequence[Sequence[Any]], since: str, until: str, title: str) -> str:
    """The published ``hedge_after_s`` over the week as a step chart (s), as SVG.

    Args:
        steps: ``[[iso time, seconds], ...]`` from a section's ``threshold.steps``.
        since, until: the week's bounds (ISO 8601), the x range.
        title: the plot's title.
    """
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=_SIZE)
        if steps:
            times = [_parse(t) for t, _ in steps]
            values = [v for _, v in steps]
            ax.step(times, values, where="post", color="#6a4c93")
            ax.set_ylim(bottom=0, top=max(values) * 1.2 or 1.0)
        else:
            ax.text(0.5, 0.5, "no threshold decisions", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlim(
            datetime.fromisoformat(since.replace("Z", "+00:00")), datetime.fromisoformat(until.replace("Z", "+00:00"))
        )
        ax.set_ylabel("hedge_after_s (s)")
        ax.set_title(title)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%a %d"))
        return _svg(fig)


def overhead_svg(sections: Sequence[Mapping[str, Any]]) -> str:
    """Hedging overhead spend per route (horizontal bars, USD; routes without a price shown as 0), as SVG."""
    with plt.rc_context(_STYLE):
        height = max(1.6, 0.32 * len(sections) + 0.8)
        fig, ax = plt.subplots(figsize=(5.2, height))
        labels = [f"{s['route']} · {s['model']}" for s in sections]
        values = [s["cost"]["overhead_usd"] or 0.0 for s in sections]
        bars = ax.barh(labels, values, color="#f4a261")
        for bar, section in zip(bars, sections, strict=True):
            note = "no price" if section["cost"]["price_status"] == "no price" else f"${bar.get_width():,.4f}"
            ax.annotate(note, (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=6)  # fmt: skip
        ax.invert_yaxis()
        ax.set_xlabel("hedging overhead (USD)")
        ax.set_title("overhead spend per route")
        return _svg(fig)
