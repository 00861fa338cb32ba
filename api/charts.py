"""Time charts as geometry for inline SVG, computed on the server (no script, no chart library).

:func:`time_chart` turns a few series of ``(time, value)`` points over ``[since, until]`` into a
:class:`Chart`: SVG path data per series in a ``width`` x ``height`` box of user units, and
labelled ticks on both axes. The template ``chart.html`` draws it. A ``step`` series holds each
value until the next point (a published threshold), a ``line`` series joins its points (and
breaks where a value is missing; a point alone between gaps is a zero-length segment, drawn as a
dot by a round line cap) and may carry lower bounds, drawn as open triangles; a ``band`` series
is a step series filled down to the axis (the hedge budget: the share of calls allowed to hedge).

A chart may carry *point links* (:class:`PointLink`): a dot at a measured point that links to
the calls behind it (the console's calls explorer). At most ``max_links`` are drawn: when a
series has more points, the x axis is cut into that many slots and each slot keeps its highest
point, so a spike always keeps its link.

The y axis (:class:`ValueAxis`) is linear from 0 (hedge rates) or logarithmic (TTFT and
thresholds, ``y_scale="log"``): a route's first threshold is its 30 s cold-start maximum and its
working range is 0.1-1 s, so on a linear axis the working range lies flat on the axis (0.12 s and
0.9 s 2.6% of the plot height apart); on the log axis, with ticks at 1-2-5 steps labelled in ms
below 1 s, the same two values are 32% of it apart (``tests/api/test_charts.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = [
    "Chart",
    "DrawnLink",
    "PointLink",
    "Series",
    "SeriesData",
    "ValueAxis",
    "bound_triangle",
    "log_ticks",
    "nice_ticks",
    "seconds_label",
    "time_chart",
]

Kind = Literal["step", "line", "band"]
Scale = Literal["linear", "log"]


@dataclass(frozen=True)
class SeriesData:
    """One series to draw: its legend name, CSS class, kind and ``(time, value)`` points (oldest first;
    a None value is a gap), and ``bounds``: ``(time, value)`` where the value is only known to be at
    least that (drawn as an open upward triangle, not joined to the line)."""

    name: str
    css: str
    kind: Kind
    points: Sequence[tuple[datetime, float | None]]
    bounds: Sequence[tuple[datetime, float]] = ()


@dataclass(frozen=True)
class Series:
    """One drawn series: legend name, CSS class, SVG path data (empty when nothing to draw), kind
    (``band`` is a filled area, the others are lines) and ``bounds_path``: the triangles of its
    lower bounds (empty for none)."""

    name: str
    css: str
    path: str
    kind: Kind = "line"
    bounds_path: str = ""


@dataclass(frozen=True)
class PointLink:
    """A point of a series that links somewhere: ``(time, value)``, the URL, a label (the link's
    accessible name and tooltip) and the CSS class of its series (its colour)."""

    time: datetime
    value: float
    href: str
    label: str
    css: str


@dataclass(frozen=True)
class DrawnLink:
    """A :class:`PointLink` placed on the chart: ``x``, ``y`` in user units."""

    x: float
    y: float
    href: str
    label: str
    css: str


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
        links: the point links drawn (at most ``max_links`` of :func:`time_chart`).
        key_note: a sentence about the legend (e.g. how per-upstream lines are drawn); empty for
            none.
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
    links: list[DrawnLink] = field(default_factory=list)
    key_note: str = ""


#: Half the width and the height of a lower-bound triangle, user units.
BOUND_HALF_WIDTH = 4.5
BOUND_HEIGHT = 7.0


def bound_triangle(x: float, y: float) -> str:
    """SVG path data of a lower-bound marker: an upward triangle whose apex is at ``(x, y)``
    ("at least this high"), :data:`BOUND_HEIGHT` tall."""
    return f"M{x},{y}l{BOUND_HALF_WIDTH},{BOUND_HEIGHT}h{-2 * BOUND_HALF_WIDTH}Z"


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


def log_ticks(low: float, high: float, max_ticks: int = 9) -> list[float]:
    """Tick values at 1-2-5 steps (0.1, 0.2, 0.5, 1, 2, ...) covering ``[low, high]`` on a log axis.

    The first tick is the largest 1-2-5 value <= ``low``, the last the smallest >= ``high``. When
    that gives more than ``max_ticks`` ticks only the powers of ten are kept (with the two ends).

    Args:
        low, high: the smallest and largest values to cover (``0 < low <= high``, finite).
        max_ticks: the most ticks before thinning to powers of ten.

    Returns:
        Ascending tick values, at least two.

    Raises:
        ValueError: ``low`` or ``high`` is not finite and > 0, or ``low > high``.
    """
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise ValueError(f"log_ticks: need finite 0 < low <= high, got low={low!r}, high={high!r}")
    ticks: list[float] = []
    for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        ticks.extend(round(m * 10.0**k, 12) for m in (1, 2, 5))
    start = max(i for i, t in enumerate(ticks) if t <= low * (1 + 1e-9))
    end = min(i for i, t in enumerate(ticks) if t >= high * (1 - 1e-9))
    chosen = ticks[start : max(end, start + 1) + 1]
    if len(chosen) > max_ticks:
        chosen = [chosen[0], *(t for t in chosen[1:-1] if math.log10(t).is_integer()), chosen[-1]]
    return chosen


def seconds_label(value_s: float) -> str:
    """A duration tick label: ``200 ms`` below one second, ``2 s`` from it (``0 s`` for 0)."""
    if value_s == 0:
        return "0 s"
    if abs(value_s) < 1:
        return f"{value_s * 1000:.4g} ms"
    return f"{value_s:.4g} s"


@dataclass(frozen=True)
class ValueAxis:
    """The y axis of a chart: which values it covers, where a value is drawn, and its ticks.

    Attributes:
        scale: ``linear`` (from 0 up to a 1-2-5 step above the largest value) or ``log`` (from
            the 1-2-5 value at or below the smallest positive value to the one at or above the
            largest).
        top, bottom: the plot area's edges in user units (``top < bottom``; SVG y grows down).
        ticks: the tick values, ascending; the first and last are the axis' ends.
    """

    scale: Scale
    top: float
    bottom: float
    ticks: tuple[float, ...]

    @classmethod
    def fit(cls, values: Sequence[float], scale: Scale, top: float, bottom: float, floor: float = 0.0) -> ValueAxis:
        """The axis covering ``values`` (non-finite ones ignored) and at least ``[0, floor]``.

        Args:
            values: the values to draw.
            scale: ``linear`` or ``log`` (on a log axis values <= 0 are ignored for the range and
                drawn at the bottom).
            top, bottom: the plot area's edges, user units.
            floor: a value the axis must reach (e.g. 1.25 x the budget), same unit as ``values``.

        Returns:
            The axis.
        """
        finite = [v for v in values if math.isfinite(v)]
        if scale == "log":
            positive = [v for v in [*finite, floor] if v > 0]
            if not positive:
                positive = [1.0]
            return cls(scale, top, bottom, tuple(log_ticks(min(positive), max(positive))))
        return cls(scale, top, bottom, tuple(nice_ticks(max([*finite, floor, 0.0]) or 1.0)))

    def position(self, value: float) -> float:
        """The y (user units) of ``value``, clamped to the axis' ends."""
        low, high = self.ticks[0], self.ticks[-1] or 1.0
        if self.scale == "log":
            share = 0.0 if value <= low else min(math.log(value / low) / math.log(high / low), 1.0)
        else:
            share = min(max(value, 0.0), high) / high
        return round(self.bottom - (self.bottom - self.top) * share, 2)


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
    y_scale: Scale = "linear",
    width: int = 560,
    height: int = 220,
    note: str = "",
    links: Sequence[PointLink] = (),
    max_links: int = 120,
    key_note: str = "",
) -> Chart:
    """Lay out ``data`` over the time range ``[since, until]`` (x) and a :class:`ValueAxis` (y).

    Args:
        data: the series (points outside the range are clipped to it; a step series' first point
            may lie before ``since`` and then starts the line at ``since``).
        since, until: the time range (aware UTC, ``since < until``).
        title: the accessible name.
        y_format: renders a y tick value (e.g. seconds or percent).
        y_floor: the y axis covers at least ``[0, y_floor]`` (reaches ``y_floor`` on a log axis).
        y_scale: ``linear`` (from 0) or ``log`` (1-2-5 ticks over the values' range).
        width, height: the ``viewBox`` size.
        note: a sentence to show under the chart (``Chart.note``).
        links: points to draw as links (those outside the range or not finite are left out).
        max_links: the most links drawn; past it, the highest point of each of ``max_links``
            equal slots of the x axis is kept.
        key_note: a sentence about the legend (``Chart.key_note``).

    Returns:
        The chart; ``empty`` when no series has a value.

    Raises:
        ValueError: ``since`` is not before ``until``.
    """
    if not since < until:
        raise ValueError(f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
    left, right, top, bottom = 56.0, width - 12.0, 12.0, height - 28.0
    values = [v for series in data for _t, v in series.points if v is not None and math.isfinite(v)]
    values += [v for series in data for _t, v in series.bounds if math.isfinite(v)]
    axis = ValueAxis.fit(values, y_scale, top, bottom, y_floor)
    span_s = (until - since).total_seconds()

    def x_of(t: datetime) -> float:
        offset = min(max((t - since).total_seconds(), 0.0), span_s)
        return round(left + (right - left) * offset / span_s, 2)

    y_of = axis.position

    drawn: list[Series] = []
    for series in data:
        parts: list[str] = []
        if series.kind in ("step", "band"):
            last_y: float | None = None
            for t, v in series.points:
                if v is None:
                    continue
                x, y = x_of(t), y_of(v)
                if last_y is None:
                    parts.append(f"M{x},{bottom}V{y}" if series.kind == "band" else f"M{x},{y}")
                else:
                    parts.append(f"H{x}V{y}")
                last_y = y
            if last_y is not None:
                parts.append(f"H{right}V{bottom}Z" if series.kind == "band" else f"H{right}")
        else:
            run = 0  # points in the current stretch of line; a lone point gets a zero-length
            for t, v in [*series.points, (until, None)]:  # segment (a dot with round caps)
                if v is None or not math.isfinite(v):
                    if run == 1:
                        parts.append("h0")
                    run = 0
                    continue
                parts.append(f"{'L' if run else 'M'}{x_of(t)},{y_of(v)}")
                run += 1
        marks = "".join(
            bound_triangle(x_of(t), y_of(v)) for t, v in series.bounds if since <= t <= until and math.isfinite(v)
        )
        drawn.append(Series(series.name, series.css, "".join(parts), series.kind, marks))
    slots: dict[int, DrawnLink] = {}
    for link in links:
        if not (since <= link.time <= until and math.isfinite(link.value)):
            continue
        x, y = x_of(link.time), y_of(link.value)
        slot = (
            min(int((x - left) / (right - left) * max_links), max_links - 1) if len(links) > max_links else len(slots)
        )
        kept = slots.get(slot)
        if kept is None or y < kept.y:  # higher on the chart: a smaller y
            slots[slot] = DrawnLink(x, y, link.href, link.label, link.css)
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
        y_ticks=[(y_of(v), y_format(v)) for v in axis.ticks],
        empty=not any(s.path or s.bounds_path for s in drawn),
        note=note,
        key_note=key_note,
        links=[slots[k] for k in sorted(slots)],
    )
