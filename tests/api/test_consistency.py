"""The console and the JSON api answer the same mistakes the same way (safety issue, item 11).

- a console form post over the body limit gets the console's HTML error page, the api its JSON;
- ``PUT /v1/prices/{model}`` documents its body and answers 413 in the api's error shape;
- the route page refuses a ``reason`` or ``since``/``until`` the api refuses, with the api's rule;
- ``GET /v1/thresholds/{route}`` takes the route's only model when ``model`` is left out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from html import unescape

import pytest

from hedgerow.api.limits import DEFAULT_BODY_LIMIT_BYTES
from hedgerow.api.prices import MAX_PRICE_BODY_BYTES
from hedgerow.controller.policy.reason_codes import REASON_CODES
from tests.api.conftest import MakeApi

M = {"model": "m1"}
PRICE = {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}


async def _chunks(body: bytes, size: int = 8192) -> AsyncIterator[bytes]:
    """``body`` in pieces, so the request goes without a ``Content-Length`` (chunked)."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


# -- 1. a console post over the body limit: the console's HTML page, not the api's JSON ----------


async def test_a_console_post_over_the_body_limit_gets_the_consoles_html_error_page(make_api: MakeApi) -> None:
    """A form post of 70 KB to ``/ui/...`` was answered with the middleware's JSON 413, a page of
    raw JSON in the operator's browser. It is now the console's error page: 413, naming the
    limit, with a link back to the form; the JSON api keeps its JSON 413."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        form = {"budget": "5%", "note": "x" * (DEFAULT_BODY_LIMIT_BYTES + 4000)}
        for declared in (True, False):  # Content-Length over the limit, and a chunked body passing it
            if declared:
                posted = await api.post("/ui/routes/r", params=M, data=form)
            else:
                body = b"budget=5%25&note=" + b"x" * (DEFAULT_BODY_LIMIT_BYTES + 4000)
                posted = await api.post(
                    "/ui/routes/r",
                    params=M,
                    content=_chunks(body),
                    headers={"content-type": "application/x-www-form-urlencoded"},
                )
            assert posted.status_code == 413, posted.text
            assert posted.headers["content-type"].startswith("text/html"), posted.headers
            text = unescape(posted.text)
            assert f"exceeds the limit of {DEFAULT_BODY_LIMIT_BYTES} bytes" in text, text
            assert 'class="notice error"' in posted.text and "<!doctype html>" in posted.text
            assert '<a href="/ui/routes/r?model=m1">' in posted.text, posted.text
        login = await api.post("/ui/login", data={"token": "t" * (DEFAULT_BODY_LIMIT_BYTES + 10)})
        assert login.status_code == 413 and login.headers["content-type"].startswith("text/html")
        assert '<a href="/ui/login">' in login.text

        big = await api.put(
            "/v1/routes/r",
            params=M,
            content=b" " * (DEFAULT_BODY_LIMIT_BYTES + 10),
            headers={"content-type": "application/json"},
        )
        assert big.status_code == 413 and big.headers["content-type"] == "application/json"
        assert big.json()["detail"]["field"] == "body" and "16384 bytes" in big.json()["detail"]["message"]


# -- 2. PUT /v1/prices/{model}: its body in the document, its 413 in the api's shape -----------


async def test_the_price_put_documents_its_body_and_answers_413_in_the_api_error_shape(make_api: MakeApi) -> None:
    """The OpenAPI operation had no ``requestBody`` (clients and schemathesis saw a body-less PUT),
    and a body between the price limit and the server's 64 KiB was answered ``{"detail": "body of
    ... bytes exceeds 4096 bytes"}``, a bare string where every other error is ``{"detail":
    {"field", "message"}}``."""
    async with make_api() as (_app, api):
        doc = (await api.get("/openapi.json")).json()
        operation = doc["paths"]["/v1/prices/{model}"]["put"]
        body = operation["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert set(schema["required"]) == {"input_usd_per_mtok", "output_usd_per_mtok"}
        assert {"cached_input_usd_per_mtok", "upstream", "effective_from", "actor", "model"} <= set(
            schema["properties"]
        )
        assert schema["additionalProperties"] is False
        assert schema["properties"]["input_usd_per_mtok"]["minimum"] == 0
        assert operation["responses"]["413"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/FieldError"
        }

        padded = b'{"input_usd_per_mtok": 3, "output_usd_per_mtok": 15' + b" " * MAX_PRICE_BODY_BYTES + b"}"
        big = await api.put("/v1/prices/m1", content=padded, headers={"content-type": "application/json"})
        assert big.status_code == 413, big.text
        assert big.json() == {
            "detail": {
                "field": "body",
                "message": f"body of {len(padded)} bytes exceeds the limit of {MAX_PRICE_BODY_BYTES} bytes",
            }
        }
        assert (await api.put("/v1/prices/m1", json=PRICE)).status_code == 201


# -- 3. the route page's history filters: the api's rule, a 422 naming the parameter -----------


@pytest.mark.parametrize(
    ("query", "field", "shown"),
    [
        ({"reason": "budget_bond"}, "reason", "reason: unknown code 'budget_bond'"),
        (
            {"since": "2026-12-02T10:00", "until": "2026-12-01T10:00"},
            "since",
            "since: must not be after until (2026-12-02T10:00:00+00:00 > 2026-12-01T10:00:00+00:00)",
        ),
    ],
)
async def test_a_history_filter_the_api_refuses_is_a_422_page_naming_it(
    make_api: MakeApi, query: dict[str, str], field: str, shown: str
) -> None:
    """A misspelt ``reason`` or a ``since`` after ``until`` drew the route page with an empty
    history table, read as "no such decisions"; the CLI and the api refuse them. The page is now
    a 422 naming the parameter and the value, by the api's own rule."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        page = await api.get("/ui/routes/r", params=M | query)
        assert page.status_code == 422, page.text
        assert shown in unescape(page.text), page.text
        assert '<a href="/ui/routes/r?model=m1">' in page.text  # back to the page without the filters
        api_query = {k: v + "Z" for k, v in query.items()} if field == "since" else query
        answer = await api.get("/v1/routes/r/history", params=M | api_query)
        assert answer.status_code == 422 and answer.json()["detail"]["field"] == field, answer.text
        # what the api takes, the page takes
        good = {"reason": "config"} if field == "reason" else {"since": "2026-12-01T10:00", "until": "2026-12-01T10:00"}
        assert (await api.get("/ui/routes/r", params=M | good)).status_code == 200


async def test_every_known_reason_code_is_a_filter_the_api_and_the_page_take(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        for code in sorted(REASON_CODES):
            assert (await api.get("/v1/routes/r/history", params=M | {"reason": code})).status_code == 200, code
        assert (await api.get("/ui/routes/r", params=M | {"reason": " config "})).status_code == 200


# -- 4. GET /v1/thresholds/{route} without model: the route's only model ------------------------


async def test_a_threshold_without_model_is_the_routes_only_one_or_a_422_listing_them(make_api: MakeApi) -> None:
    """``model`` was required even for a route with one model (422 ``field required``), unlike
    ``GET /v1/routes/{route}`` and its history."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/solo", params=M, json={})).status_code == 201
        one = await api.get("/v1/thresholds/solo")
        assert one.status_code == 200, one.text
        assert one.json() == (await api.get("/v1/thresholds/solo", params=M)).json()
        assert one.json()["route"] == "solo" and one.json()["model"] == "m1"

        for model in ("m2", "m1"):
            assert (await api.put("/v1/routes/duo", params={"model": model}, json={})).status_code == 201
        two = await api.get("/v1/thresholds/duo")
        assert two.status_code == 422, two.text
        assert two.json()["detail"]["field"] == "model"
        assert "m1" in two.json()["detail"]["message"] and "m2" in two.json()["detail"]["message"]
        assert (await api.get("/v1/thresholds/duo", params={"model": "m2"})).json()["model"] == "m2"

        none = await api.get("/v1/thresholds/nowhere")
        assert none.status_code == 404 and none.json()["detail"]["field"] == "route"
        assert "nowhere" in none.json()["detail"]["message"]
        # a model that is given is still checked against the name rule
        bad = await api.get("/v1/thresholds/solo", params={"model": "m\u202e1"})
        assert bad.status_code == 422 and bad.json()["detail"]["field"] == "model"
