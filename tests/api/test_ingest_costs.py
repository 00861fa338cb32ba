"""``POST /v1/calls`` stores the prompt tokens of every attempt, estimating them for version 1 records."""

from __future__ import annotations

from tests.api.conftest import MakeApi
from tests.client.test_record_costs import v1_dict


async def test_the_api_stores_version_1_records_with_estimated_prompt_tokens(make_api: MakeApi) -> None:
    from sqlalchemy import select

    from hedgerow.controller.store.models import Attempt

    async with make_api() as (app, api):
        answer_v1 = await api.post("/v1/calls", json={"calls": [v1_dict()]})
        assert answer_v1.status_code == 202, answer_v1.text
        refused = await api.post("/v1/calls", json={"calls": [{**v1_dict(), "request_id": "r2", "record_version": 7}]})
        assert refused.status_code == 422 and refused.json()["detail"]["field"] == "record_version"
        async with app.state.sessionmaker() as session:
            rows = (await session.scalars(select(Attempt).order_by(Attempt.attempt_index))).all()
    assert [(r.prompt_tokens, r.prompt_tokens_estimated) for r in rows] == [(50, True), (50, True)]
