"""Archiving a route over HTTP: ``DELETE /v1/routes/{route}``, restoring with ``PATCH``, and its effects.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture), through the app with
its lifespan running (the route id cache, the threshold cache and the ingest writer are real).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI
from sqlalchemy import func, select

from hedgerow.controller.store.models import Call, ThresholdHistory
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory

M = {"model": "m1"}
RESTORE = {"archived": False}
ADMIN = {"Authorization": "Bearer adm1n-token"}
READ = {"Authorization": "Bearer r3ad-token"}
INGEST = {"Authorization": "Bearer 1ngest-token"}
TOKENS = "ops=adm1n-token:admin,r3ad-token:read,1ngest-token:ingest"


def _batch(call_factory: CallFactory, prefix: str, n: int, route: str = "summarize") -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "calls": [
            call_factory(f"{prefix}{i}", route=route, started_at=now - timedelta(seconds=1 + i)).to_dict()
            for i in range(n)
        ]
    }


async def _stored_calls(app: FastAPI) -> int:
    async with app.state.sessionmaker() as session:
        return int(await session.scalar(select(func.count()).select_from(Call)) or 0)


async def test_delete_archives_once_and_the_route_leaves_lists_thresholds_and_ticks(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api(tokens=TOKENS) as (app, api):
        posted = await api.post("/v1/calls", json=_batch(call_factory, "a", 5), headers=INGEST)
        assert posted.status_code == 202, posted.text
        await api.post("/v1/calls", json=_batch(call_factory, "k", 3, route="keep"), headers=INGEST)
        ran = await api.post("/v1/controller/run", headers=ADMIN)
        assert {row["route"] for row in ran.json()["history"]} == {"summarize", "keep"}
        assert (await api.get("/v1/thresholds/summarize", params=M, headers=READ)).status_code == 200

        archived = await api.delete("/v1/routes/summarize", params=M, headers=ADMIN)
        assert archived.status_code == 200, archived.text
        body = archived.json()
        route = body["route"]
        assert route["route"] == "summarize" and route["archived_at"] is not None and route["archived_by"] == "ops"
        history = body["history"]
        assert body["changes"] == {"archived_at": {"from": None, "to": route["archived_at"]}}
        assert history["reason"] == "archived" and history["actor"] == "ops" and history["applied"] is False
        assert history["details"]["changes"] == {"archived_at": {"from": None, "to": route["archived_at"]}}

        # idempotent: the same archived_at, no second row
        again = await api.delete("/v1/routes/summarize", params=M, headers=ADMIN)
        assert again.status_code == 200
        assert again.json()["route"]["archived_at"] == route["archived_at"] and again.json()["history"] is None

        listed = (await api.get("/v1/routes", headers=READ)).json()["routes"]
        assert [r["route"] for r in listed] == ["keep"]
        [only] = (await api.get("/v1/routes", params={"archived": "true"}, headers=READ)).json()["routes"]
        assert only["route"] == "summarize" and only["archived_at"] == route["archived_at"]

        table = (await api.get("/v1/thresholds", headers=READ)).json()["thresholds"]
        assert [t["route"] for t in table] == ["keep"]
        gone = await api.get("/v1/thresholds/summarize", params=M, headers=READ)
        assert gone.status_code == 404 and "archived" in gone.json()["detail"]["message"]

        ticked = (await api.post("/v1/controller/run", headers=ADMIN)).json()["history"]
        assert [row["route"] for row in ticked] == ["keep"]  # no more decisions for it

        # history and calls kept, still readable
        one = await api.get("/v1/routes/summarize", params=M, headers=READ)
        assert one.status_code == 200 and one.json()["archived_at"] == route["archived_at"]
        rows = (await api.get("/v1/routes/summarize/history", params=M, headers=READ)).json()["history"]
        assert rows[0]["reason"] == "archived" and len(rows) == 2
        assert await _stored_calls(app) == 8


async def test_only_admin_may_archive_or_restore_and_unknown_routes_are_404(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api(tokens=TOKENS) as (_app, api):
        await api.post("/v1/calls", json=_batch(call_factory, "a", 2), headers=INGEST)
        for headers in (READ, INGEST):
            assert (await api.delete("/v1/routes/summarize", params=M, headers=headers)).status_code == 403
            restore = await api.patch("/v1/routes/summarize", params=M, json={"archived": False}, headers=headers)
            assert restore.status_code == 403
        assert (await api.delete("/v1/routes/summarize", params=M)).status_code == 401
        unknown = await api.delete("/v1/routes/nope", params=M, headers=ADMIN)
        assert unknown.status_code == 404
        assert unknown.json()["detail"]["field"] == "route" and "'nope'" in unknown.json()["detail"]["message"]
        assert (await api.patch("/v1/routes/nope", params=M, json=RESTORE, headers=ADMIN)).status_code == 404
        missing_model = await api.delete("/v1/routes/summarize", headers=ADMIN)
        assert missing_model.status_code == 422
        assert [r["archived_at"] for r in (await api.get("/v1/routes", headers=READ)).json()["routes"]] == [None]


async def test_records_of_an_archived_route_are_refused_and_restore_brings_it_back(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (app, api):
        assert (await api.post("/v1/calls", json=_batch(call_factory, "a", 3))).status_code == 202
        assert (await api.delete("/v1/routes/summarize", params=M)).status_code == 200
        # the route id is in this process's cache: the refusal does not depend on it missing there
        refused = await api.post("/v1/calls", json=_batch(call_factory, "b", 2))
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail["index"] == 0 and detail["field"] == "route"
        assert "'summarize'" in detail["message"] and "archived" in detail["message"]
        assert await _stored_calls(app) == 3
        # a change is refused too, naming it as archived
        patched = await api.patch("/v1/routes/summarize", params=M, json={"budget": 0.2})
        assert patched.status_code == 409 and "archived" in patched.json()["detail"]["message"]
        put = await api.put("/v1/routes/summarize", params=M, json={})
        assert put.status_code == 409

        mixed = await api.patch("/v1/routes/summarize", params=M, json={"archived": False, "budget": 0.2})
        assert mixed.status_code == 422 and mixed.json()["detail"]["field"] == "archived"
        restored = await api.patch("/v1/routes/summarize", params=M, json=RESTORE)
        assert restored.status_code == 200, restored.text
        assert restored.json()["route"]["archived_at"] is None
        assert restored.json()["history"]["reason"] == "restored"
        again = (await api.patch("/v1/routes/summarize", params=M, json=RESTORE)).json()
        assert again["history"] is None and again["changes"] == {}
        assert (await api.post("/v1/calls", json=_batch(call_factory, "b", 2))).status_code == 202
        assert [r["route"] for r in (await api.get("/v1/routes")).json()["routes"]] == ["summarize"]
        async with app.state.sessionmaker() as session:
            reasons = (await session.scalars(select(ThresholdHistory.reason).order_by(ThresholdHistory.id))).all()
        assert list(reasons) == ["archived", "restored"]


async def test_archived_routes_do_not_count_against_the_route_cap(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api(max_routes=2) as (_app, api):
        for name in ("one", "two"):
            assert (await api.post("/v1/calls", json=_batch(call_factory, name, 1, route=name))).status_code == 202
        capped = await api.post("/v1/calls", json=_batch(call_factory, "three", 1, route="three"))
        assert capped.status_code == 422 and "max_routes" in capped.json()["detail"]["message"]
        assert (await api.delete("/v1/routes/two", params=M)).status_code == 200
        assert (await api.post("/v1/calls", json=_batch(call_factory, "three", 1, route="three"))).status_code == 202
        # a restore is a route in use again: refused while the cap is full
        refused = await api.patch("/v1/routes/two", params=M, json=RESTORE)
        assert refused.status_code == 422
        assert refused.json()["detail"]["field"] == "route" and "not restored" in refused.json()["detail"]["message"]
        assert (await api.delete("/v1/routes/three", params=M)).status_code == 200
        assert (await api.patch("/v1/routes/two", params=M, json=RESTORE)).status_code == 200


async def test_a_route_named_with_a_slash_is_archived_whole(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json=_batch(call_factory, "a", 1, route="team/sum"))
        await api.post("/v1/calls", json=_batch(call_factory, "b", 1, route="team"))
        assert (await api.delete("/v1/routes/team/sum", params=M)).json()["route"]["route"] == "team/sum"
        assert [r["route"] for r in (await api.get("/v1/routes")).json()["routes"]] == ["team"]
        restored = await api.patch("/v1/routes/team/sum", params=M, json=RESTORE)
        assert restored.json()["route"]["route"] == "team/sum"
