"""The weekly report's plots: a day axis with one tick per day of the section, whatever has data."""

from __future__ import annotations

from typing import Any

import pytest

from hedgerow.controller.report import report_plots


def _daily(with_data: int) -> list[dict[str, Any]]:
    days = ["2026-11-30", "2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04", "2026-12-05", "2026-12-06"]
    daily: list[dict[str, Any]] = [
        {"date": d, "ttft_p99_s": None, "primary_ttft_p99_s": None, "ttft_p50_s": None, "primary_ttft_p50_s": None}
        | {"hedge_rate": None}
        for d in days
    ]
    daily[with_data].update(ttft_p99_s=1.7, primary_ttft_p99_s=1.8, ttft_p50_s=0.1, primary_ttft_p50_s=0.12)
    daily[with_data]["hedge_rate"] = 0.06
    return daily


@pytest.mark.parametrize("plot", ["latency", "hedge_rate"])
def test_a_week_with_one_day_of_data_has_seven_day_ticks(plot: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def labels(fig: Any) -> str:
        fig.canvas.draw()
        seen.append([t.get_text() for t in fig.axes[0].get_xticklabels()])
        return "<svg/>"

    monkeypatch.setattr(report_plots, "_svg", labels)
    if plot == "latency":
        report_plots.daily_latency_svg(_daily(2), "t")
    else:
        report_plots.hedge_rate_svg(_daily(2), 0.1, "t")
    assert seen == [["Mon 30", "Tue 01", "Wed 02", "Thu 03", "Fri 04", "Sat 05", "Sun 06"]]


def test_plots_are_inline_svg_without_a_prolog() -> None:
    svg = report_plots.daily_latency_svg(_daily(0), "t")
    assert svg.startswith("<svg") and "<?xml" not in svg
