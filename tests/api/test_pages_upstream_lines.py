"""The route page's latency chart draws a P90 line per upstream (``/ui/routes/{route}``).

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import pytest

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.policy.ttft_histogram import bucket_bounds, bucket_index, bucket_value_s
from tests.api.conftest import MakeApi

A = AttemptRecord
M = {"model": "m1"}
ODD = "a<b>&c"  # an upstream name the page must escape


def _call(rid: str, attempts: tuple[AttemptRecord, ...], at: datetime) -> dict[str, Any]:
    won = next(a for a in attempts if a.outcome == "won")
    record = CallRecord(
        rid,
        "chat",
        "m1",
        at,
        hedged=len(attempts) > 1,
        hedge_reason="ttft_timeout" if len(attempts) > 1 else None,
        winner=won.role,
        ttft_s=won.first_token_s,
        prompt_tokens=10,
        completion_tokens=10,
        attempts=attempts,
    )
    return record.to_dict()


def _alone(rid: str, upstream: str, ttft_s: float, at: datetime) -> dict[str, Any]:
    return _call(rid, (A(upstream, "primary", 0.0, ttft_s, ttft_s + 1, "won", 200, None, 10),), at)


def _calls(at: datetime) -> list[dict[str, Any]]:
    """Seven upstreams in one hour: "east" 0.1..1.0 s, ODD 0.2 s, "slow" mostly cancelled at 0.3 s
    (a lower bound), "west" (8 samples: no point), "n1"/"n2" busier, "n3" the least busy."""
    out = [_alone(f"e{i}", "east", 0.1 * i, at) for i in range(1, 11)]
    out += [_alone(f"o{i}", ODD, 0.2, at) for i in range(10)]
    out += [_alone(f"s{i}", "slow", 0.1 * i, at) for i in (1, 2)]
    for i in range(8):
        attempts = (
            A("slow", "primary", 0.0, None, 0.3, "cancelled", 200, None, 0),
            A("west", "backup", 0.1, 0.3, 1.3, "won", 200, None, 10),
        )
        out.append(_call(f"sw{i}", attempts, at))
    for name in ("n1", "n2"):
        out += [_alone(f"{name}-{i}", name, 0.05, at) for i in range(11)]
    out += [_alone(f"n3-{i}", "n3", 0.05, at) for i in range(5)]
    return out


def _found(match: re.Match[str] | None) -> re.Match[str]:
    """``match``, which the test expects to have found its pattern."""
    assert match is not None, "pattern not found"
    return match


def _first_chart(html: str) -> str:
    return html.split('<figure class="chart">')[1].split("</figure>")[0]


def _seconds(label: str) -> float:
    number, unit = label.split()
    return float(number) / (1000 if unit == "ms" else 1)


def _y_of(chart: str, value_s: float) -> float:
    """Where ``value_s`` lies on the chart's log axis, from its labelled ticks."""
    ticks = [
        (float(y) - 4, _seconds(label))
        for y, label in re.findall(r'<text class="tick" x="50.0" y="([0-9.]+)" text-anchor="end">([^<]+)</text>', chart)
    ]
    (bottom, low), (top, high) = ticks[0], ticks[-1]
    return bottom - (bottom - top) * math.log(value_s / low) / math.log(high / low)


async def test_the_latency_chart_draws_the_busiest_upstreams_p90_on_its_log_axis(make_api: MakeApi) -> None:
    at = datetime.now(UTC) - timedelta(hours=3)
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": _calls(at)})).status_code == 202
        page = await api.get("/ui/routes/chat", params=M | {"range": "24h"})
        now = datetime.now(UTC)
        assert page.status_code == 200, page.text
        chart = _first_chart(page.text)
        second = page.text.split('<figure class="chart">')[2]
    assert "each upstream&#39;s P90" in chart and "(log scale)" in chart
    keys = re.findall(r'<span class="key upstream-key s-up (s-up[0-9])">.*?</svg>([^<]*)</span>', chart)
    # busiest first (most TTFT samples, then name); n3 (5 samples) is the seventh: not drawn
    # west (8 samples) has nothing to draw: no key either
    assert keys == [
        ("s-up1", "n1 P90"), ("s-up2", "n2 P90"), ("s-up3", "a&lt;b&gt;&amp;c P90"),
        ("s-up4", "east P90"), ("s-up5", "slow P90"),
    ], keys  # fmt: skip
    assert "n3" not in chart and "west" not in chart and "<b>" not in page.text
    paths = dict(re.findall(r'<path class="series s-up (s-up[0-9])" d="([^"]+)">', chart))
    bounds = dict(re.findall(r'<path class="bound s-up (s-up[0-9])" d="([^"]+)">', chart))
    # one slot each: a lone point is a dot (a zero-length segment); slow (a lower bound only) has
    # no line but a triangle
    assert set(paths) == {"s-up1", "s-up2", "s-up3", "s-up4"} and all(p.endswith("h0") for p in paths.values())
    assert set(bounds) == {"s-up5"}
    east_y = float(_found(re.match(r"M[0-9.]+,([0-9.]+)h0", paths["s-up4"])).group(1))
    assert abs(east_y - _y_of(chart, bucket_value_s(bucket_index(0.9)))) < 0.6, (east_y, chart)
    odd_y = float(_found(re.match(r"M[0-9.]+,([0-9.]+)h0", paths["s-up3"])).group(1))
    assert abs(odd_y - _y_of(chart, bucket_value_s(bucket_index(0.2)))) < 0.6
    slow_y = float(_found(re.match(r"M[0-9.]+,([0-9.]+)l", bounds["s-up5"])).group(1))
    assert abs(slow_y - _y_of(chart, bucket_bounds(bucket_index(0.3))[0])) < 0.6
    # the dot sits in the middle of its one-hour slot (UTC, on the hour)
    middle = at.replace(minute=30, second=0, microsecond=0)
    left, right = map(float, _found(re.search(r'<line class="axis" x1="([0-9.]+)" x2="([0-9.]+)"', chart)).groups())
    east_x = float(_found(re.match(r"M([0-9.]+),", paths["s-up4"])).group(1))
    assert abs(east_x - (left + (right - left) * (1 - (now - middle) / timedelta(hours=24)))) < 0.5
    note = unescape(_found(re.search(r'<span class="chart-note key-note">([^<]+)</span>', chart)).group(1))
    assert "the 6 busiest upstreams (others not drawn) (1 with too few samples in every slot), per 1 h" in note
    assert "fewer than 10 samples or 5 first tokens" in note and "open triangle" in note, note
    assert "s-up" not in second  # the hedge-rate chart has no upstream line


async def test_lines_join_consecutive_slots_and_break_over_an_empty_one(make_api: MakeApi) -> None:
    now = datetime.now(UTC)
    hours = (6, 5, 3)  # a gap at 4 h ago
    calls = [_alone(f"h{h}-{i}", "east", 0.1 * (i + 1), now - timedelta(hours=h)) for h in hours for i in range(10)]
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": calls})).status_code == 202
        chart = _first_chart((await api.get("/ui/routes/chat", params=M | {"range": "24h"})).text)
    (path,) = re.findall(r'<path class="series s-up s-up1" d="([^"]+)">', chart)
    assert re.fullmatch(r"M[0-9.]+,[0-9.]+L[0-9.]+,[0-9.]+M[0-9.]+,[0-9.]+h0", path), path
    note = unescape(_found(re.search(r'<span class="chart-note key-note">([^<]+)</span>', chart)).group(1))
    assert "the P90 TTFT of its one upstream, per 1 h" in note


async def test_upstreams_with_too_few_samples_draw_nothing_and_the_note_says_so(make_api: MakeApi) -> None:
    at = datetime.now(UTC) - timedelta(hours=2)
    calls = [_alone(f"e{i}", "east", 0.2, at) for i in range(9)]
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": calls})).status_code == 202
        chart = _first_chart((await api.get("/ui/routes/chat", params=M)).text)
    assert "s-up" not in chart
    note = unescape(_found(re.search(r'<span class="chart-note key-note">([^<]+)</span>', chart)).group(1))
    assert note == "Per-upstream lines: no upstream had 10 TTFT samples in one 1 h slot."


async def test_a_route_without_calls_has_no_upstream_line(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/quiet", params=M, json={})).status_code == 201
        page = await api.get("/ui/routes/quiet", params=M)
    assert page.status_code == 200 and "s-up" not in page.text and "key-note" not in page.text
    assert "each upstream&#39;s P90" not in page.text


async def test_the_lines_are_reused_for_a_minute_then_read_again(
    make_api: MakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paging or filtering the history draws the same charts: the lines read less than
    ``UPSTREAM_LINES_TTL_S`` ago are reused (a new upstream shows only once they are older)."""
    import hedgerow.api.pages as pages

    at = datetime.now(UTC) - timedelta(hours=2)
    first = [_alone(f"e{i}", "east", 0.2, at) for i in range(10)]
    later = [_alone(f"w{i}", "west", 0.3, at) for i in range(10)]
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": first})).status_code == 202
        before = _first_chart((await api.get("/ui/routes/chat", params=M)).text)
        assert (await api.post("/v1/calls", json={"calls": later})).status_code == 202
        paged = _first_chart((await api.get("/ui/routes/chat", params=M | {"page": "2"})).text)
        monkeypatch.setattr(pages, "UPSTREAM_LINES_TTL_S", 0.0)
        fresh = _first_chart((await api.get("/ui/routes/chat", params=M)).text)
    assert "east P90" in before and "west P90" not in before
    assert "east P90" in paged and "west P90" not in paged
    assert "east P90" in fresh and "west P90" in fresh
