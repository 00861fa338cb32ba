"""The route page's per-upstream P90 lines in a real headless Chromium: at 1280 and 390 px the
legend (long, escaped upstream names) and the lines fit without sideways scroll."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hedgerow.client.records import AttemptRecord, AttemptRole, CallRecord, HedgeReason
from hedgerow.controller.store.db import make_engine, make_sessionmaker, migrate_engine
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.browser import assert_local_only, open_page
from tests.serve_process import ServeProcess

A = AttemptRecord
#: Seven upstreams, the first six busier; long names, one with markup to escape.
NAMES = (
    "openai-compatible-gateway-europe-west-1-primary-pool",
    "anthropic<b>&co",
    "self-hosted-vllm-cluster-a",
    "self-hosted-vllm-cluster-b",
    "fallback.provider.example.internal:8443/v1",
    "slowpoke",
    "quiet",
)


async def _seed(url: str, now: datetime) -> None:
    """A day of calls: each upstream answers by itself at its own speed; "slowpoke" is hedged
    (cancelled before its first token) for a few afternoon hours, so its P90 there is a bound."""
    rng = random.Random(4)
    records: list[CallRecord] = []
    attempts: tuple[AttemptRecord, ...]
    reason: HedgeReason | None
    winner: AttemptRole
    # each hour's calls inside one UTC hour (the chart's 1 h slots start on the hour), so that
    # slowpoke's hedged hours fill their slots whatever the minute the test runs at
    top_of_hour = now.replace(minute=0, second=0, microsecond=0)
    for hour in range(24):
        for u, name in enumerate(NAMES):
            for i in range(3 if name == "quiet" else 14):
                at = top_of_hour - timedelta(hours=hour, seconds=rng.uniform(1, 3599))
                at = max(at, now - timedelta(hours=24) + timedelta(seconds=120))  # inside the 24 h range
                ttft = rng.lognormvariate(-1.6 + 0.25 * u, 0.5)
                rid = f"{hour}-{u}-{i}"
                if name == "slowpoke" and 3 <= hour < 6 and i >= 2:
                    attempts = (
                        A(name, "primary", 0.0, None, 0.9, "cancelled", 200, None, 0),
                        A(NAMES[0], "backup", 0.6, 0.9, 1.9, "won", 200, None, 10),
                    )
                    first, reason, winner = 0.9, "ttft_timeout", "backup"
                else:
                    attempts = (A(name, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 10),)
                    first, reason, winner = ttft, None, "primary"
                records.append(
                    CallRecord(
                        rid,
                        "chat",
                        "m1",
                        at,
                        hedged=len(attempts) > 1,
                        hedge_reason=reason,
                        winner=winner,
                        ttft_s=first,
                        prompt_tokens=10,
                        completion_tokens=10,
                        attempts=attempts,
                    )
                )
    engine = make_engine(url)
    try:
        await migrate_engine(engine)
        sessionmaker = make_sessionmaker(engine)
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records, defaults=route_defaults(Settings(database_url=url)))
    finally:
        await engine.dispose()


MEASURE = """() => {
    const figure = document.querySelector('figure.chart');
    const plot = figure.querySelector(':scope > svg');
    const svg = plot.getBoundingClientRect();
    const keys = [...figure.querySelectorAll('.key.upstream-key')];
    const lines = [...plot.querySelectorAll('path.series.s-up')];
    const bounds = [...plot.querySelectorAll('path.bound')];
    return {
        wide: document.scrollingElement.scrollWidth,
        figureRight: figure.getBoundingClientRect().right,
        keys: keys.map(k => ({text: k.textContent, right: k.getBoundingClientRect().right,
                              swatch: k.querySelector('svg').getBoundingClientRect().width})),
        lines: lines.map(l => { const b = l.getBoundingClientRect();
            return {left: b.left, right: b.right, top: b.top, bottom: b.bottom, colour: getComputedStyle(l).stroke,
                    dash: getComputedStyle(l).strokeDasharray}; }),
        bounds: bounds.length,
        svg: {left: svg.left, right: svg.right, top: svg.top, bottom: svg.bottom},
    };
}"""


@pytest.mark.slow
async def test_upstream_lines_and_legend_fit_at_desktop_and_phone_widths(tmp_path: Path) -> None:
    db = tmp_path / "lines.db"
    await _seed(f"sqlite+aiosqlite:///{db}", datetime.now(UTC))
    server = ServeProcess(f"sqlite+aiosqlite:///{db}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    found = {}
    try:
        for width, height in ((1280, 800), (390, 844)):
            async with open_page(viewport=(width, height)) as (page, requests):
                response = await page.goto(f"{server.url}/ui/routes/chat?model=m1&range=24h")
                assert response is not None and response.status == 200
                found[width] = await page.evaluate(MEASURE)
                await page.locator("figure.chart").first.screenshot(path=str(tmp_path / f"lines_{width}.png"))
                assert_local_only(requests)
    finally:
        server.stop()
    for width, seen in found.items():
        assert seen["wide"] <= width, (width, seen["wide"])
        texts = [k["text"] for k in seen["keys"]]
        # the first also answers slowpoke's hedges; the others tie, by name; "quiet" is the seventh
        assert texts == [f"{name} P90" for name in (NAMES[0], *sorted(NAMES[1:6]))], texts
        assert all(k["right"] <= seen["figureRight"] + 0.5 and k["swatch"] > 10 for k in seen["keys"]), seen
        assert len(seen["lines"]) == 6 and seen["bounds"] == 1, seen
        # six distinct colour and dash pairs, all inside the chart
        assert len({(line["colour"], line["dash"]) for line in seen["lines"]}) == 6, seen["lines"]
        box = seen["svg"]
        for line in seen["lines"]:
            assert box["left"] <= line["left"] and line["right"] <= box["right"] + 0.5, (width, line, box)
            assert box["top"] <= line["top"] and line["bottom"] <= box["bottom"] + 0.5, (width, line, box)
