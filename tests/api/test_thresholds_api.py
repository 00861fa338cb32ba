"""Thresholds (ETag / 304), routes, history (newest first, exact fields), health, auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hedgerow.api.app import create_app
from hedgerow.api.errors import ApiConfigError
from hedgerow.controller.store.db import head_revision
from hedgerow.controller.store.queries import HISTORY_FIELDS, THRESHOLD_FIELDS
from hedgerow.settings import Settings
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import recent_calls


async def test_thresholds_etag_304_and_history(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (_app, api):
        assert (
            await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 100, 0.4)})
        ).status_code == 202
        run = await api.post("/v1/controller/run")
        assert run.status_code == 200 and run.json()["ran"] is True
        table = await api.get("/v1/thresholds")
        assert table.status_code == 200
        etag = table.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"')
        [row] = table.json()["thresholds"]
        assert tuple(row) == THRESHOLD_FIELDS
        assert row["version"] == 1 and row["enabled"] is True and row["budget"] == 0.10
        assert table.json()["generated_at"] == row["updated_at"]
        unchanged = await api.get("/v1/thresholds", headers={"If-None-Match": etag})
        assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["etag"] == etag
        assert (await api.get("/v1/thresholds", headers={"If-None-Match": '"other"'})).status_code == 200
        for form in ("*", f'"other", {etag}', f"W/{etag}"):  # RFC 9110 13.1.2: any, a list, weak
            assert (await api.get("/v1/thresholds", headers={"If-None-Match": form})).status_code == 304

        one = await api.get("/v1/thresholds/summarize", params={"model": "m1"})
        assert one.status_code == 200 and one.json() == row
        assert (await api.get("/v1/thresholds/summarize", params={"model": "nope"})).status_code == 404
        assert (await api.get("/v1/thresholds/nope", params={"model": "m1"})).status_code == 404

        # slower calls arrive and a second tick raises the value: the table and its ETag change
        # (on unchanged data the controller's second tick repeats its first value)
        slower = recent_calls(call_factory, "b", 100, 1.2)
        assert (await api.post("/v1/calls", json={"calls": slower})).status_code == 202
        await api.post("/v1/controller/run")
        changed = await api.get("/v1/thresholds", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.headers["etag"] != etag
        assert changed.json()["thresholds"][0]["version"] == 2

        history = await api.get("/v1/routes/summarize/history", params={"model": "m1", "limit": 10})
        rows = history.json()["history"]
        # the store's fields, then the api's plain-English sentences of each row
        assert len(rows) == 2 and all(tuple(r) == (*HISTORY_FIELDS, "explanation") for r in rows)
        assert all(r["explanation"] and all(isinstance(s, str) for s in r["explanation"]) for r in rows)
        assert rows[0]["computed_at"] > rows[1]["computed_at"]  # newest first
        assert rows[0]["previous_hedge_after_s"] == rows[1]["hedge_after_s"]
        assert rows[0]["hedge_after_s"] == changed.json()["thresholds"][0]["hedge_after_s"]
        assert rows[1]["samples"] == 100 and rows[1]["censored"] == 0
        limited = await api.get("/v1/routes/summarize/history", params={"model": "m1", "limit": 1})
        assert limited.json()["history"] == rows[:1]
        assert (await api.get("/v1/routes/nope/history", params={"model": "m1"})).status_code == 404
        since = await api.get("/v1/routes/summarize/history", params={"model": "m1", "since": rows[0]["computed_at"]})
        assert since.json()["history"] == rows[:1]
        for bad in ("notadate", "2026-11-29T08:00:00"):  # not a time / no zone
            response = await api.get("/v1/routes/summarize/history", params={"model": "m1", "since": bad})
            assert response.status_code == 422

        route = (await api.get("/v1/routes/summarize", params={"model": "m1"})).json()
        assert route["threshold"]["version"] == 2 and route["default_hedge_after_s"] == 2.0


async def test_health_and_ready(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    ready = await api.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "revision": head_revision()}


async def test_bearer_tokens_and_scopes(make_api: MakeApi, call_factory: CallFactory) -> None:
    tokens = "ing3st:ingest,r3ad:read,adm1n:admin"
    async with make_api(tokens=tokens) as (_app, api):
        body = {"calls": recent_calls(call_factory, "t", 3, 0.3)}
        assert (await api.post("/v1/calls", json=body)).status_code == 401
        bad = await api.post("/v1/calls", json=body, headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"
        assert (await api.post("/v1/calls", json=body, headers={"Authorization": "Bearer r3ad"})).status_code == 403
        assert (await api.post("/v1/calls", json=body, headers={"Authorization": "Bearer ing3st"})).status_code == 202
        assert (await api.get("/v1/thresholds", headers={"Authorization": "Bearer ing3st"})).status_code == 200
        assert (await api.get("/v1/routes", headers={"Authorization": "Bearer ing3st"})).status_code == 403
        assert (await api.get("/v1/routes", headers={"Authorization": "Bearer r3ad"})).status_code == 200
        assert (await api.post("/v1/controller/run", headers={"Authorization": "Bearer r3ad"})).status_code == 403
        assert (await api.post("/v1/controller/run", headers={"Authorization": "Bearer adm1n"})).status_code == 200
        patch: dict[str, Any] = {"params": {"model": "m1"}, "json": {"budget": 0.05}}
        assert (
            await api.patch("/v1/routes/summarize", headers={"Authorization": "Bearer r3ad"}, **patch)
        ).status_code == 403
        assert (
            await api.patch("/v1/routes/summarize", headers={"Authorization": "Bearer adm1n"}, **patch)
        ).status_code == 200
        assert (await api.get("/healthz")).status_code == 200


def test_refuses_non_loopback_without_tokens(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ApiConfigError, match=r"refusing to listen on '0\.0\.0\.0' without auth"):
        create_app(Settings(database_url=url, host="0.0.0.0"))
    # issue 13: a 1-character (or any short) token is refused off loopback, named by position
    with pytest.raises(ApiConfigError, match="token 2 of HEDGEROW_TOKENS has 1 characters, fewer than 16"):
        create_app(Settings(database_url=url, host="0.0.0.0", tokens="abcdefghijklmnopq:read,x:admin"))
    create_app(Settings(database_url=url, host="0.0.0.0", tokens="abcdefghijklmnop:read"))
    create_app(Settings(database_url=url, host="127.0.0.1", tokens="abc:read"))  # loopback: any length
    create_app(Settings(database_url=url, host="::1"))
    with pytest.raises(ApiConfigError, match="unknown scope 'write'"):
        create_app(Settings(database_url=url, tokens="abc:write"))


async def test_patch_route_is_applied_at_once_and_audited(make_api: MakeApi, call_factory: CallFactory) -> None:
    from sqlalchemy import select

    from hedgerow.controller.store.models import ThresholdHistory

    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "p", 5, 0.3)})
        pinned = await api.patch(
            "/v1/routes/summarize", params={"model": "m1"}, json={"pinned_hedge_after_s": 0.7, "actor": "alice"}
        )
        assert pinned.status_code == 200, pinned.text
        body = pinned.json()
        assert body["route"]["pinned_hedge_after_s"] == 0.7
        assert body["route"]["threshold"]["hedge_after_s"] == 0.7
        assert body["history"]["reason"] == "config,pinned" and body["history"]["source"] == "pinned"
        assert body["history"]["details"]["changes"] == {"pinned_hedge_after_s": {"from": None, "to": 0.7}}
        table = (await api.get("/v1/thresholds")).json()["thresholds"]
        assert [(t["hedge_after_s"], t["source"]) for t in table] == [(0.7, "pinned")]
        unpinned = await api.patch(
            "/v1/routes/summarize", params={"model": "m1"}, json={"pinned_hedge_after_s": None, "enabled": False}
        )
        assert unpinned.json()["route"]["threshold"]["enabled"] is False
        bad = await api.patch(
            "/v1/routes/summarize", params={"model": "m1"}, json={"min_hedge_after_s": 5.0, "max_hedge_after_s": 1.0}
        )
        assert bad.status_code == 422 and bad.json()["detail"]["field"] == "min_hedge_after_s"
        assert (await api.patch("/v1/routes/nope", params={"model": "m1"}, json={})).status_code == 404
        async with app.state.sessionmaker() as session:
            actors = (await session.scalars(select(ThresholdHistory.actor).order_by(ThresholdHistory.id))).all()
        assert actors == ["alice", "api"]
