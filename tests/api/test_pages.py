"""The route page's charts (``/ui/routes/{route}``): their time axis and its note."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from fastapi import FastAPI
from sqlalchemy import select

from hedgerow.controller.store.models import ThresholdHistory
from tests.api.conftest import MakeApi

M = {"model": "m1"}


async def _age_history(app: FastAPI, by: timedelta) -> None:
    """Move every history row ``by`` into the past, as if the route had been made then."""
    async with app.state.sessionmaker() as session, session.begin():
        for row in await session.scalars(select(ThresholdHistory)):
            row.computed_at -= by
            row.last_at -= by


def _threshold_start_x(html: str) -> tuple[float, float, float]:
    """The x of the published threshold's first point, and the plot area's left and right edges."""
    path = re.search(r'<path class="series s-threshold" d="M([0-9.]+),', html)
    axis = re.search(r'<line class="axis" x1="([0-9.]+)" x2="([0-9.]+)"', html)
    assert path is not None and axis is not None, html
    return float(path.group(1)), float(axis.group(1)), float(axis.group(2))


async def test_a_new_routes_charts_are_fitted_to_its_data_and_say_so(make_api: MakeApi) -> None:
    """A route made 2 h ago drew its whole history in the right 8% of the default 24 h chart.
    Its charts now start shortly before its first decision (the threshold line starts in the
    left tenth), and a note under each chart says the range was fitted and from when."""
    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/fresh", params=M, json={"budget": 0.05})).status_code == 201
        await _age_history(app, timedelta(hours=2))
        page = await api.get("/ui/routes/fresh", params=M)
        assert page.status_code == 200, page.text
        x, left, right = _threshold_start_x(page.text)
        assert x < left + 0.15 * (right - left), (x, left, right)
        history = (await api.get("/v1/routes/fresh/history", params=M)).json()["history"]
        first = history[-1]["computed_at"].replace("T", " ")[:16]  # 2026-12-02 17:39
        notes = [unescape(n) for n in re.findall(r'<span class="chart-note">([^<]*)</span>', page.text)]
        # one note under each chart: the threshold, the hedge rate, the failed calls
        assert len(notes) == 3 and all("Fitted to the route's data" in n and "24h range" in n for n in notes), notes
        assert first in notes[0], (first, notes)
        # the 30 d range fits as well; 1 h is shorter than the data and stays as asked
        assert "chart-note" in (await api.get("/ui/routes/fresh", params=M | {"range": "30d"})).text
        one_hour = await api.get("/ui/routes/fresh", params=M | {"range": "1h"})
        assert "chart-note" not in one_hour.text


async def test_a_route_older_than_the_range_keeps_the_range_asked_for(make_api: MakeApi) -> None:
    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/old", params=M, json={})).status_code == 201
        await _age_history(app, timedelta(days=2))
        page = await api.get("/ui/routes/old", params=M)
        assert page.status_code == 200 and "chart-note" not in page.text
        x, left, _right = _threshold_start_x(page.text)
        assert x == left  # in force since before the range: the line starts at its left edge


async def test_the_change_form_takes_a_budget_as_shown_in_percent(make_api: MakeApi) -> None:
    """The console shows budgets as percent ("10.0%") but the form refused "5%" as "not a number";
    it now reads "5%" as 0.05 (and a fraction as before)."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        form = {"default_hedge_after_s": "2", "min_hedge_after_s": "0.05", "max_hedge_after_s": "30", "enabled": "on"}
        for text, budget in (("5%", 0.05), (" 12.5 % ", 0.125), ("0.2", 0.2)):
            posted = await api.post("/ui/routes/r", params=M, data=form | {"budget": text})
            assert posted.status_code == 303, (text, posted.text)
            assert (await api.get("/v1/routes/r", params=M)).json()["budget"] == pytest.approx(budget), text
        bad = await api.post("/ui/routes/r", params=M, data=form | {"budget": "5%%"})
        assert bad.status_code == 422 and "not a number" in bad.text


RANGE_TEXT = (
    "a budget is the share of calls that may hedge and must be a fraction in (0, 1) "
    "or a percent in (0%, 100%), e.g. 0.05 or 5%"
)


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        ("150%", "150% is over 100%"),
        ("1.5", "1.5 is over 100%"),
        ("100%", "100% would let every call hedge"),
        ("0%", "0% would let no call hedge (to stop hedging, disable the route)"),
        ("-5%", "-5% is below 0%"),
    ],
)
async def test_a_budget_out_of_range_is_quoted_as_typed_with_the_range_allowed(
    make_api: MakeApi, typed: str, why: str
) -> None:
    """A form's "150%" was refused as "must be a fraction in (0, 1), got 1.5": a number the
    operator never typed. The message quotes what was typed and says which range is allowed."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        form = {"default_hedge_after_s": "2", "min_hedge_after_s": "0.05", "max_hedge_after_s": "30", "enabled": "on"}
        posted = await api.post("/ui/routes/r", params=M, data=form | {"budget": typed})
        assert posted.status_code == 422, posted.text
        assert f'role="alert">budget: {why}: {RANGE_TEXT}</p>' in posted.text
        assert f'name="budget" inputmode="decimal" value="{typed}"' in posted.text  # the form keeps it
        assert (await api.get("/v1/routes/r", params=M)).json()["budget"] == 0.1


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"range": "2y"}, "range: must be one of 1h, 6h, 24h, 7d, 30d, got &#39;2y&#39;"),
        ({"page": "abc"}, "page: must be from 1 to 1000000, got &#39;abc&#39;"),
        ({"page": "0"}, "page: must be from 1 to 1000000, got &#39;0&#39;"),
        ({"page": "-3"}, "page: must be from 1 to 1000000, got &#39;-3&#39;"),
        ({"applied": "maybe"}, "applied: must be true, false or empty, got &#39;maybe&#39;"),
    ],
)
async def test_a_bad_range_page_or_applied_filter_is_422_naming_it(
    make_api: MakeApi, query: dict[str, str], message: str
) -> None:
    """The route page refuses a query it cannot honour with a 422 naming the parameter: a page
    drawn with a default in its place would be read as the one asked for."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        page = await api.get("/ui/routes/r", params=M | query)
        assert page.status_code == 422, page.text
        assert message in page.text
        assert (
            await api.get("/ui/routes/r", params=M | {"range": "7d", "page": "1", "applied": "true"})
        ).status_code == 200


async def test_the_root_opens_the_console(make_api: MakeApi) -> None:
    """``GET /`` was a JSON 404: a browser pointed at the service now lands on the routes page."""
    async with make_api() as (_app, api):
        for path in ("/", "/ui", "/ui/"):
            answer = await api.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/ui/routes", path


async def test_a_new_route_page_says_what_its_source_and_reasons_mean(make_api: MakeApi) -> None:
    """A route made without calls publishes its maximum from a cold start: the page says what
    ``cold_start`` means, each reason code carries its meaning as a tooltip, and a legend lists
    the codes of the rows shown (``reason_codes.REASON_MEANINGS``)."""
    from hedgerow.controller.policy.reason_codes import REASON_MEANINGS, SOURCE_MEANINGS

    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/fresh", params=M, json={"budget": 0.05})).status_code == 201
        page = await api.get("/ui/routes/fresh", params=M)
        assert page.status_code == 200, page.text
        html = unescape(page.text)
        assert f"cold_start: {SOURCE_MEANINGS['cold_start']}" in html
        assert f'<abbr title="{REASON_MEANINGS["cold_start_supported"]}">cold_start_supported</abbr>' in html
        legend = html[html.index('id="reason-legend"') :]
        for code in ("cold_start_supported", "clamped_max"):
            assert f"<dt>{code}</dt><dd>{REASON_MEANINGS[code]}</dd>" in legend


async def test_the_route_page_draws_thresholds_on_a_log_axis_and_the_budget_as_a_band(make_api: MakeApi) -> None:
    """The threshold chart's axis was linear (its 30 s cold start flattened the working range) and
    the budget only a dashed line; the threshold chart is now log scale (1-2-5 ticks) and the
    hedge-rate chart shades the share of calls the budget allows."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={"budget": 0.05})).status_code == 201
        page = await api.get("/ui/routes/r", params=M)
        assert page.status_code == 200, page.text
        first, second = page.text.split('<figure class="chart">')[1:3]
        assert "(log scale)" in first
        ticks = re.findall(r'<text class="tick" x="50.0" y="[0-9.]+" text-anchor="end">([^<]+)</text>', first)
        assert ticks and all(re.fullmatch(r"[0-9.]+ (ms|s)", t) for t in ticks), ticks
        assert '<path class="band s-budget-band" d="M' in second and "Z" in second
        assert '<span class="key s-budget-band">within budget</span>' in second
