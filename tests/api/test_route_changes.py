"""A route change through the api or the console reaches this process's threshold poll cache at
once, by the one copy of that rule (api/route_changes.py).

The api's handlers and the console's forms each used to empty the cache (and forget an archived
route's id) after their own call into the store; a path that forgot would serve the old threshold
until the cache's next check of the store (an hour here).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import MakeApi

API = Path(__file__).resolve().parents[2] / "api"
M = {"model": "m1"}
STORE_CHANGES = {"configure_route", "archive_route", "restore_route"}


async def _budgets(api: httpx.AsyncClient) -> dict[str, Any]:
    answer = await api.get("/v1/thresholds")
    assert answer.status_code == 200, answer.text
    return {row["route"]: row["budget"] for row in answer.json()["thresholds"]}


async def test_every_change_path_is_seen_by_the_next_poll(make_api: MakeApi) -> None:
    async with make_api(threshold_check_interval_s=3600) as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={"budget": 0.1})).status_code == 201
        assert await _budgets(api) == {"r": 0.1}  # rendered now, then kept for an hour

        assert (await api.put("/v1/routes/r", params=M, json={"budget": 0.2})).status_code == 200
        assert await _budgets(api) == {"r": 0.2}
        assert (await api.patch("/v1/routes/r", params=M, json={"budget": 0.3})).status_code == 200
        assert await _budgets(api) == {"r": 0.3}
        assert (await api.patch("/v1/routes/r", params=M, json={"archived": True})).status_code == 200
        assert await _budgets(api) == {}
        assert (await api.patch("/v1/routes/r", params=M, json={"archived": False})).status_code == 200
        assert await _budgets(api) == {"r": 0.3}
        assert (await api.delete("/v1/routes/r", params=M)).status_code == 200
        assert await _budgets(api) == {}
        assert (await api.patch("/v1/routes/r", params=M, json={"archived": False})).status_code == 200

        config = (await api.get("/v1/routes/r", params=M)).json()
        seconds = {
            name: str(config[name]) for name in ("default_hedge_after_s", "min_hedge_after_s", "max_hedge_after_s")
        }
        form = await api.post("/ui/routes/r", params=M, data={"enabled": "on", "budget": "4%", **seconds})
        assert form.status_code == 303, form.text
        assert await _budgets(api) == {"r": 0.04}
        archived = await api.post("/ui/routes/r", params=M, data={"action": "archive", "confirm": "yes"})
        assert archived.status_code == 303, archived.text
        assert await _budgets(api) == {}
        restored = await api.post("/ui/routes/r", params=M, data={"action": "restore"})
        assert restored.status_code == 303, restored.text
        assert await _budgets(api) == {"r": 0.04}


def test_only_route_changes_calls_the_stores_route_changes() -> None:
    callers = set()
    for path in sorted(API.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in STORE_CHANGES:
                    callers.add(path.name)
    assert callers == {"route_changes.py"}, f"change routes through hedgerow.api.route_changes: {callers}"
