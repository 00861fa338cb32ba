"""The console's Upstreams page (``/ui/upstreams``): the table, its filters, escaping, and the
links to it (the nav bar, the route page).

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from hedgerow.client.records import AttemptRecord, CallRecord
from tests.api.conftest import MakeApi


def _calls(now: datetime) -> list[dict[str, Any]]:
    out = []
    for i in range(6):
        atts: tuple[AttemptRecord, ...] = (
            AttemptRecord("<b>slow</b>", "primary", 0.0, None, 0.7, "cancelled", 200, None, 0),
            AttemptRecord("fast", "backup", 0.5, 0.7, 1.5, "won", 200, None, 20),
        )
        out.append(CallRecord(f"h{i}", "team/chat", "m1", now - timedelta(minutes=5), hedged=True,
                              hedge_reason="ttft_timeout", winner="backup", ttft_s=0.7, attempts=atts))  # fmt: skip
    atts = (
        AttemptRecord("<b>slow</b>", "primary", 0.0, None, 0.1, "failed", 503, "http_503", 0),
        AttemptRecord("fast", "backup", 0.1, 0.4, 1.0, "won", 200, None, 20),
    )
    out.append(CallRecord("f1", "team/chat", "m1", now - timedelta(minutes=5), hedged=True,
                          hedge_reason="primary_error", winner="backup", ttft_s=0.4, attempts=atts))  # fmt: skip
    atts = (AttemptRecord("other-up", "primary", 0.0, 0.2, 1.0, "won", 200, None, 5),)
    out.append(CallRecord("o1", "other", "m1", now - timedelta(hours=3), winner="primary", ttft_s=0.2, attempts=atts))
    return [r.to_dict() for r in out]


async def test_the_page_shows_the_table_escaped_and_filtered(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": _calls(datetime.now(UTC))})).status_code == 202
        page = await api.get("/ui/upstreams")
        assert page.status_code == 200
        html = page.text
        assert '<a href="/ui/upstreams">Upstreams</a>' in html  # the nav link
        assert "&lt;b&gt;slow&lt;/b&gt;" in html and "<b>slow</b>" not in html
        assert "fast" in html and "other-up" in html
        assert 'data-label="hedges caused" class="num">6' in html
        assert html.count("+ 1 failover<") == 1  # the slow primary's, as the api's failovers_caused
        # each row links to its upstream's calls in each route it served, and to those it failed
        links = [h.replace("&amp;", "&") for h in re.findall(r'href="(/ui/calls/[^"]+)"', html)]
        slow = [h for h in links if "%3Cb%3Eslow%3C%2Fb%3E" in h]
        assert len(slow) == 2 and slow[0].startswith("/ui/calls/team%2Fchat?model=m1&upstream=")
        assert "failed_upstream=%3Cb%3Eslow%3C%2Fb%3E" in slow[1] and "since=" in slow[0]
        assert any(h.startswith("/ui/calls/other?model=m1&upstream=other-up") for h in links)
        assert 'title="its calls in team/chat · m1"' in html
        failed = await api.get(slow[1])
        assert failed.status_code == 200 and failed.text.count('<details class="call') == 1  # f1
        one = (await api.get("/ui/upstreams", params={"route": "team/chat", "range": "1h"})).text
        assert "other-up" not in one and "fast" in one and 'aria-current="true" class="on">1h' in one
        assert "/ui/routes/team%2Fchat" in one  # back to the route
        recent = (await api.get("/ui/upstreams", params={"range": "1h"})).text
        assert "other-up" not in recent and 'id="coverage-note"' not in recent
        unknown = await api.get("/ui/upstreams", params={"route": "nobody"})
        assert unknown.status_code == 404 and "unknown route &#39;nobody&#39;" in unknown.text
        empty = (await api.get("/ui/upstreams", params={"route": "other", "range": "1h"})).text
        assert 'id="no-upstreams"' in empty and "No attempt in this window" in empty
        route_page = (await api.get("/ui/routes/team/chat", params={"model": "m1"})).text
        assert 'href="/ui/upstreams?route=team%2Fchat"' in route_page


async def test_bad_parameters_are_422_pages_naming_them(api: httpx.AsyncClient) -> None:
    bad_range = await api.get("/ui/upstreams", params={"range": "2d"})
    assert bad_range.status_code == 422 and "range: must be one of" in bad_range.text
    bad_route = await api.get("/ui/upstreams", params={"route": "a\x07b"})
    assert bad_route.status_code == 422 and "route: must not contain control characters" in bad_route.text


async def test_needs_a_login_with_tokens(make_api: MakeApi) -> None:
    async with make_api(tokens="r3ad:read") as (_app, api):
        answer = await api.get("/ui/upstreams", follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next=%2Fui%2Fupstreams")


async def test_a_range_past_the_retention_says_so(make_api: MakeApi) -> None:
    async with make_api(retention_s=86_400.0) as (_app, api):
        assert 'id="coverage-note"' not in (await api.get("/ui/upstreams", params={"range": "24h"})).text
        week = (await api.get("/ui/upstreams", params={"range": "7d"})).text
        assert 'id="coverage-note"' in week and "HEDGEROW_RETENTION_S" in week
