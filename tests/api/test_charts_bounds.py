"""Chart geometry for the per-upstream lines: lower bounds as triangles, lone points as dots."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hedgerow.api.charts import (
    BOUND_HALF_WIDTH,
    BOUND_HEIGHT,
    Chart,
    SeriesData,
    bound_triangle,
    seconds_label,
    time_chart,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
T1 = T0 + timedelta(hours=10)


def _chart(*data: SeriesData) -> Chart:
    return time_chart(list(data), T0, T1, title="t", y_format=seconds_label, y_scale="log")


def test_a_lower_bound_is_a_triangle_with_its_apex_at_the_value_and_widens_the_axis() -> None:
    line = SeriesData("u P90", "s-up s-up1", "line", [(T0 + timedelta(hours=1), 0.2), (T0 + timedelta(hours=2), 0.3)])
    bounded = SeriesData("u P90", "s-up s-up1", "line", list(line.points), bounds=[(T0 + timedelta(hours=5), 4.0)])
    plain, with_bound = _chart(line), _chart(bounded)
    assert plain.y_ticks[-1][1] == "500 ms" and with_bound.y_ticks[-1][1] == "5 s"  # the bound is on the axis
    (series,) = with_bound.series
    x = round(with_bound.left + (with_bound.right - with_bound.left) * 0.5, 2)
    top = with_bound.y_ticks[-1][0]
    y4 = round(
        with_bound.bottom - (with_bound.bottom - top) * (math.log(4.0 / 0.2) / math.log(5.0 / 0.2)),
        2,
    )
    assert (
        series.bounds_path
        == bound_triangle(x, y4)
        == f"M{x},{y4}l{BOUND_HALF_WIDTH},{BOUND_HEIGHT}h{-2 * BOUND_HALF_WIDTH}Z"
    )
    assert series.path.startswith("M") and "h0" not in series.path and not plain.series[0].bounds_path


def test_a_point_alone_between_gaps_is_a_dot_and_a_bound_alone_is_not_an_empty_chart() -> None:
    hour = timedelta(hours=1)
    data = SeriesData(
        "u",
        "s-up s-up1",
        "line",
        [
            (T0 + hour, 0.2),
            (T0 + 2 * hour, None),
            (T0 + 3 * hour, 0.3),
            (T0 + 4 * hour, 0.4),
            (T0 + 5 * hour, None),
            (T0 + 6 * hour, 0.5),
        ],
    )
    (series,) = _chart(data).series
    parts = series.path.split("M")[1:]
    assert [p.endswith("h0") for p in parts] == [True, False, True], series.path
    only_bound = _chart(SeriesData("u", "s-up s-up1", "line", [(T0 + hour, None)], bounds=[(T0 + hour, 1.0)]))
    assert not only_bound.empty and only_bound.series[0].path == ""
