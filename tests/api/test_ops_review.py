"""Defects found by an operator's review of the api, each pinned by a test (SQLite and PostgreSQL).

Route settings above ``MAX_SECONDS``; NUL and other control characters in stored strings; a route
change that must be all or nothing; route names with ``/``; deeply nested JSON and oversized
route bodies; the ``applied`` flag and no-op ``changes`` of config rows; query-parameter errors
in the ``{"detail": {"field", "message"}}`` shape.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import func, select, text

from hedgerow.client.records import MAX_SECONDS
from hedgerow.controller.store.models import Base, Call, Route, Threshold, ThresholdHistory
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory

M = {"model": "m1"}


async def _count(app: FastAPI, table: type[Base]) -> int:
    async with app.state.sessionmaker() as session:
        count: int = await session.scalar(select(func.count()).select_from(table))
        return count


# ---- 1. route durations are bounded by the call record's MAX_SECONDS ----


@pytest.mark.parametrize(
    ("method", "body", "field"),
    [
        ("put", {"pinned_hedge_after_s": 100_000}, "pinned_hedge_after_s"),
        ("patch", {"pinned_hedge_after_s": 1e308}, "pinned_hedge_after_s"),
        ("patch", {"max_hedge_after_s": MAX_SECONDS + 1}, "max_hedge_after_s"),
        ("put", {"default_hedge_after_s": 90_000, "max_hedge_after_s": 100_000}, "default_hedge_after_s"),
        ("patch", {"min_hedge_after_s": 1e300}, "min_hedge_after_s"),
    ],
)
async def test_route_durations_above_max_seconds_are_422_and_change_nothing(
    make_api: MakeApi, method: str, body: dict[str, float], field: str
) -> None:
    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        before = (await api.get("/v1/routes/r", params=M)).json()
        rows = await _count(app, ThresholdHistory)
        response = await getattr(api, method)("/v1/routes/r", params=M, json=body)
        assert response.status_code == 422, response.text
        assert response.json()["detail"]["field"] == field
        assert (await api.get("/v1/routes/r", params=M)).json() == before
        assert await _count(app, ThresholdHistory) == rows


async def test_a_pin_of_max_seconds_still_accepts_the_routes_records(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_app, api):
        pinned = await api.put(
            "/v1/routes/r", params=M, json={"max_hedge_after_s": MAX_SECONDS, "pinned_hedge_after_s": MAX_SECONDS}
        )
        assert pinned.status_code == 201, pinned.text
        record = call_factory("a1", route="r", model="m1").to_dict() | {"hedge_after_s": MAX_SECONDS}
        response = await api.post("/v1/calls", json={"calls": [record]})
        assert response.status_code == 202, response.text


def test_route_config_validation_uses_the_record_limit() -> None:
    from hedgerow.controller.routes_admin import RouteConfigInvalid, validate_route_config

    config = {
        "enabled": True,
        "budget": 0.1,
        "default_hedge_after_s": 2.0,
        "min_hedge_after_s": 0.05,
        "max_hedge_after_s": MAX_SECONDS,
        "pinned_hedge_after_s": MAX_SECONDS,
    }
    assert validate_route_config(config).max_hedge_after_s == MAX_SECONDS
    for field in ("max_hedge_after_s", "pinned_hedge_after_s"):
        with pytest.raises(RouteConfigInvalid) as info:
            validate_route_config(config | {field: MAX_SECONDS * 2})
        assert info.value.field == field
    # the budget's range is ops_bounds.budget_range_error's, the console's and the CLI's sentence
    with pytest.raises(RouteConfigInvalid) as info:
        validate_route_config(config | {"budget": 1.5})
    assert info.value.field == "budget" and info.value.message.startswith("1.5 is over 100%: a budget is the share")


# ---- 2. control characters (NUL first) never reach the store ----

RECORD_TEXT_FIELDS = ["route", "model", "request_id", "error_type", "client"]
ATTEMPT_TEXT_FIELDS = ["upstream", "error_type"]


async def test_control_characters_in_records_are_422_naming_index_and_field(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    fields = RECORD_TEXT_FIELDS + [f"attempts[0].{f}" for f in ATTEMPT_TEXT_FIELDS]
    async with make_api() as (app, api):
        for field in fields:
            for bad in ("a\u0000b", "tab\there", "line\nbreak", "del\u007f"):
                batch = [call_factory(f"ok{i}").to_dict() for i in range(2)]
                if field.startswith("attempts[0]."):
                    batch[1]["attempts"][0][field.split(".", 1)[1]] = bad
                else:
                    batch[1][field] = bad
                response = await api.post("/v1/calls", json={"calls": batch})
                assert response.status_code == 422, (field, bad, response.text)
                detail = response.json()["detail"]
                assert (detail["index"], detail["field"]) == (1, field)
                assert "control characters" in detail["message"]
        assert await _count(app, Call) == 0
        # printable unicode is fine
        fine = call_factory("ok-unicode", route="résumé ✓", model="模型").to_dict()
        assert (await api.post("/v1/calls", json={"calls": [fine]})).status_code == 202


async def test_control_characters_in_route_paths_queries_and_actor_are_422(make_api: MakeApi) -> None:
    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        rows = await _count(app, ThresholdHistory)
        cases = [
            ("put", "/v1/routes/a%00b", M, {}, "route"),
            ("patch", "/v1/routes/r%00", M, {"enabled": False}, "route"),
            ("get", "/v1/routes/a%00b", M, None, "route"),
            ("get", "/v1/routes/a%00b/history", M, None, "route"),
            ("get", "/v1/thresholds/a%00b", M, None, "route"),
            ("put", "/v1/routes/r", {"model": "m\u0000"}, {}, "model"),
            ("get", "/v1/routes/r", {"model": "m\u0000"}, None, "model"),
            ("get", "/v1/routes/r/history", {"model": "m\u0001"}, None, "model"),
            ("get", "/v1/thresholds/r", {"model": "m\u0000"}, None, "model"),
            ("put", "/v1/routes/r", M, {"actor": "eve\u0000"}, "actor"),
            ("patch", "/v1/routes/r", M, {"enabled": False, "actor": "eve\n"}, "actor"),
        ]
        for method, url, params, body, field in cases:
            kwargs: dict[str, Any] = {"params": params} | ({} if body is None else {"json": body})
            response = await api.request(method.upper(), url, **kwargs)
            assert response.status_code == 422, (method, url, response.text)
            assert response.json()["detail"]["field"] == field, (method, url, response.json())
            assert "control characters" in response.json()["detail"]["message"]
        assert await _count(app, Route) == 1
        assert await _count(app, ThresholdHistory) == rows


# ---- 3. a route change is all or nothing ----


async def _refuse_history_inserts(app: FastAPI) -> None:
    """Make the store itself refuse any new history row (a real database error, no mock)."""
    async with app.state.engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            await connection.execute(
                text(
                    "CREATE TRIGGER refuse_history BEFORE INSERT ON threshold_history "
                    "BEGIN SELECT RAISE(ABORT, 'history refused by test'); END"
                )
            )
        else:
            await connection.execute(
                text(
                    "CREATE FUNCTION refuse_history() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'history refused by test'; END $$"
                )
            )
            await connection.execute(
                text(
                    "CREATE TRIGGER refuse_history BEFORE INSERT ON threshold_history "
                    "FOR EACH ROW EXECUTE FUNCTION refuse_history()"
                )
            )


async def _snapshot(app: FastAPI) -> tuple[object, ...]:
    async with app.state.sessionmaker() as session:
        routes = [
            tuple(
                getattr(r, c)
                for c in (
                    "route",
                    "model",
                    "enabled",
                    "budget",
                    "pinned_hedge_after_s",
                    "max_hedge_after_s",
                    "updated_at",
                )
            )
            for r in (await session.scalars(select(Route).order_by(Route.route))).all()
        ]
        thresholds = [
            (t.route_id, t.hedge_after_s, t.enabled, t.version, t.updated_at)
            for t in (await session.scalars(select(Threshold).order_by(Threshold.route_id))).all()
        ]
        history = await session.scalar(select(func.count()).select_from(ThresholdHistory))
    return routes, thresholds, history


@pytest.mark.parametrize(
    "change",
    [
        ("patch", "/v1/routes/r", {"pinned_hedge_after_s": 0.7}),
        ("patch", "/v1/routes/r", {"enabled": False}),
        ("put", "/v1/routes/r", {"max_hedge_after_s": 10.0}),
        ("put", "/v1/routes/new", {"enabled": False}),
    ],
)
async def test_a_change_whose_audit_fails_leaves_nothing_changed(
    make_api: MakeApi, change: tuple[str, str, dict[str, object]]
) -> None:
    from httpx import ASGITransport, AsyncClient

    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        before = await _snapshot(app)
        await _refuse_history_inserts(app)
        method, url, body = change
        # the app's 500 is raised through the ASGI transport unless told otherwise
        async with AsyncClient(
            transport=ASGITransport(app=app, raise_app_exceptions=False), base_url="http://hedgerow.test"
        ) as client:
            response = await client.request(method.upper(), url, params=M, json=body)
        assert response.status_code == 500
        assert await _snapshot(app) == before


async def test_configure_route_rolls_back_when_the_store_refuses_the_history(make_api: MakeApi) -> None:
    from sqlalchemy.exc import DBAPIError

    from hedgerow.controller.routes_admin import configure_route

    async with make_api() as (app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        before = await _snapshot(app)
        await _refuse_history_inserts(app)
        with pytest.raises(DBAPIError, match="history refused by test"):
            await configure_route(
                app.state.sessionmaker, app.state.settings, "r", "m1", {"enabled": False}, replace=False, actor="ops"
            )
        assert await _snapshot(app) == before


# ---- 4. route names with "/" (and unicode) are reachable ----


@pytest.mark.parametrize("name", ["team/sum", "équipe/résumé/日本"])
async def test_route_names_with_slashes_are_reachable(make_api: MakeApi, call_factory: CallFactory, name: str) -> None:
    from urllib.parse import quote

    async with make_api() as (_app, api):
        record = call_factory("s1", route=name, model="m1").to_dict()
        assert (await api.post("/v1/calls", json={"calls": [record]})).status_code == 202
        patched = await api.patch(f"/v1/routes/{name}", params=M, json={"pinned_hedge_after_s": 0.9})
        assert patched.status_code == 200, patched.text
        assert patched.json()["route"]["route"] == name
        encoded = quote(name, safe="")  # team%2Fsum
        put = await api.put(f"/v1/routes/{encoded}", params=M, json={"pinned_hedge_after_s": 0.8})
        assert put.status_code == 200, put.text
        for url in (f"/v1/thresholds/{name}", f"/v1/thresholds/{encoded}"):
            threshold = await api.get(url, params=M)
            assert threshold.status_code == 200, (url, threshold.text)
            assert (threshold.json()["route"], threshold.json()["hedge_after_s"]) == (name, 0.8)
        one = await api.get(f"/v1/routes/{name}", params=M)
        assert one.status_code == 200 and one.json()["pinned_hedge_after_s"] == 0.8
        history = await api.get(f"/v1/routes/{name}/history", params=M)
        assert history.status_code == 200, history.text
        assert [row["route"] for row in history.json()["history"]] == [name, name]
        assert (await api.get("/v1/routes/team", params=M)).status_code == 404


async def test_history_path_is_the_history_of_the_prefix_and_read_only(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/a", params=M, json={"budget": 0.2})).status_code == 201
        rows = (await api.get("/v1/routes/a/history", params=M)).json()["history"]
        assert [row["route"] for row in rows] == ["a"]
        # issue 13: PUT /v1/routes/X/history created a route named X/history
        for method in ("PUT", "PATCH", "POST", "DELETE"):
            answer = await api.request(method, "/v1/routes/a/history", params=M, json={"budget": 0.3})
            assert answer.status_code == 405 and answer.headers["allow"] == "GET", (method, answer.text)
            assert answer.json()["detail"]["field"] == "method"
        encoded = await api.put("/v1/routes/a%2Fhistory", params=M, json={"budget": 0.3})
        assert encoded.status_code == 405
        record = call_factory("h1", route="b/history", model="m1").to_dict()
        refused = await api.post("/v1/calls", json={"calls": [record]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "route"
        names = {row["route"] for row in (await api.get("/v1/routes")).json()["routes"]}
        assert names == {"a"}


# ---- 5. nested JSON and body size ----


@pytest.mark.parametrize("depth", [5_000, 100_000])
async def test_deeply_nested_json_is_422_not_500(make_api: MakeApi, depth: int) -> None:
    async with make_api(max_batch_calls=1000) as (_app, api):
        nested = "[" * depth + "]" * depth
        response = await api.post(
            "/v1/calls", content='{"calls": ' + nested + "}", headers={"content-type": "application/json"}
        )
        assert response.status_code == 422, response.text[:200]
        assert response.json()["detail"] == {"index": None, "field": "body", "message": "JSON nested too deeply"}
        if depth * 2 < 16_000:
            for method in ("put", "patch"):
                response = await api.request(
                    method.upper(),
                    "/v1/routes/r",
                    params=M,
                    content='{"budget": ' + nested + "}",
                    headers={"content-type": "application/json"},
                )
                assert response.status_code == 422, response.text[:200]
                assert response.json()["detail"] == {"field": "body", "message": "JSON nested too deeply"}


async def test_route_bodies_over_the_limit_are_413(make_api: MakeApi) -> None:
    from hedgerow.api.routes import MAX_ROUTE_BODY_BYTES

    async with make_api() as (app, api):
        big = '{"actor": "' + "a" * MAX_ROUTE_BODY_BYTES + '"}'
        for method in ("put", "patch"):
            response = await api.request(
                method.upper(), "/v1/routes/r", params=M, content=big, headers={"content-type": "application/json"}
            )
            assert response.status_code == 413, response.text[:200]
            assert str(MAX_ROUTE_BODY_BYTES) in response.json()["detail"]["message"]
        nested = "[" * 100_000 + "]" * 100_000
        assert (
            await api.put("/v1/routes/r", params=M, content=nested, headers={"content-type": "application/json"})
        ).status_code == 413
        assert await _count(app, Route) == 0


# ---- 6. applied = "the published threshold changed"; no no-op changes ----


async def test_applied_means_the_published_threshold_changed(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        created = (await api.put("/v1/routes/r", params=M, json={})).json()
        assert created["history"]["applied"] is True  # first publication
        assert "pinned_hedge_after_s" not in created["changes"]
        assert set(created["changes"]) == {
            "enabled",
            "budget",
            "default_hedge_after_s",
            "min_hedge_after_s",
            "max_hedge_after_s",
        }
        version = created["route"]["threshold"]["version"]

        disabled = (await api.patch("/v1/routes/r", params=M, json={"enabled": False})).json()
        assert disabled["history"]["reason"] == "config,disabled"
        assert disabled["history"]["applied"] is True
        assert disabled["route"]["threshold"]["version"] == version + 1

        budget = (await api.patch("/v1/routes/r", params=M, json={"budget": 0.2})).json()
        assert budget["changes"] == {"budget": {"from": 0.1, "to": 0.2}}
        assert budget["history"]["applied"] is False  # still disabled, same value: nothing published
        # the threshold row served carries the budget: its version follows it
        assert budget["route"]["threshold"]["version"] == version + 2
        assert budget["route"]["threshold"]["budget"] == 0.2
        served = (await api.get("/v1/thresholds")).json()["thresholds"]
        assert [(t["budget"], t["version"]) for t in served] == [(0.2, version + 2)]

        enabled = (await api.patch("/v1/routes/r", params=M, json={"enabled": True})).json()
        assert enabled["history"]["applied"] is True

        created_off = (await api.put("/v1/routes/off", params=M, json={"enabled": False})).json()
        assert created_off["history"]["applied"] is True and created_off["route"]["threshold"]["version"] == 1
        assert "pinned_hedge_after_s" not in created_off["changes"]

        stored = (await api.get("/v1/routes/r/history", params=M)).json()["history"]
        assert [row["applied"] for row in stored] == [True, False, True, True]
        pinned = (await api.put("/v1/routes/p", params=M, json={"pinned_hedge_after_s": 0.5})).json()
        assert pinned["changes"]["pinned_hedge_after_s"] == {"from": None, "to": 0.5}


# ---- 9. query-parameter errors have the same shape as body errors ----


async def test_query_parameter_errors_name_the_field(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        await api.put("/v1/routes/r", params=M, json={})
        await api.put("/v1/routes/r", params={"model": "m2"}, json={})  # two models: model is needed
        cases: list[tuple[str, dict[str, str | int], str]] = [
            ("/v1/routes/r/history", {"model": "m1", "limit": 0}, "limit"),
            ("/v1/routes/r/history", {"model": "m1", "limit": "many"}, "limit"),
            ("/v1/routes/r/history", {"model": "m1", "since": "garbage"}, "since"),
            ("/v1/routes/r/history", {"model": "m1", "since": "2026-11-29T08:00:00"}, "since"),
            (
                "/v1/routes/r/history",
                {"model": "m1", "since": "2026-12-04T14:25:00Z", "until": "2026-12-04T14:24:00Z"},
                "since",
            ),
            ("/v1/routes/r/history", {}, "model"),
            ("/v1/routes/r", {}, "model"),
            ("/v1/thresholds/r", {}, "model"),
            ("/v1/routes/r", {"model": ""}, "model"),
        ]
        for url, params, field in cases:
            response = await api.get(url, params=params)
            assert response.status_code == 422, (url, params, response.text)
            detail = response.json()["detail"]
            assert isinstance(detail, dict) and detail["field"] == field, (url, params, detail)
            assert isinstance(detail["message"], str) and detail["message"]
        ok = await api.get("/v1/routes/r/history", params={"model": "m1", "since": datetime.now(UTC).isoformat()})
        assert ok.status_code == 200
