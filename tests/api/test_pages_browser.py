"""The route page's charts in a real headless Chromium: their labels are readable at desktop and
phone widths."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.browser import assert_local_only, open_page
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
