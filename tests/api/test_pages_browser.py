"""The route page's charts in a real headless Chromium: their labels are readable at desktop and
phone widths."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.browser import assert_local_only, open_page
from tests.e2e.console_seed import SEED_SETTINGS, seed_store
from tests.serve_process import ServeProcess


@pytest.mark.slow
@pytest.mark.parametrize(("viewport", "smallest_px"), [((1280, 800), 12.0), ((390, 844), 8.0)])
async def test_chart_labels_are_readable_at_desktop_and_phone_widths(
    tmp_path: Path, viewport: tuple[int, int], smallest_px: float
) -> None:
    """The charts were laid out 800 units wide with 11-unit labels, then scaled to fit: the
    labels were about 9 px high on a 1280 px desktop (two charts side by side) and 5 px on a
    390 px phone. Laid out 560 wide with 13-unit labels, they are at least 12 px and 8 px high."""
    server = ServeProcess(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        made = httpx.put(f"{server.url}/v1/routes/r", params={"model": "m1"}, json={}, timeout=60)
        assert made.status_code == 201, made.text
        async with open_page(viewport=viewport) as (page, requests):
            response = await page.goto(f"{server.url}/ui/routes/r?model=m1")
            assert response is not None and response.status == 200
            heights = await page.eval_on_selector_all(
                "figure.chart text.tick", "ticks => ticks.map(t => t.getBoundingClientRect().height)"
            )
            await page.screenshot(path=str(tmp_path / "route.png"), full_page=True)
            assert_local_only(requests)
    finally:
        server.stop()
    assert len(heights) >= 12, heights  # x and y ticks of both charts
    assert min(heights) >= smallest_px, heights


@pytest.mark.slow
async def test_a_route_with_a_day_of_history_fits_a_phone_in_a_few_screens(tmp_path: Path) -> None:
    """At 390 px the route page of a day of history was about 8,700 px long: each history row
    was a card of twelve label/value lines (some 320 px). On a phone a row is now a short card
    (when, from, to, applied, repeats, reason; the measured figures are on the charts), so the
    page is under 4,000 px (plus each card's folded "Why" line) and no card is over 120 px; on a
    desktop the table keeps every column."""
    db = tmp_path / "console.db"
    await seed_store(f"sqlite+aiosqlite:///{db}", hours=24, calls_per_hour=30)
    server = ServeProcess(
        f"sqlite+aiosqlite:///{db}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", **SEED_SETTINGS}
    )
    measure = """() => ({page: document.scrollingElement.scrollHeight, wide: document.scrollingElement.scrollWidth,
        cards: [...document.querySelectorAll('table.history tbody tr:not(.why)')].map(
            r => r.getBoundingClientRect().height),
        whys: [...document.querySelectorAll('table.history tbody tr.why')].map(r => r.getBoundingClientRect().height),
        samples: [...document.querySelectorAll('table.history td[data-label=samples]')].filter(
            td => td.getBoundingClientRect().height > 0).length})"""
    found = {}
    try:
        for width, height in ((390, 844), (1280, 800)):
            async with open_page(viewport=(width, height)) as (page, requests):
                response = await page.goto(f"{server.url}/ui/routes/summarize?range=24h")
                assert response is not None and response.status == 200
                found[width] = await page.evaluate(measure)
                await page.screenshot(path=str(tmp_path / f"route_{width}.png"), full_page=True)
                assert_local_only(requests)
    finally:
        server.stop()
    phone, desktop = found[390], found[1280]
    assert len(phone["cards"]) >= 10, phone  # a day of decisions: held runs and applied changes
    assert phone["wide"] <= 390, phone
    # each card ends in its folded "Why" line (the row's sentences), about 20 px more a row
    assert len(phone["whys"]) == len(phone["cards"]) and max(phone["whys"]) <= 24, phone
    assert phone["page"] < 4000 + 24 * len(phone["cards"]), phone
    assert max(phone["cards"]) <= 120, phone
    assert phone["samples"] == 0 and desktop["samples"] == len(desktop["cards"]), (phone, desktop)


@pytest.mark.slow
async def test_console_pages_request_nothing_that_fails(tmp_path: Path) -> None:
    """Chromium asks for ``/favicon.ico`` on every page without an icon link; the console had
    none, so each page logged a 404 in the browser's console. The pages now declare an empty
    inline icon, and loading them logs no error."""
    server = ServeProcess(f"sqlite:///{tmp_path / 'f.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        made = httpx.put(f"{server.url}/v1/routes/r", params={"model": "m1"}, json={}, timeout=60)
        assert made.status_code == 201, made.text
        async with open_page() as (page, requests):
            errors: list[str] = []  # the icon's request is not a page event; its failure is logged
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            for path in ("/ui/routes", "/ui/routes/r?model=m1", "/ui/reports"):
                response = await page.goto(f"{server.url}{path}", wait_until="networkidle")
                assert response is not None and response.status == 200, path
                await page.wait_for_timeout(500)  # the icon is asked for after the load
            assert_local_only(requests)
    finally:
        server.stop()
    assert errors == []


@pytest.mark.slow
async def test_each_history_row_opens_to_its_sentences_at_desktop_and_phone_widths(tmp_path: Path) -> None:
    """Each history row has a folded "Why" (a ``<details>``, no script): closed, no sentence shows;
    clicked, the row's sentences show, the same as the api's ``explanation``, within the window
    (no sideways scroll at 1280 or 390 px) and under their own row (a phone card's last line)."""
    db = tmp_path / "why.db"
    await seed_store(f"sqlite+aiosqlite:///{db}", hours=12, calls_per_hour=30)
    server = ServeProcess(
        f"sqlite+aiosqlite:///{db}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", **SEED_SETTINGS}
    )
    measure = """(n) => {
        const rows = [...document.querySelectorAll('table.history tbody tr:not(.why)')];
        const whys = [...document.querySelectorAll('table.history tbody tr.why')];
        const items = [...whys[n].querySelectorAll('li')];
        return {rows: rows.length, whys: whys.length,
            follows: whys.every((w, i) => w.previousElementSibling === rows[i]),
            visible: items.filter(li => li.checkVisibility()).map(li => li.textContent),
            right: Math.max(0, ...items.map(li => li.getBoundingClientRect().right)),
            rowBottom: rows[n].getBoundingClientRect().bottom, whyTop: whys[n].getBoundingClientRect().top,
            wide: document.scrollingElement.scrollWidth};
    }"""
    found = {}
    try:
        api_rows = httpx.get(f"{server.url}/v1/routes/summarize/history", params={"limit": 50}, timeout=60).json()
        applied = next(i for i, row in enumerate(api_rows["history"]) if "step_down_limited" in row["reason"])
        for width, height in ((1280, 800), (390, 844)):
            async with open_page(viewport=(width, height)) as (page, requests):
                response = await page.goto(f"{server.url}/ui/routes/summarize?range=24h")
                assert response is not None and response.status == 200
                closed = await page.evaluate(measure, applied)
                await page.locator("table.history tr.why summary").nth(applied).click()
                opened = await page.evaluate(measure, applied)
                await page.screenshot(path=str(tmp_path / f"why_{width}.png"), full_page=True)
                assert_local_only(requests)
            found[width] = (closed, opened)
    finally:
        server.stop()
    expected = api_rows["history"][applied]["explanation"]
    assert any("window-looks bound" in sentence for sentence in expected), expected
    for width, (closed, opened) in found.items():
        assert closed["rows"] == closed["whys"] == len(api_rows["history"]) and closed["follows"], closed
        assert closed["visible"] == [], (width, closed)
        assert opened["visible"] == expected, (width, opened)
        assert opened["right"] <= width and opened["wide"] <= width, (width, opened)
        assert opened["whyTop"] >= opened["rowBottom"] - 1, (width, opened)
