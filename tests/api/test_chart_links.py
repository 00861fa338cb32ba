"""Point links of a chart (:class:`hedgerow.api.charts.PointLink`): placed on their points, bounded,
and a spike keeps its link when they are thinned."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hedgerow.api.charts import Chart, PointLink, SeriesData, time_chart

SINCE = datetime(2026, 12, 3, tzinfo=UTC)
UNTIL = SINCE + timedelta(hours=24)


def _chart(links: list[PointLink], max_links: int = 120) -> Chart:
    points = [(link.time, link.value) for link in links]
    return time_chart(
        [SeriesData("p99", "s-p99", "line", points)],
        SINCE,
        UNTIL,
        title="t",
        y_format=str,
        links=links,
        max_links=max_links,
    )


def test_a_link_sits_on_its_point_of_the_line() -> None:
    link = PointLink(SINCE + timedelta(hours=12), 0.5, "/ui/calls/r?x=1", "P99", "s-p99")
    chart = _chart([PointLink(SINCE + timedelta(hours=1), 1.0, "/a", "a", "s-p99"), link])
    drawn = chart.links[1]
    assert (drawn.href, drawn.label, drawn.css) == ("/ui/calls/r?x=1", "P99", "s-p99")
    assert f"{drawn.x},{drawn.y}" in chart.series[0].path  # the dot is on the drawn line


def test_links_outside_the_range_or_not_finite_are_left_out() -> None:
    links = [
        PointLink(SINCE - timedelta(hours=1), 1.0, "/before", "", "s"),
        PointLink(UNTIL + timedelta(hours=1), 1.0, "/after", "", "s"),
        PointLink(SINCE + timedelta(hours=2), float("nan"), "/nan", "", "s"),
        PointLink(SINCE + timedelta(hours=3), 1.0, "/kept", "", "s"),
    ]
    assert [link.href for link in _chart(links).links] == ["/kept"]


def test_past_the_bound_each_slot_keeps_its_highest_point_so_a_spike_keeps_its_link() -> None:
    links = [PointLink(SINCE + timedelta(minutes=i), 1.0, f"/m{i}", "", "s") for i in range(1440)]
    links[700] = PointLink(SINCE + timedelta(minutes=700), 9.0, "/spike", "", "s")
    chart = _chart(links, max_links=48)
    assert len(chart.links) == 48
    assert "/spike" in {link.href for link in chart.links}
    assert min(chart.links, key=lambda link: link.y).href == "/spike"
    xs = [link.x for link in chart.links]
    assert xs == sorted(xs)  # left to right, one per slot
