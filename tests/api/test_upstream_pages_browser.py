"""The Upstreams page in a real headless Chromium at desktop and phone widths, reached from a
route's page in one click, against a real ``hedgerow serve`` fed over HTTP."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from hedgerow.client.records import AttemptRecord, CallRecord
from tests.browser import assert_local_only, open_page
from tests.serve_process import ServeProcess


def _records(n: int) -> list[dict[str, Any]]:
    rng = random.Random(2)
    now = datetime.now(UTC)
    names = ["us-east-primary-with-a-long-name", "eu-west", "ap-south"]
    out = []
    for i in range(n):
        at = now - timedelta(seconds=rng.uniform(5, 3000))
        primary, backup = rng.sample(names, 2)
        if i % 3 == 0:
            atts: tuple[AttemptRecord, ...] = (
                AttemptRecord(primary, "primary", 0.0, None, 0.8, "cancelled", 200, None, 0),
                AttemptRecord(backup, "backup", 0.5, 0.8, 1.8, "won", 200, None, 20),
            )
            out.append(CallRecord(f"h{i}", "chat", "m1", at, hedged=True, hedge_reason="ttft_timeout",
                                  winner="backup", ttft_s=0.8, attempts=atts))  # fmt: skip
        else:
            ttft = rng.uniform(0.1, 0.5)
            atts = (AttemptRecord(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 20),)
            out.append(CallRecord(f"p{i}", "chat", "m1", at, winner="primary", ttft_s=ttft, attempts=atts))
    return [r.to_dict() for r in out]


@pytest.mark.slow
async def test_the_upstreams_page_fits_desktop_and_phone_and_is_one_click_from_a_route(tmp_path: Path) -> None:
    server = ServeProcess(f"sqlite:///{tmp_path / 'u.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    measure = """() => ({wide: document.scrollingElement.scrollWidth,
        rows: [...document.querySelectorAll('table.upstreams tbody tr')].map(r => r.getBoundingClientRect().height),
        cells: [...document.querySelectorAll('table.upstreams td')].map(td => td.getBoundingClientRect().right),
        names: [...document.querySelectorAll('table.upstreams td[data-label=upstream]')].map(td => td.innerText)})"""
    found = {}
    try:
        posted = httpx.post(f"{server.url}/v1/calls", json={"calls": _records(300)}, timeout=60)
        assert posted.status_code == 202, posted.text
        for width, height in ((1280, 800), (390, 844)):
            async with open_page(viewport=(width, height)) as (page, requests):
                response = await page.goto(f"{server.url}/ui/routes/chat?model=m1")
                assert response is not None and response.status == 200
                await page.click("#upstreams-link a")
                await page.wait_for_load_state()
                assert page.url.endswith("/ui/upstreams?route=chat"), page.url
                found[width] = await page.evaluate(measure)
                await page.screenshot(path=str(tmp_path / f"upstreams_{width}.png"), full_page=True)
                assert_local_only(requests)
    finally:
        server.stop()
    for width, seen in found.items():
        assert sorted(seen["names"]) == ["ap-south", "eu-west", "us-east-primary-with-a-long-name"], seen
        assert seen["wide"] <= width, (width, seen["wide"])  # no sideways scroll
        assert max(seen["cells"]) <= width, (width, max(seen["cells"]))
    assert max(found[1280]["rows"]) < 60, found[1280]  # a table row per upstream on a desktop
