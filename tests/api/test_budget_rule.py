"""One rule for a hedge budget (controller/ops_bounds.py: ``budget_range_error``): the JSON api
refuses what the console, ``hedgerow routes set`` and ``HEDGEROW_DEFAULT_BUDGET`` refuse, with the
same sentence, and its OpenAPI document states the range the rule enforces.

The route body's schema had its own ``gt=0, lt=1``: the api answered a budget of 1 with
pydantic's "Input should be less than 1" where every other door named the rule.
"""

from __future__ import annotations

import pytest

from hedgerow.api.schemas import RoutePutIn
from hedgerow.controller.ops_bounds import budget_range_error
from tests.api.conftest import MakeApi

M = {"model": "m1"}


@pytest.mark.parametrize("budget", [0.0, 1.0, 1.5, -0.1])
async def test_the_api_refuses_a_budget_with_the_routes_own_sentence(make_api: MakeApi, budget: float) -> None:
    async with make_api() as (_app, api):
        for method in ("PUT", "PATCH"):
            answer = await api.request(method, "/v1/routes/r", params=M, json={"budget": budget})
            assert answer.status_code == 422, answer.text
            assert answer.json() == {"detail": {"field": "budget", "message": budget_range_error(budget)}}
        assert (await api.put("/v1/routes/r", params=M, json={"budget": 0.05})).status_code == 201


def test_the_documented_range_is_the_rules_range() -> None:
    schema = RoutePutIn.model_json_schema()["properties"]["budget"]
    low, high = schema["exclusiveMinimum"], schema["exclusiveMaximum"]
    assert budget_range_error(low) is not None and budget_range_error(high) is not None
    for inside in (low + 1e-9, (low + high) / 2, high - 1e-9):
        assert budget_range_error(inside) is None
