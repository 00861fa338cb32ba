"""The console's chart geometry (``hedgerow.api.charts``): the log axis of the threshold chart and
the budget band of the hedge-rate chart."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from hedgerow.api.charts import SeriesData, ValueAxis, log_ticks, seconds_label, time_chart

#: A route's working range (0.12..0.9 s) and its 30 s cold-start threshold.
WORKING = [0.12, 0.2, 0.35, 0.5, 0.7, 0.9]
COLD_START_S = 30.0
TOP, BOTTOM = 12.0, 192.0


def _share_apart(axis: ValueAxis, a: float, b: float) -> float:
    return abs(axis.position(a) - axis.position(b)) / (axis.bottom - axis.top)


def test_the_working_range_spans_the_plot_on_the_log_axis_and_lay_flat_on_the_linear_one() -> None:
    """On the linear axis that includes the 30 s cold start, 0.12 s and 0.9 s were 2.6% of the
    plot height apart (the P90/P99 lines lay on the axis); on the log axis they are over 20%."""
    values = [*WORKING, COLD_START_S]
    linear = ValueAxis.fit(values, "linear", TOP, BOTTOM)
    log = ValueAxis.fit(values, "log", TOP, BOTTOM)
    assert _share_apart(linear, 0.12, 0.9) < 0.03
    assert _share_apart(log, 0.12, 0.9) > 0.20
    # every value is inside the plot, the largest at the top, the ends are ticks
    assert log.ticks[0] <= 0.12 and log.ticks[-1] >= COLD_START_S
    assert all(TOP <= log.position(v) <= BOTTOM for v in values)
    assert log.position(log.ticks[-1]) == TOP and log.position(log.ticks[0]) == BOTTOM
    assert log.position(0.0) == BOTTOM  # a 0 s threshold cannot be drawn on a log axis: at its foot


def test_log_ticks_are_1_2_5_steps_and_thin_to_decades() -> None:
    assert log_ticks(0.12, 30.0) == [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]
    assert log_ticks(0.3, 0.3) == [0.2, 0.5]  # one value still gets an axis around it
    wide = log_ticks(0.0012, 300.0)
    assert wide == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 500.0]
    with pytest.raises(ValueError, match="low=0"):
        log_ticks(0.0, 1.0)


def test_duration_labels_use_ms_below_a_second() -> None:
    assert [seconds_label(v) for v in (0.1, 0.2, 0.05, 1.0, 2.0, 30.0, 0.0)] == [
        "100 ms",
        "200 ms",
        "50 ms",
        "1 s",
        "2 s",
        "30 s",
        "0 s",
    ]


def test_a_band_is_a_closed_area_under_its_steps() -> None:
    """The budget is drawn as a shaded band from the axis up to it (and its line on top)."""
    until = datetime(2026, 12, 1, 12, tzinfo=UTC)
    since = until - timedelta(hours=1)
    chart = time_chart(
        [
            SeriesData("within budget", "s-budget-band", "band", [(since, 0.1), (since + timedelta(minutes=30), 0.05)]),
            SeriesData("budget", "s-budget", "step", [(since, 0.1), (since + timedelta(minutes=30), 0.05)]),
        ],
        since,
        until,
        title="t",
        y_format=str,
    )
    band, line = chart.series
    assert band.kind == "band" and re.fullmatch(r"M56\.0,(\S+)V\S+H\S+V\S+H548\.0V\1Z", band.path), band.path
    assert band.path.split("V", 1)[0] == f"M56.0,{chart.bottom}"
    assert line.path.startswith("M56.0,") and not line.path.endswith("Z")
