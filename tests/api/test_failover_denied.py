"""``failover_denied`` on the wire: stored when given, false for records of the older form."""

from __future__ import annotations

from sqlalchemy import select

from hedgerow.controller.store.models import Call
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory


async def test_failover_denied_is_stored_and_optional(make_api: MakeApi, call_factory: CallFactory) -> None:
    new = call_factory("fd-new").to_dict() | {"failover_denied": True}
    old = call_factory("fd-old").to_dict()
    old.pop("failover_denied")
    async with make_api() as (app, client):
        response = await client.post("/v1/calls", json={"calls": [new, old]})
        assert response.status_code == 202, response.text
        bad = call_factory("fd-bad").to_dict() | {"failover_denied": "yes"}
        refused = await client.post("/v1/calls", json={"calls": [bad]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "failover_denied"
        async with app.state.sessionmaker() as session:
            rows = dict((await session.execute(select(Call.request_id, Call.failover_denied))).all())
    assert rows == {"fd-new": True, "fd-old": False}
