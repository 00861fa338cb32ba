"""Route cardinality bounded (issue 13 point 4): max_routes and max_models_per_route, 422 naming the field."""

from __future__ import annotations

from tests.api.conftest import MakeApi
from tests.conftest import CallFactory


async def test_new_routes_past_the_bounds_are_refused_and_nothing_of_the_batch_is_written(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api(max_routes=5, max_models_per_route=2) as (_app, client):
        first = [call_factory(f"a{i}", route=f"r{i}").to_dict() for i in range(4)]
        assert (await client.post("/v1/calls", json={"calls": first})).status_code == 202

        # Two new routes where one fits: the whole batch is refused, the second new one named.
        batch = [call_factory("b0", route="r0").to_dict(), call_factory("b1", route="r4").to_dict()]
        batch.append(call_factory("b2", route="r5").to_dict())
        refused = await client.post("/v1/calls", json={"calls": batch})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert (detail["index"], detail["field"]) == (2, "route")
        assert "max_routes" in detail["message"] and "'r5'" in detail["message"]
        routes = (await client.get("/v1/routes")).json()["routes"]
        assert len(routes) == 4  # nothing of the refused batch was written

        # Records of existing routes are always taken; a fifth route still fits.
        ok = [call_factory("c0", route="r0").to_dict(), call_factory("c1", route="r4").to_dict()]
        assert (await client.post("/v1/calls", json={"calls": ok})).status_code == 202

        # Models per route: r0 has m1; one more fits, a third does not.
        assert (await client.put("/v1/routes/r0", params={"model": "m2"}, json={})).status_code == 422  # max_routes
    async with make_api(max_routes=100, max_models_per_route=2) as (_app, client):
        assert (await client.put("/v1/routes/r0", params={"model": "m2"}, json={})).status_code == 201
        third = await client.put("/v1/routes/r0", params={"model": "m3"}, json={})
        assert third.status_code == 422 and third.json()["detail"]["field"] == "model"
        assert "max_models_per_route" in third.json()["detail"]["message"]
        by_ingest = await client.post(
            "/v1/calls", json={"calls": [call_factory("d0", route="r0", model="m4").to_dict()]}
        )
        assert by_ingest.status_code == 422 and by_ingest.json()["detail"]["field"] == "model"
        # changing an existing route is never refused by the bounds
        assert (await client.patch("/v1/routes/r0", params={"model": "m2"}, json={"budget": 0.2})).status_code == 200
