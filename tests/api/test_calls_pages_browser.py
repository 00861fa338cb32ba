"""The calls explorer in a real headless Chromium: from a spike on a route's chart to the upstream
behind it in at most three clicks, at desktop and phone widths."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import assert_local_only, open_page
from tests.e2e.console_seed import SEED_SETTINGS, seed_store
from tests.serve_process import ServeProcess

#: The dot of the quantile chart drawn highest (the spike): its index among the chart's links.
_HIGHEST_DOT = """() => {
  const dots = [...document.querySelectorAll('figure.chart')][0].querySelectorAll('a.point-link circle.dot');
  let best = 0;
  dots.forEach((d, i) => { if (+d.getAttribute('cy') < +dots[best].getAttribute('cy')) best = i; });
  return {best, count: dots.length};
}"""
#: The smallest tap target of the charts' dots, CSS px (the larger side of each hit circle's box).
_SMALLEST_HIT = """() => Math.min(...[...document.querySelectorAll('figure.chart a.point-hit circle.hit')]
  .map(c => Math.min(c.getBoundingClientRect().width, c.getBoundingClientRect().height)))"""
#: Each date-time filter's width and the width Chromium gives the same input left to itself
#: (what its text needs: narrower, and the time is cut off).
_TIME_INPUTS = """() => {
  const probe = document.createElement('input');
  probe.type = 'datetime-local'; probe.step = '1'; probe.value = '2026-12-05T10:00:00';
  probe.style.position = 'absolute'; probe.style.visibility = 'hidden';
  probe.style.width = 'auto'; probe.style.maxWidth = 'none';  // its own width, not the form's rule
  document.querySelector('form.filters label.time').appendChild(probe);  // the same font, out of the flow
  const needed = probe.getBoundingClientRect().width;
  probe.remove();
  const inputs = [...document.querySelectorAll('form.filters input[type=datetime-local]')];
  return {needed, widths: inputs.map(e => e.getBoundingClientRect().width),
          rights: inputs.map(e => e.getBoundingClientRect().right)};
}"""


@pytest.mark.slow
@pytest.mark.parametrize("viewport", [(1280, 800), (390, 844)])
async def test_from_a_spike_to_the_upstream_behind_it_in_three_clicks(
    tmp_path: Path, viewport: tuple[int, int]
) -> None:
    """Click 1: the highest dot of the route's latency chart opens the calls its tick measured.
    Click 2: the outcome filter's "hedge won" (one submit). Click 3: the first call opens, and
    its attempts name the upstream that won and the one that was too slow."""
    db = tmp_path / "explorer.db"
    await seed_store(f"sqlite+aiosqlite:///{db}", hours=24, calls_per_hour=30)
    server = ServeProcess(
        f"sqlite+aiosqlite:///{db}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", **SEED_SETTINGS}
    )
    width = viewport[0]
    try:
        async with open_page(viewport=viewport) as (page, requests):
            response = await page.goto(f"{server.url}/ui/routes/summarize?range=24h")
            assert response is not None and response.status == 200
            spike = await page.evaluate(_HIGHEST_DOT)
            assert spike["count"] >= 5, spike
            dot = page.locator("figure.chart").first.locator("a.point-link").nth(spike["best"])
            await page.screenshot(path=str(tmp_path / f"route_{width}.png"), full_page=True)
            smallest_hit = await page.evaluate(_SMALLEST_HIT)
            await dot.click()  # click 1
            await page.wait_for_url("**/ui/calls/summarize?**")
            assert "since=" in page.url and "until=" in page.url
            assert await page.locator("details.call").count() > 0
            assert await page.locator("#upstream-counts").is_visible()
            times = await page.evaluate(_TIME_INPUTS)
            assert await page.locator("select[name=failed_upstream]").is_visible()
            await page.select_option("select[name=outcome]", "hedge_won")
            await page.click("form.filters button")  # click 2
            await page.wait_for_url("**outcome=hedge_won**")
            first = page.locator("details.call").first
            assert "hedge won" in await first.locator("summary").inner_text()
            await first.locator("summary").click()  # click 3
            winner = first.locator("table.attempts tr.a-won td.upstream")
            loser = first.locator("table.attempts tr.a-cancelled td.upstream")
            assert await winner.is_visible() and await winner.inner_text() == "b"
            assert await loser.is_visible() and await loser.inner_text() == "a"
            assert "(censored)" in await first.locator("table.attempts").inner_text()
            wide = await page.evaluate("() => document.scrollingElement.scrollWidth")
            await page.screenshot(path=str(tmp_path / f"calls_{width}.png"), full_page=True)
            assert_local_only(requests)
    finally:
        server.stop()
    assert wide <= width, f"the calls page scrolls sideways at {width} px ({wide} px wide)"
    assert smallest_hit >= 24, f"a chart dot's tap target is {smallest_hit:.1f} px at {width} px"
    assert len(times["widths"]) == 2 and all(w >= times["needed"] - 0.5 for w in times["widths"]), times
    assert all(right <= width for right in times["rights"]), times
