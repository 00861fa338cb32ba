"""The smaller items of issue 13 point 9: each refused or hidden, with a test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hedgerow.api.health import NOT_READY_REASON
from hedgerow.controller.store.db import make_engine
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory


async def test_started_at_far_in_the_future_and_huge_attempt_lists_are_refused(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_app, api):
        future = call_factory("f1").to_dict() | {"started_at": "8999-12-31T00:00:00Z"}
        refused = await api.post("/v1/calls", json={"calls": [future]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "started_at"
        soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
        skewed = call_factory("f2").to_dict() | {"started_at": soon}
        assert (await api.post("/v1/calls", json={"calls": [skewed]})).status_code == 202  # clock skew is fine

        many = call_factory("f3").to_dict()
        attempt = dict(many["attempts"][0], outcome="failed", first_token_s=None)
        many |= {"attempts": [attempt] * 65, "winner": None, "status": "error"}
        refused = await api.post("/v1/calls", json={"calls": [many]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "attempts"


async def test_readyz_does_not_show_the_database_error(make_api: MakeApi) -> None:
    async with make_api() as (app, api):
        app.state.engine = make_engine("postgresql+asyncpg://secret-user:pw@127.0.0.1:1/private-db")
        answer = await api.get("/readyz")
        await app.state.engine.dispose()
    assert answer.status_code == 503
    assert answer.json() == {"status": "not ready", "reason": NOT_READY_REASON}
    assert "secret-user" not in answer.text and "private-db" not in answer.text
