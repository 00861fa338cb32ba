"""Weekly reports are built once per week and format for ``report_cache_ttl_s``, one at a time.

A report's HTML form costs seconds of CPU (charts); without a cache every request with a read
token paid it again. Counted here by wrapping the store read and the HTML renderer that the api
and the console both reach.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hedgerow.api._report_cache import ReportCache
from hedgerow.controller.report import report_render, report_store
from tests.api.conftest import MakeApi
from tests.controller.report_store_helpers import fill_store


def count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Wrap ``module.name`` so that each call appends to the returned list."""
    calls: list[int] = []
    original = getattr(module, name)

    if asyncio.iscoroutinefunction(original):

        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return await original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped_async)
    else:

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapped)
    return calls


async def test_a_burst_of_report_requests_builds_each_answer_once(
    make_api: MakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = count_calls(monkeypatch, report_store, "load_week_data")
    draws = count_calls(monkeypatch, report_render, "to_html")
    async with make_api() as (app, api):
        await fill_store(app.state.sessionmaker, per_route=60)
        params = {"week": "2026-W48", "format": "html"}
        burst = await asyncio.gather(*(api.get("/v1/reports/weekly", params=params) for _ in range(6)))
        later = [await api.get("/v1/reports/weekly", params=params) for _ in range(2)]
        console = await api.get("/ui/reports/2026-W48/report.html")
        as_json = await api.get("/v1/reports/weekly", params={"week": "2026-W48"})
        answers = [*burst, *later, console]
        assert {a.status_code for a in answers} == {200} and as_json.status_code == 200
        assert len({a.text for a in answers}) == 1 and "2026-W48" in console.text
        assert as_json.json()["total"]["calls"] == 122
        assert (len(loads), len(draws)) == (1, 1)
        # another week is another answer
        assert (await api.get("/v1/reports/weekly", params={"week": "2026-W47"})).status_code == 200
        assert len(loads) == 2


async def test_with_a_ttl_of_zero_every_request_builds(make_api: MakeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    draws = count_calls(monkeypatch, report_render, "to_html")
    async with make_api(report_cache_ttl_s=0) as (app, api):
        await fill_store(app.state.sessionmaker, per_route=20)
        for _ in range(2):
            answer = await api.get("/v1/reports/weekly", params={"week": "2026-W48", "format": "html"})
            assert answer.status_code == 200
    assert len(draws) == 2


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


async def test_the_cache_expires_shares_builds_and_keeps_no_failure() -> None:
    clock = FakeClock()
    cache = ReportCache(ttl_s=300, clock=clock)
    started = asyncio.Event()
    release = asyncio.Event()
    builds: list[str] = []

    async def build() -> str:
        builds.append("x")
        started.set()
        await release.wait()
        return f"report {len(builds)}"

    first = asyncio.create_task(cache.get("2026-W48", "md", build))
    await started.wait()
    others = [asyncio.create_task(cache.get("2026-W48", "md", build)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    assert {await first, *[await t for t in others]} == {"report 1"} and len(builds) == 1
    clock.now_s = 299.0
    assert await cache.get("2026-W48", "md", build) == "report 1"
    clock.now_s = 301.0
    assert await cache.get("2026-W48", "md", build) == "report 2"

    async def broken() -> str:
        raise RuntimeError("store down")

    with pytest.raises(RuntimeError, match="store down"):
        await cache.get("2026-W47", "md", broken)
    assert await cache.get("2026-W47", "md", build) == "report 3"  # the failure was not kept


async def test_a_waiter_builds_when_the_request_building_goes_away() -> None:
    cache = ReportCache(ttl_s=300)
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    async def quick() -> str:
        return "built by the waiter"

    builder = asyncio.create_task(cache.get("2026-W48", "csv", slow))
    await started.wait()
    waiter = asyncio.create_task(cache.get("2026-W48", "csv", quick))
    await asyncio.sleep(0)
    builder.cancel()
    assert await asyncio.wait_for(waiter, 5) == "built by the waiter"
    with pytest.raises(asyncio.CancelledError):
        await builder


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        ReportCache(ttl_s=-1)
    with pytest.raises(ValueError, match="max_entries"):
        ReportCache(ttl_s=1, max_entries=0)
