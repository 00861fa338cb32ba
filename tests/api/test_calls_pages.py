"""The console's calls explorer (``/ui/calls/{route}``) and the route page's links to it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape

import httpx
import pytest

from tests.api.conftest import MakeApi
from tests.controller.calls_seed import explorer_records, record_of, with_clients

M = {"model": "m1"}


async def _seed(api: httpx.AsyncClient, count: int, **where: str) -> datetime:
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    records = [r.to_dict() for r in explorer_records(end, count, **where)]
    answer = await api.post("/v1/calls", json={"calls": records})
    assert answer.status_code == 202, answer.text
    return end


def _hrefs(html: str, pattern: str) -> list[str]:
    return [unescape(h) for h in re.findall(r'href="([^"]+)"', html) if re.search(pattern, unescape(h))]


async def test_the_page_lists_calls_with_their_attempts_and_pages_on(api: httpx.AsyncClient) -> None:
    await _seed(api, 60)
    first = await api.get("/ui/calls/r", params=M)
    assert first.status_code == 200, first.text
    assert first.text.count('<details class="call') == 50
    assert "hedge won" in first.text and "failover" in first.text
    assert "http_503" in first.text and "(censored)" in first.text  # inside the attempts
    assert "Attempts on this page, by upstream" in first.text
    [older] = _hrefs(first.text, r"cursor=")
    second = await api.get(older)
    assert second.status_code == 200 and second.text.count('<details class="call') == 10
    assert "↑ newest" in second.text and not _hrefs(second.text, r"cursor=")


async def test_filters_narrow_the_list(api: httpx.AsyncClient) -> None:
    end = await _seed(api, 20)
    since = (end - timedelta(minutes=9)).strftime("%Y-%m-%dT%H:%M:%S")  # as a datetime-local input sends it
    page = await api.get("/ui/calls/r", params=M | {"outcome": "failover", "winner": "c", "since": since})
    assert page.status_code == 200
    assert page.text.count('<details class="call') == 2
    assert 'value="failover" selected' in page.text and f'value="{since}"' in page.text
    assert "Calls started from" in page.text


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"outcome": "won"}, "outcome: unknown outcome &#39;won&#39;"),
        ({"since": "soon"}, "since: not a time"),
        ({"until": "0001-01-01T00:00:00+05:00"}, "until: out of range"),
        ({"since": "2026-12-02T00:00", "until": "2026-12-01T00:00"}, "since: must not be after until"),
        ({"cursor": "junk"}, "cursor: not a cursor"),
        ({"client": "c" * 201}, "client: at most 200 characters, got 201"),
        ({"upstream": "u" * 300}, "upstream: at most 200 characters, got 300"),
    ],
)
async def test_bad_filters_are_a_422_page_naming_them(
    api: httpx.AsyncClient, params: dict[str, str], words: str
) -> None:
    await _seed(api, 1)
    page = await api.get("/ui/calls/r", params=M | params)
    assert page.status_code == 422 and words in page.text, page.text[-800:]


async def test_unknown_route_404_and_a_route_of_several_models_asks_for_one(api: httpx.AsyncClient) -> None:
    await _seed(api, 1)
    await _seed(api, 1, model="m2")
    assert (await api.get("/ui/calls/nope")).status_code == 404
    pick = await api.get("/ui/calls/r", params={"outcome": "failed"})
    assert pick.status_code == 200 and _hrefs(pick.text, r"^/ui/calls/r\?.*model=m2.*outcome=failed")


async def test_a_window_older_than_retention_says_so(make_api: MakeApi) -> None:
    async with make_api(retention_s=86_400.0, max_window_s=3600.0) as (_app, api):
        await _seed(api, 1)
        old = (datetime.now(UTC) - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
        page = await api.get("/ui/calls/r", params=M | {"since": old})
        assert 'id="retention-note"' in page.text and "Raw calls are kept 1 days" in page.text


async def test_stored_names_are_escaped(api: httpx.AsyncClient) -> None:
    await _seed(api, 1, route="<b>r</b>")
    page = await api.get("/ui/calls/%3Cb%3Er%3C%2Fb%3E", params=M)
    assert page.status_code == 200 and "&lt;b&gt;r&lt;/b&gt;" in page.text and "<b>r</b>" not in page.text


async def test_history_rows_and_chart_points_link_to_the_calls_of_their_tick(make_api: MakeApi) -> None:
    async with make_api(min_samples=20) as (_app, api):
        end = await _seed(api, 100)
        fast = [record_of("primary_won", f"f{i}", end - timedelta(seconds=20 * i + 7)).to_dict() for i in range(150)]
        assert (await api.post("/v1/calls", json={"calls": fast})).status_code == 202  # a P99 the tick can estimate
        assert (await api.post("/v1/controller/run")).json()["ran"] is True
        page = await api.get("/ui/routes/r", params=M)
        assert page.status_code == 200
        row_links = _hrefs(page.text, r"^/ui/calls/r\?")
        assert row_links, "no link from the history rows or the charts"
        dots = re.findall(r'<a class="point-link s-(p99|p90|rate)" href="([^"]+)"', page.text)
        assert {kind for kind, _ in dots} == {"p90", "rate"}, dots  # the censored hedges leave P99 unknown
        [row] = (await api.get("/v1/routes/r/history", params=M)).json()["history"]
        computed = datetime.fromisoformat(row["computed_at"].replace("Z", "+00:00"))
        # a history row links to its tick's whole window: from computed_at - window_s to last_at
        tick_since = computed - timedelta(seconds=row["window_s"])
        assert any(f"since={tick_since:%Y-%m-%dT%H%%3A%M%%3A%S}&" in h for h in row_links), row_links
        assert tick_since <= end - timedelta(minutes=50)
        # a dot links to the calls just before it, not the tick's hour: the span one dot stands for
        # on the chart (a new route's chart is fitted to 10 min: 5 s), at least the short window
        target = unescape(dots[0][1])
        since = computed - timedelta(seconds=300)
        assert f"since={since:%Y-%m-%dT%H%%3A%M%%3A%S}&" in target, target
        assert f"until={computed:%Y-%m-%dT%H%%3A%M%%3A%S}" in target, target
        calls = await api.get(target)
        shown = calls.text.count('<details class="call')
        assert calls.status_code == 200 and 5 <= shown <= 25, shown  # 5 of the 100 a minute, 15 fast ones


async def test_the_route_page_links_to_its_recent_calls(api: httpx.AsyncClient) -> None:
    await _seed(api, 3)
    page = await api.get("/ui/routes/r", params=M)
    [link] = re.findall(r'href="([^"]+)" id="recent-calls"', page.text)
    assert unescape(link) == "/ui/calls/r?model=m1"
    assert (await api.get(unescape(link))).text.count('<details class="call') == 3


async def test_upstream_filters_are_selects_and_empty_filters_leave_the_url(api: httpx.AsyncClient) -> None:
    await _seed(api, 20)
    # a form left at "any" sends winner= and the like: redirected to the URL without them
    sent = await api.get("/ui/calls/r", params=M | {"outcome": "", "winner": "", "failed_upstream": "a", "since": ""})
    assert sent.status_code == 303 and sent.headers["location"] == "/ui/calls/r?model=m1&failed_upstream=a"
    page = await api.get(sent.headers["location"])
    assert page.status_code == 200 and page.text.count('<details class="call') == 8
    form = page.text[page.text.index('<form method="get"') : page.text.index("</form>")]
    assert '<select name="failed_upstream">' in form and '<select name="winner">' in form
    assert '<option value="a" selected>a</option>' in form and '<option value="c" >c</option>' in form
    hrefs = _hrefs(page.text, r"\?")
    assert hrefs and not any(re.search(r"[?&][a-z_]+=(&|$)", h) for h in hrefs)  # no empty parameter


async def test_the_route_pages_history_filter_left_at_any_leaves_the_url(api: httpx.AsyncClient) -> None:
    """The route page's history form sends ``applied=&since=&until=`` when left at "any": a 303 to the
    same page without them, the set filters kept in their order."""
    await _seed(api, 3)
    query = M | {"range": "24h", "applied": "", "reason": "hysteresis_hold", "since": "", "until": ""}
    sent = await api.get("/ui/routes/r", params=query)
    assert sent.status_code == 303
    assert sent.headers["location"] == "/ui/routes/r?model=m1&range=24h&reason=hysteresis_hold"
    assert (await api.get(sent.headers["location"])).status_code == 200


async def test_the_client_filter_is_a_field_and_each_calls_client_links_to_its_calls(api: httpx.AsyncClient) -> None:
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    records = with_clients(explorer_records(end, 10), ["alice", None, None, None, None, "<b>bob</b>"])
    assert (await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records]})).status_code == 202
    page = await api.get("/ui/calls/r", params=M | {"outcome": "primary_won"})  # c0000 alice, c0005 <b>bob</b>
    assert page.status_code == 200 and page.text.count('<details class="call') == 2
    form = page.text[page.text.index('<form method="get"') : page.text.index("</form>")]
    assert '<input type="text" name="client" maxlength="200" value=""' in form
    assert '<option value="&lt;b&gt;bob&lt;/b&gt;">' in page.text and "<b>bob</b>" not in page.text  # escaped
    links = _hrefs(page.text, r"client=")
    assert links == ["/ui/calls/r?model=m1&outcome=primary_won&client=alice",
                     "/ui/calls/r?model=m1&outcome=primary_won&client=%3Cb%3Ebob%3C%2Fb%3E"]  # fmt: skip
    mine = await api.get("/ui/calls/r", params=M | {"client": "alice"})
    assert mine.status_code == 200 and mine.text.count('<details class="call') == 2  # c0000, c0006
    assert 'name="client" maxlength="200" value="alice"' in mine.text
    assert (await api.get("/ui/calls/r", params=M | {"client": "nobody"})).text.count('<details class="call') == 0
    cancelled = await api.get("/ui/calls/r", params=M | {"outcome": "cancelled"})  # c0004, c0009: no client
    assert cancelled.text.count('<details class="call') == 2 and not _hrefs(cancelled.text, r"client=")
    left_empty = await api.get("/ui/calls/r", params=M | {"client": ""})
    assert left_empty.status_code == 303 and left_empty.headers["location"] == "/ui/calls/r?model=m1"
    bad = await api.get("/ui/calls/r", params=M | {"client": "a\x07b"})
    assert bad.status_code == 422 and "client: must not contain control characters" in bad.text
