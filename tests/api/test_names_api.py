"""The name rule at every entry of the api, and names stored before it shown safely.

Entries: ``POST /v1/calls`` (route and model of a record), ``PUT``/``PATCH /v1/routes/{route}``
(path and ``model``), ``GET /v1/thresholds/{route}`` (a client's poll) and the console's change
form. Each refuses a name of each bad class with a 422 naming the field and what is wrong. A route
stored before the rule (written here straight through the controller, as an old store holds it)
can still be listed and read, and the console escapes it.
"""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.settings import Settings
from tests.api.conftest import MakeApi
from tests.conftest import make_call

#: A name of each refused class that can travel in a URL path or query, and what the 422 says.
BAD = {
    "blank": ("   ", "must not be blank"),
    "leading space": (" chat", "start or end with whitespace"),
    "trailing space": ("chat ", "start or end with whitespace"),
    "C1 control": ("a\x85b", "U+0085"),
    "bidi override": ("a\u202eb", "U+202E"),
    "bidi isolate": ("a\u2067b", "U+2067"),
    "zero width": ("a\u200db", "U+200D"),
    "line separator": ("a\u2028b", "U+2028"),
    "paragraph separator": ("a\u2029b", "U+2029"),
    "too long": ("x" * 201, "200"),
}
#: More that a JSON body carries (a C0 control in a URL is refused before routing, elsewhere).
BAD_IN_BODY = BAD | {
    "empty": ("", "at least 1 character"),
    "newline": ("a\nb", "U+000A"),
}
M = {"model": "m1"}


def _path(name: str) -> str:
    return quote(name, safe="")


@pytest.mark.parametrize("field", ["route", "model"])
@pytest.mark.parametrize(("name", "said"), BAD_IN_BODY.values(), ids=list(BAD_IN_BODY))
async def test_ingest_refuses_each_bad_name_naming_the_field(
    api: httpx.AsyncClient, field: str, name: str, said: str
) -> None:
    record = make_call("c1").to_dict() | {field: name}
    answer = await api.post("/v1/calls", json={"calls": [make_call("c0").to_dict(), record]})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail["index"] == 1 and detail["field"] == field and said in detail["message"], detail


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
@pytest.mark.parametrize(("name", "said"), BAD.values(), ids=list(BAD))
async def test_route_changes_refuse_each_bad_route_and_model(
    api: httpx.AsyncClient, method: str, name: str, said: str
) -> None:
    body = {"budget": 0.05}
    answer = await api.request(method, f"/v1/routes/{_path(name)}", params=M, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]["field"] == "route" and said in answer.json()["detail"]["message"]
    answer = await api.request(method, "/v1/routes/chat", params={"model": name}, json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"]["field"] == "model" and said in answer.json()["detail"]["message"]


@pytest.mark.parametrize(("name", "said"), BAD.values(), ids=list(BAD))
async def test_threshold_polls_refuse_each_bad_route_and_model(api: httpx.AsyncClient, name: str, said: str) -> None:
    answer = await api.get(f"/v1/thresholds/{_path(name)}", params=M)
    assert answer.status_code == 422 and answer.json()["detail"]["field"] == "route", answer.text
    assert said in answer.json()["detail"]["message"]
    answer = await api.get("/v1/thresholds/chat", params={"model": name})
    assert answer.status_code == 422 and answer.json()["detail"]["field"] == "model", answer.text


@pytest.mark.parametrize(("name", "said"), BAD.values(), ids=list(BAD))
async def test_the_console_form_refuses_each_bad_route_and_model(api: httpx.AsyncClient, name: str, said: str) -> None:
    form = {"budget": "5%", "default_hedge_after_s": "2", "min_hedge_after_s": "0.05", "max_hedge_after_s": "30"}
    answer = await api.post(f"/ui/routes/{_path(name)}", params=M, data=form)
    assert answer.status_code == 422 and "route: " in answer.text and said in answer.text, answer.text[-500:]
    answer = await api.post("/ui/routes/chat", params={"model": name}, data=form)
    assert answer.status_code == 422 and "model: " in answer.text and said in answer.text


async def test_a_route_ending_in_history_is_refused_everywhere(api: httpx.AsyncClient) -> None:
    record = make_call("c1", route="a/history").to_dict()
    answer = await api.post("/v1/calls", json={"calls": [record]})
    assert answer.status_code == 422 and answer.json()["detail"]["field"] == "route"
    answer = await api.put("/v1/routes/a%2Fhistory", params=M, json={})
    assert answer.status_code in (405, 422)  # the history path itself is read-only: 405


#: Names an old store may hold: rich markup, a table pipe, a spreadsheet formula, a newline,
#: HTML, a trailing space, a bidi override.
LEGACY = ["[bold]r1[/]", "a[/x]", "p|ipe", '=HYPERLINK("x")', "new\nline", "<script>x</script>", "sp ", "a\u202eb"]


async def _store_legacy_routes(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """Write calls of the :data:`LEGACY` routes straight through the controller (no api rule)."""
    records = [make_call(f"legacy{i}", route=name, model=name) for i, name in enumerate(LEGACY)]
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))


async def test_routes_stored_before_the_rule_stay_readable(make_api: MakeApi) -> None:
    async with make_api() as (app, api):
        await _store_legacy_routes(app.state.sessionmaker)
        listed = (await api.get("/v1/routes")).json()["routes"]
        assert sorted(r["route"] for r in listed) == sorted(LEGACY)
        for name in ("sp ", "a\u202eb", "[bold]r1[/]"):
            one = await api.get(f"/v1/routes/{_path(name)}")
            assert one.status_code == 200 and one.json()["route"] == name, one.text
            history = await api.get(f"/v1/routes/{_path(name)}/history")
            assert history.status_code == 200, history.text


async def test_the_console_escapes_names_stored_before_the_rule(make_api: MakeApi) -> None:
    """Jinja autoescaping is on for the console's templates: the names are text, not markup.

    (A verification: this passed before the name rule too.)
    """
    async with make_api() as (app, api):
        await _store_legacy_routes(app.state.sessionmaker)
        page = await api.get("/ui/routes")
        assert page.status_code == 200
        assert "<script>x" not in page.text and "&lt;script&gt;x&lt;/script&gt;" in page.text
        assert "[bold]r1[/]" in page.text and "p|ipe" in page.text
        assert "=HYPERLINK(&#34;x&#34;)" in page.text or "=HYPERLINK(&quot;x&quot;)" in page.text
        one = await api.get(f"/ui/routes/{_path('<script>x</script>')}", params={"model": "<script>x</script>"})
        assert one.status_code == 200 and "<script>x" not in one.text and "&lt;script&gt;x" in one.text
