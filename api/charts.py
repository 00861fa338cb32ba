"""Time charts as geometry for inline SVG, computed on the server (no script, no chart library).

:func:`time_chart` turns a few series of ``(time, value)`` points over ``[since, until]`` into a
:class:`Chart`: SVG path data per series in a ``width`` x ``height`` box of user units, and
labelled ticks on both axes. The template ``_chart.html`` draws it. A ``step`` series holds each
value until the next point (a published threshold), a ``line`` series joins its points (and
breaks where a value is missing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = ["Chart", "Series", "SeriesData", "nice_ticks", "time_chart"]

Kind = Literal["step", "line"]


@dataclass(frozen=True)
class SeriesData:
    """One series to draw: its legend name, CSS class, kind and ``(time, value)`` points (oldest first;
    a None value is a gap)."""

    name: str
    css: str
    kind: Kind
    points: Sequence[tuple[datetime, float | None]]


@dataclass(frozen=True)
class Series:
    """One drawn series: legend name, CSS class and SVG path data (empty when nothing to draw)."""

    name: str
    css: str
    path: str


@dataclass(frozen=True)
class Chart:
    """Everything the template needs to draw one chart (user units of the SVG ``viewBox``).

    Attributes:
        width, height: the ``viewBox`` size.
        left, right, top, bottom: the plot area's edges.
        series: the drawn series.
        x_ticks, y_ticks: ``(position, label)`` pairs.
        title: the chart's accessible name.
        empty: True when no series has a point to draw.
        note: a sentence shown under the chart (e.g. why its range differs from the one asked
            for); empty for none.
    """

    width: int
    height: int
    left: float
    right: float
    top: float
    bottom: float
    title: str
    series: list[Series] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    empty: bool = True
    note: str = ""


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """Tick values ``0, s, 2s, ...`` covering ``[0, high]`` with a step ``s`` of 1, 2 or 5 × 10^k.

    Args:
        high: the largest value to cover (> 0).
        count: about how many intervals.

    Returns:
        Ascending tick values, the last one >= ``high``.
    """
    if not high > 0 or not math.isfinite(high):
        return [0.0, 1.0]
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(high / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def _time_label(since: datetime, until: datetime) -> Callable[[datetime], str]:
    span_s = (until - since).total_seconds()
    if span_s <= 2 * 86_400:
        return lambda t: t.strftime("%H:%M")
    return lambda t: t.strftime("%m-%d %H:%M")


def time_chart(
    data: Sequence[SeriesData],
    since: datetime,
    until: datetime,
    *,
    title: str,
    y_format: Callable[[float], str],
    y_floor: float = 0.0,
    width: int = 560,
    height: int = 220,
    note: str = "",
) -> Chart:
    """Lay out ``data`` over the time range ``[since, until]`` (x) and ``[0, max]`` (y).

    Args:
        data: the series (points outside the range are clipped to it; a step series' first point
            may lie before ``since`` and then starts the line at ``since``).
        since, until: the time range (aware UTC, ``since < until``).
        title: the accessible name.
        y_format: renders a y tick value (e.g. seconds or percent).
        y_floor: the y axis covers at least ``[0, y_floor]``.
        width, height: the ``viewBox`` size.
        note: a sentence to show under the chart (``Chart.note``).

    Returns:
        The chart; ``empty`` when no series has a value.

    Raises:
        ValueError: ``since`` is not before ``until``.
    """
    if not since < until:
        raise ValueError(f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
    left, right, top, bottom = 56.0, width - 12.0, 12.0, height - 28.0
    values = [v for series in data for _t, v in series.points if v is not None and math.isfinite(v)]
    ticks = nice_ticks(max([*values, y_floor, 0.0]) or 1.0)
    y_high = ticks[-1] or 1.0
    span_s = (until - since).total_seconds()

    def x_of(t: datetime) -> float:
        offset = min(max((t - since).total_seconds(), 0.0), span_s)
        return round(left + (right - left) * offset / span_s, 2)

    def y_of(v: float) -> float:
        return round(bottom - (bottom - top) * min(max(v, 0.0), y_high) / y_high, 2)

    drawn: list[Series] = []
    for series in data:
        parts: list[str] = []
        if series.kind == "step":
            last_y: float | None = None
            for t, v in series.points:
                if v is None:
                    continue
                x, y = x_of(t), y_of(v)
                parts.append(f"M{x},{y}" if last_y is None else f"H{x}V{y}")
                last_y = y
            if last_y is not None:
                parts.append(f"H{right}")
        else:
            pen_down = False
            for t, v in series.points:
                if v is None or not math.isfinite(v):
                    pen_down = False
                    continue
                parts.append(f"{'L' if pen_down else 'M'}{x_of(t)},{y_of(v)}")
                pen_down = True
        drawn.append(Series(series.name, series.css, "".join(parts)))
    label = _time_label(since, until)
    x_ticks = [(x_of(since + (until - since) * (i / 5)), label(since + (until - since) * (i / 5))) for i in range(6)]
    return Chart(
        width=width,
        height=height,
        left=left,
        right=right,
        top=top,
        bottom=bottom,
        title=title,
        series=drawn,
        x_ticks=x_ticks,
        y_ticks=[(y_of(v), y_format(v)) for v in ticks],
        empty=not any(s.path for s in drawn),
        note=note,
    )
