"""The ops console in a real headless Chromium against a real ``hedgerow serve`` with tokens.

The store is seeded with real ingest and controller ticks (:mod:`tests.e2e.console_seed`). Each
page must load after the login, draw its charts (SVG paths with data), request nothing outside
127.0.0.1 and fit a phone's width (390 px) without sideways scrolling; the change form changes
the route and the history shows the change under the token's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from playwright.async_api import Page

from tests.browser import assert_local_only, open_page
from tests.e2e.console_seed import SEED_SETTINGS, seed_store
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow

TOKENS = "reader=r3ad-token:read,ops=adm1n-token:admin"
VIEWPORTS = [(1280, 800), (390, 844)]


@pytest.fixture(scope="module")
def seeded_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store with 6 hours of two routes, seeded once per module (copied by each test)."""
    import asyncio

    path = tmp_path_factory.mktemp("seed") / "console.db"
    asyncio.run(seed_store(f"sqlite+aiosqlite:///{path}", hours=6, calls_per_hour=40))
    return path


@pytest.fixture
def console(tmp_path: Path, seeded_file: Path) -> Iterator[ServeProcess]:
    """The seeded store served with a read and an admin token."""
    import shutil

    shutil.copyfile(seeded_file, tmp_path / "console.db")
    url = f"sqlite+aiosqlite:///{tmp_path / 'console.db'}"
    env = {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600", "HEDGEROW_TOKENS": TOKENS, **SEED_SETTINGS}
    process = ServeProcess(url, tmp_path, env)
    try:
        yield process
    finally:
        process.stop()


async def _login(page: Page, base: str, token: str, next_path: str) -> None:
    await page.goto(f"{base}{next_path}")
    assert "/ui/login" in page.url  # the page needs a token first
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_load_state("networkidle")
    assert next_path in page.url.replace("%2F", "/")


async def _no_sideways_scroll(page: Page) -> None:
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than the viewport"


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=lambda v: f"{v[0]}x{v[1]}")
async def test_every_page_loads_draws_its_charts_and_stays_local(
    console: ServeProcess, viewport: tuple[int, int]
) -> None:
    async with open_page(viewport=viewport) as (page, requests):
        await _login(page, console.url, "r3ad-token", "/ui/routes")
        rows = page.locator("table.routes tbody tr")
        assert await rows.count() == 2
        text = await page.inner_text("table.routes")
        assert "summarize" in text and "team/chat" in text and "controller" in text
        await _no_sideways_scroll(page)

        await page.click("text=team/chat")  # a route name with '/', one model
        await page.wait_for_load_state("networkidle")
        assert "team/chat" in await page.inner_text("h1")

        await page.goto(f"{console.url}/ui/routes/summarize?model=m1&range=24h")
        charts = page.locator("figure.chart > svg")  # the plots, not the legend's line samples
        assert await charts.count() == 3  # the threshold, the hedge rate, the failed calls
        for index in range(3):
            paths = charts.nth(index).locator("path.series")
            assert await paths.count() >= 1
            d = await paths.first.get_attribute("d")
            assert d and d.count("H") + d.count("L") >= 2, d  # a line with several points
        history = page.locator("table.history tbody tr")
        assert await history.count() >= 3
        assert "held" in await page.inner_text("table.history") and "yes" in await page.inner_text("table.history")
        assert await page.locator("form.change").count() == 0  # read scope: no change form
        await _no_sideways_scroll(page)

        await page.select_option("select[name=applied]", "true")
        await page.click("form.filters button")
        await page.wait_for_load_state("networkidle")
        assert "applied=true" in page.url
        applied_cells = await page.locator("table.history td[data-label=applied]").all_inner_texts()
        assert applied_cells and set(applied_cells) == {"yes"}

        await page.goto(f"{console.url}/docs")
        await page.wait_for_selector(".opblock", timeout=30_000)  # Swagger UI drew the operations
        await _no_sideways_scroll(page)
        assert_local_only(requests)


async def test_the_change_form_changes_the_route_and_the_history_shows_it(console: ServeProcess) -> None:
    async with open_page(viewport=(1280, 800)) as (page, requests):
        await _login(page, console.url, "adm1n-token", "/ui/routes/summarize?model=m1")
        await page.fill("input[name=budget]", "0.2")
        await page.fill("input[name=pinned_hedge_after_s]", "3.5")
        await page.click("form.change button[type=submit]")
        await page.wait_for_load_state("networkidle")
        assert "Changed: budget,pinned_hedge_after_s" in await page.inner_text("main")
        first = page.locator("table.history tbody tr").first
        assert "config" in await first.locator("td[data-label=reason]").inner_text()
        assert await first.locator("td[data-label=actor]").inner_text() == "ops"  # the token's name
        assert await first.locator("td[data-label=to]").inner_text() == "3.5 s"

        await page.fill("input[name=pinned_hedge_after_s]", "100")  # above max 30 s: refused, named
        await page.click("form.change button[type=submit]")
        await page.wait_for_load_state("networkidle")
        assert "pinned_hedge_after_s" in await page.inner_text("p.notice.error")
        # the answer opens at the form (its action ends in #change), so the notice is in view
        assert await page.locator("p.notice.error").is_visible()
        box = await page.locator("p.notice.error").bounding_box()
        assert box is not None and 0 <= box["y"] < 800, box
        assert_local_only(requests)

    headers = {"Authorization": "Bearer r3ad-token"}
    route = httpx.get(f"{console.url}/v1/routes/summarize", params={"model": "m1"}, headers=headers).json()
    assert route["budget"] == 0.2 and route["pinned_hedge_after_s"] == 3.5
    assert route["threshold"]["hedge_after_s"] == 3.5 and route["threshold"]["source"] == "pinned"


def test_pages_refuse_without_a_good_token(console: ServeProcess) -> None:
    with httpx.Client(base_url=console.url) as client:
        assert client.get("/ui/routes").status_code == 303  # to the login page
        bad = client.post("/ui/login", data={"token": "nope", "next": "/ui/routes"})
        assert bad.status_code == 401
        login = client.post("/ui/login", data={"token": "r3ad-token", "next": "//evil.example/"})
        assert login.status_code == 303 and login.headers["location"] == "/ui/routes"  # no open redirect
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert client.get("/ui/routes").status_code == 200
        denied = client.post("/ui/routes/summarize?model=m1", data={"budget": "0.3"})
        assert denied.status_code == 403  # read scope cannot change a route
        # the console's Metrics link: the login cookie (path /ui) authorizes /ui/metrics
        metrics = client.get("/ui/metrics")
        assert metrics.status_code == 200 and "hedgerow_hedge_after_seconds" in metrics.text
        assert client.get("/metrics").status_code == 401  # a scraper still needs its bearer token
    with httpx.Client(base_url=console.url) as anonymous:
        assert anonymous.get("/ui/metrics").status_code == 303  # to the login page


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=lambda v: f"{v[0]}x{v[1]}")
async def test_the_reports_page_lists_weeks_and_shows_a_week_with_its_plots(
    console: ServeProcess, viewport: tuple[int, int]
) -> None:
    async with open_page(viewport=viewport) as (page, requests):
        await _login(page, console.url, "r3ad-token", "/ui/reports")
        weeks = page.locator("table.reports tbody tr")
        assert await weeks.count() >= 1
        first = weeks.first
        assert "partial" in await first.inner_text()  # the seeded hours end now: this week
        await _no_sideways_scroll(page)
        await first.locator("td[data-label='ISO week'] a").click()
        await page.wait_for_load_state("networkidle")
        assert "Week " in await page.inner_text("h1")
        frame = page.frame_locator("iframe.report")
        plots = frame.locator("svg")
        await plots.first.wait_for(timeout=30_000)
        assert await plots.count() >= 3  # per route: daily P50/P99, hedge rate, threshold steps
        assert "summarize" in await frame.locator("body").inner_text()
        await _no_sideways_scroll(page)
        assert_local_only(requests)

        # the downloads use the page's cookie, not a bearer token
        week = page.url.rsplit("/", 1)[-1]
        cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with httpx.AsyncClient(base_url=console.url, cookies=cookies) as http:
        csv_text = (await http.get(f"/ui/reports/{week}/report.csv")).text
        import csv
        import io

        rows = list(csv.DictReader(io.StringIO(csv_text)))
        assert rows and {r["route"] for r in rows} >= {"summarize", "team/chat"}
        assert (await http.get("/ui/reports/not-a-week")).status_code == 422
        assert (await http.get(f"/ui/reports/{week}/report.exe")).status_code == 404
    async with httpx.AsyncClient(base_url=console.url) as anonymous:
        assert (await anonymous.get(f"/ui/reports/{week}/report.json")).status_code == 303  # login first


@pytest.mark.parametrize("viewport", [(1280, 800), (1024, 768)], ids=lambda v: f"{v[0]}x{v[1]}")
async def test_no_table_column_hides_behind_a_sideways_scroll_on_a_desktop(
    console: ServeProcess, viewport: tuple[int, int]
) -> None:
    """At 1280 px the routes table's "last change" and the history's "actor" columns were cut off
    inside the table's scroll box (46 and 64 px; 260 px at 1024), with nothing showing there was
    more. Tables now fit a desktop window and turn into stacked cards below 1180 px."""
    async with open_page(viewport=viewport) as (page, requests):
        await _login(page, console.url, "r3ad-token", "/ui/routes")
        for path in ("/ui/routes", "/ui/routes/summarize?model=m1&range=24h"):
            await page.goto(f"{console.url}{path}")
            hidden = await page.evaluate(
                "[...document.querySelectorAll('.scroll')].map(e => e.scrollWidth - e.clientWidth)"
            )
            assert hidden and max(hidden) <= 0, (path, hidden)
            await _no_sideways_scroll(page)
        assert_local_only(requests)


async def test_a_history_page_past_the_store_s_integers_is_a_422_not_a_500(console: ServeProcess) -> None:
    """``?page=99999999999999999999`` on a route's page answered 500 (the offset overflowed
    SQLite's integer); now the page says which pages exist."""
    async with open_page(viewport=(1280, 800)) as (page, requests):
        await _login(page, console.url, "r3ad-token", "/ui/routes/summarize?model=m1")
        answer = await page.goto(f"{console.url}/ui/routes/summarize?model=m1&page=99999999999999999999")
        assert answer is not None and answer.status == 422
        assert "page: must be from 1 to 1000000" in await page.inner_text("main")
        last = await page.goto(f"{console.url}/ui/routes/summarize?model=m1&page=1000000")
        assert last is not None and last.status == 200  # the last page there is: empty, not an error
        assert_local_only(requests)
