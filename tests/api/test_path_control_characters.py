"""A control character in a URL path (a newline above all) is a 422 naming the parameter it is in.

A newline matched no route (Starlette's ``.`` skips it: a plain JSON 404, on the console too) and a
final one was dropped (``$`` matches before it: ``/v1/routes/r%0A`` answered for route ``r``).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hedgerow.api.path_check import PATH_PARAMETERS, path_problem
from tests.api.conftest import MakeApi
from tests.browser import open_page
from tests.serve_process import ServeProcess

M = {"model": "m1"}
CONTROL = "must not contain control characters (U+0000-U+001F, U+007F)"


@pytest.mark.parametrize(
    ("method", "url", "field", "index"),
    [
        ("GET", "/v1/routes/a%0Ab", "route", 1),
        ("GET", "/v1/routes/r%0A", "route", 1),  # a final newline: not route "r"
        ("GET", "/v1/routes/team/a%0Ab/history", "route", 6),
        ("GET", "/v1/routes/r/history%0A", "route", 9),
        ("PUT", "/v1/routes/a%0Ab", "route", 1),
        ("PATCH", "/v1/routes/r%0D%0A", "route", 1),
        ("GET", "/v1/thresholds/a%0Ab", "route", 1),
        ("GET", "/v1/thresholds/r%0A", "route", 1),
        ("GET", "/v1/routes/a%09b", "route", 1),
        ("GET", "/v1/prices/m%0A", "model", 1),
        ("GET", "/v1/routes%0A", "path", 10),
        ("GET", "/healthz%0A", "path", 8),
    ],
)
async def test_a_control_character_in_an_api_path_is_a_field_error(
    make_api: MakeApi, method: str, url: str, field: str, index: int
) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        response = await api.request(method, url, params=M, json={} if method in ("PUT", "PATCH") else None)
        assert response.status_code == 422, response.text
        detail = response.json()["detail"]
        assert detail["field"] == field, detail
        assert detail["message"].startswith(CONTROL) and f"at index {index}" in detail["message"], detail
        # nothing was created or changed under a name with the character dropped
        assert [r["route"] for r in (await api.get("/v1/routes")).json()["routes"]] == ["r"]


async def test_the_answer_does_not_need_a_token_and_reveals_nothing_but_the_url(make_api: MakeApi) -> None:
    async with make_api(tokens="reader=" + "r" * 16 + ":read") as (_app, api):
        response = await api.get("/v1/routes/a%0Ab", params=M)
        assert response.status_code == 422 and response.json()["detail"]["field"] == "route"
        assert (await api.get("/v1/routes/ab", params=M)).status_code == 401


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("/ui/routes/a%0Ab?model=m1", "route: " + CONTROL + ": U+000A at index 1"),
        ("/ui/routes/r%0A?model=m1", "route: " + CONTROL + ": U+000A at index 1"),
        ("/ui/routes/r?model=m%0A1", "model: " + CONTROL + ": U+000A at index 1"),
        ("/ui/reports/2026-W48%0A", "week: " + CONTROL + ": U+000A at index 8"),
    ],
)
async def test_a_control_character_in_a_console_path_is_its_html_error_page(
    make_api: MakeApi, url: str, named: str
) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        response = await api.get(url)
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("text/html")
        assert '<p class="notice error">' + named + "</p>" in response.text
        posted = await api.post(url, data={"budget": "5%"}, headers={"origin": "http://hedgerow.test"})
        assert posted.status_code == 422 and posted.headers["content-type"].startswith("text/html")


def test_path_problem_names_each_parameter_and_counts_the_index_in_it() -> None:
    assert path_problem("/v1/routes/ok") is None
    for prefix, field in PATH_PARAMETERS:
        assert path_problem(prefix + "ab\ncd") == (field, CONTROL + ": U+000A at index 2")
    assert path_problem("/other\x7f") == ("path", CONTROL + ": U+007F at index 6")


@pytest.mark.slow
async def test_the_console_shows_its_error_page_for_a_newline_in_a_browser(tmp_path: Path) -> None:
    server = ServeProcess(f"sqlite:///{tmp_path / 'c.db'}", tmp_path, {"HEDGEROW_CONTROLLER_INTERVAL_S": "3600"})
    try:
        made = httpx.put(f"{server.url}/v1/routes/r", params=M, json={}, timeout=60)
        assert made.status_code == 201, made.text
        async with open_page() as (page, _requests):
            response = await page.goto(f"{server.url}/ui/routes/r%0Ax?model=m1")
            assert response is not None and response.status == 422
            heading = await page.inner_text("h1")
            notice = await page.inner_text("p.notice.error")
            back = await page.get_attribute("main a[href='/ui/routes'], a[href='/ui/routes']", "href")
    finally:
        server.stop()
    assert heading == "Error"
    assert notice == "route: " + CONTROL + ": U+000A at index 1"
    assert back == "/ui/routes"
