"""The HTML weekly report, served by a real ``hedgerow serve``, in a real headless Chromium.

Every plot must have rendered (an SVG with a real size and drawn paths), the page must have made
no request beyond 127.0.0.1 (the plots and styles are inline), and a full-page screenshot is
kept in the test's directory (``report.png``; ``HEDGEROW_SCREENSHOT_DIR`` copies it elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import update

from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.models import Route
from tests.browser import assert_local_only, open_page
from tests.controller.report_store_helpers import fill_store
from tests.serve_process import ServeProcess

#: One overhead plot, and three per route (latency, hedge rate, threshold) for two routes.
EXPECTED_PLOTS = 1 + 3 * 2


@contextlib.asynccontextmanager
async def _serving_a_filled_store(
    tmp_path: Path, per_route: int, *, long_route_name: bool = False
) -> AsyncIterator[ServeProcess]:
    """``hedgerow serve`` on a SQLite store filled with week 2026-W48 (``fill_store``); stopped at exit.

    ``long_route_name`` renames the route ``batch`` to a long name, as teams name routes.
    """
    url = f"sqlite+aiosqlite:///{tmp_path / 'report.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    try:
        sessionmaker = make_sessionmaker(engine)
        await fill_store(sessionmaker, per_route=per_route)
        if long_route_name:
            async with sessionmaker() as session, session.begin():
                await session.execute(
                    update(Route)
                    .where(Route.route == "batch")
                    .values(route="team-platform/summarize-long-documents-v2")
                )
    finally:
        await engine.dispose()
    server = ServeProcess(url, tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
async def test_html_report_renders_every_plot_and_stays_on_the_machine(tmp_path: Path) -> None:
    async with (
        _serving_a_filled_store(tmp_path, per_route=300) as server,
        open_page(viewport=(1280, 900)) as (page, requests),
    ):
        response = await page.goto(f"{server.url}/v1/reports/weekly?week=2026-W48&format=html")
        assert response is not None and response.status == 200
        assert "text/html" in response.headers["content-type"]
        plots = await page.eval_on_selector_all(
            "figure.plot",
            """figures => figures.map(f => {
                const svg = f.querySelector('svg');
                const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
                return {kind: f.dataset.plot, width: box.width, height: box.height,
                        paths: svg ? svg.querySelectorAll('path').length : 0};
            })""",
        )
        shot = tmp_path / "report.png"
        await page.screenshot(path=str(shot), full_page=True)
        text = await page.inner_text("body")
        assert_local_only(requests)
    if os.environ.get("HEDGEROW_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["HEDGEROW_SCREENSHOT_DIR"]) / "weekly_report.png")
    assert len(plots) == EXPECTED_PLOTS, plots
    for plot in plots:
        assert plot["width"] > 200 and plot["height"] > 100, plot
        assert plot["paths"] > 20, plot  # axes, ticks, glyphs and the data itself were drawn
    assert {p["kind"] for p in plots} == {"overhead", "latency", "hedge_rate", "threshold"}
    assert shot.stat().st_size > 50_000
    assert "hedgerow weekly report 2026-W48" in text
    assert "no price" in text  # the route without a price says so
    assert "backups_rarely_win" in text


@pytest.mark.slow
@pytest.mark.parametrize("viewport", [(1280, 800), (390, 844)])
async def test_the_report_page_scrolls_once_inside_its_frame(tmp_path: Path, viewport: tuple[int, int]) -> None:
    """``/ui/reports/<week>`` fills the window without scrolling and its frame takes the height
    left under the console's header: the report is the one thing that scrolls, and its end can be
    reached."""
    async with (
        _serving_a_filled_store(tmp_path, per_route=60) as server,
        open_page(viewport=viewport) as (page, requests),
    ):
        response = await page.goto(f"{server.url}/ui/reports/2026-W48")
        assert response is not None and response.status == 200
        frame = page.frame_locator("iframe.report")
        await frame.locator("h1").wait_for(timeout=60_000)
        sizes = await page.evaluate(
            """() => {
                const frame = document.querySelector('iframe.report');
                const inner = frame.contentDocument.scrollingElement;
                const box = frame.getBoundingClientRect();
                return {page: document.scrollingElement.scrollHeight, window: window.innerHeight,
                        frameTop: box.top, frameBottom: box.bottom,
                        report: inner.scrollHeight, shown: inner.clientHeight};
            }"""
        )
        await page.screenshot(path=str(tmp_path / "report_page.png"))
        assert_local_only(requests)
    assert sizes["page"] <= sizes["window"], sizes  # the page itself does not scroll
    assert sizes["frameBottom"] <= sizes["window"], sizes  # the frame's end (and its scrollbar's) is on screen
    assert sizes["frameBottom"] - sizes["frameTop"] > sizes["window"] / 2, sizes  # most of the window is report
    assert sizes["report"] > sizes["shown"], sizes  # the report is longer than its frame: it scrolls there


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1024])
async def test_report_tables_fit_the_window_without_a_sideways_scroll(tmp_path: Path, width: int) -> None:
    """The report's tables wrap their cells and split their columns over at least three tables:
    every table ends inside a 1280 or 1024 px window, opened on its own and inside the console's
    frame, with a long route name too."""
    measure = """doc => ({page: doc.scrollingElement.scrollWidth, shown: doc.scrollingElement.clientWidth,
                tables: [...doc.querySelectorAll('table')].map(t => t.getBoundingClientRect().right),
                body: doc.body.getBoundingClientRect().right})"""
    async with (
        _serving_a_filled_store(tmp_path, per_route=60, long_route_name=True) as server,
        open_page(viewport=(width, 900)) as (page, requests),
    ):
        response = await page.goto(f"{server.url}/v1/reports/weekly?week=2026-W48&format=html")
        assert response is not None and response.status == 200
        alone = await page.evaluate(f"({measure})(document)")
        await page.screenshot(path=str(tmp_path / f"report_{width}.png"), full_page=True)
        await page.goto(f"{server.url}/ui/reports/2026-W48")
        await page.frame_locator("iframe.report").locator("h1").wait_for(timeout=60_000)
        framed = await page.evaluate(f"({measure})(document.querySelector('iframe.report').contentDocument)")
        assert_local_only(requests)
    for sizes in (alone, framed):
        assert len(sizes["tables"]) >= 3, sizes
        assert sizes["page"] <= sizes["shown"], sizes  # no sideways scroll
        assert max(sizes["tables"]) <= sizes["body"] + 0.5, sizes
