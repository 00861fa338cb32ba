"""Failed calls on the console and the api: the routes list's ``failed (1 h)`` column (console and
``GET /v1/routes``) and the route page's failed-call chart, each linking to the failed calls.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import httpx

from tests.controller.calls_seed import explorer_records

M = {"model": "m1"}


async def _seed(api: httpx.AsyncClient, count: int) -> datetime:
    """``count`` calls one a minute back from a minute ago, every fifth one failed (a timeout)."""
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    records = [r.to_dict() for r in explorer_records(end, count)]
    answer = await api.post("/v1/calls", json={"calls": records})
    assert answer.status_code == 202, answer.text
    return end


async def test_the_routes_list_counts_failed_calls_and_links_to_them(api: httpx.AsyncClient) -> None:
    await _seed(api, 50)  # 50 minutes of calls: all in the last hour, 10 failed
    body = (await api.get("/v1/routes")).json()
    [route] = body["routes"]
    assert (route["recent_calls"], route["recent_failed_calls"]) == (50, 10)
    assert body["recent_since"] < body["recent_until"]
    archived = (await api.get("/v1/routes", params={"archived": "true"})).json()
    assert archived == {"routes": [], "recent_since": None, "recent_until": None}

    page = (await api.get("/ui/routes")).text
    assert '<th class="num">failed (1 h)</th>' in page
    [href] = [unescape(h) for h in re.findall(r'<a class="failed-calls" href="([^"]+)"', page)]
    assert href.startswith("/ui/calls/r?model=m1&outcome=failed&since=") and "&until=" in href
    assert '20.0% <span class="muted">(10)</span>' in page
    failed = await api.get(href)
    assert failed.status_code == 200 and failed.text.count('<details class="call o-failed') == 10


async def test_a_route_without_failures_shows_a_rate_without_a_link(api: httpx.AsyncClient) -> None:
    await _seed(api, 3)  # primary_won, hedge_won, failover: none failed
    page = (await api.get("/ui/routes")).text
    assert 'class="failed-calls"' not in page and 'data-label="failed (1 h)" class="num ">0.0%' in page


async def test_the_route_page_charts_the_failed_call_rate_with_links(api: httpx.AsyncClient) -> None:
    await _seed(api, 100)
    page = (await api.get("/ui/routes/r", params=M)).text
    assert "Failed calls: the share of calls that failed entirely, per 1 h" in page
    assert '<path class="series s-failed"' in page
    dots = [unescape(h) for h in re.findall(r'<a class="point-link s-failed" href="([^"]+)"', page)]
    assert 2 <= len(dots) <= 3  # the hours the 100 minutes of calls cover, each with failures
    total = 0
    for href in dots:
        assert "outcome=failed" in href
        since = datetime.fromisoformat(re.findall(r"since=([^&]+)", href)[0].replace("%3A", ":"))
        until = datetime.fromisoformat(re.findall(r"until=([^&]+)", href)[0].replace("%3A", ":"))
        assert timedelta(0) < until - since <= timedelta(hours=1)  # one slot, not the range
        calls = (await api.get(href)).text
        assert "o-primary_won" not in calls
        total += calls.count('<details class="call o-failed')
    assert total == 20  # every failed call is behind one dot
