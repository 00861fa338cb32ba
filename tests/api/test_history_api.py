"""History that grows with decisions, not ticks; its filters; ``model`` optional; pins within bounds.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy import func, select

from hedgerow.controller.store.models import ThresholdHistory
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory
from tests.helpers import recent_calls

M = {"model": "m1"}
TICKS = 12


async def _count(app: FastAPI) -> int:
    async with app.state.sessionmaker() as session:
        count: int = await session.scalar(select(func.count()).select_from(ThresholdHistory))
        return count


async def test_identical_holds_merge_into_one_row_with_repeats(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (app, api):
        assert (
            await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 300, 1.0, route="r")})
        ).status_code == 202
        for _ in range(TICKS):
            assert (await api.post("/v1/controller/run")).json()["ran"] is True
        rows = (await api.get("/v1/routes/r/history")).json()["history"]  # model left out: one model
        # the first tick publishes (applied); every later tick holds the same value for the same reason
        assert await _count(app) == len(rows) == 2, rows
        newest, first = rows
        assert first["applied"] is True and first["repeats"] == 1 and first["last_at"] == first["computed_at"]
        assert newest["applied"] is False and newest["repeats"] == TICKS - 1
        assert newest["last_at"] > newest["computed_at"]
        # the merged row answers its own tick too (the controller/run answer shows the count)
        answer = (await api.post("/v1/controller/run")).json()["history"][0]
        assert answer["repeats"] == TICKS and await _count(app) == 2


async def test_a_change_of_reason_or_a_manual_change_stays_a_row(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 300, 1.0, route="r")})
        for _ in range(3):
            await api.post("/v1/controller/run")
        before = await _count(app)
        assert (await api.patch("/v1/routes/r", params=M, json={"pinned_hedge_after_s": 5.0})).status_code == 200
        for _ in range(3):
            await api.post("/v1/controller/run")
        rows = (await api.get("/v1/routes/r/history", params=M)).json()["history"]
        # the config row (applied), then one pinned hold repeated three times
        assert await _count(app) == before + 2
        assert rows[0]["reason"].startswith("pinned") and rows[0]["repeats"] == 3
        assert rows[1]["reason"].startswith("config") and rows[1]["actor"] == "api"


async def test_history_filters_applied_reason_until_and_paging(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 300, 1.0, route="r")})
        await api.post("/v1/controller/run")
        await api.post("/v1/controller/run")
        await api.patch("/v1/routes/r", params=M, json={"budget": 0.2})
        await api.patch("/v1/routes/r", params=M, json={"enabled": False})
        every = (await api.get("/v1/routes/r/history", params=M)).json()["history"]
        assert len(every) == 4
        applied = (await api.get("/v1/routes/r/history", params=M | {"applied": "true"})).json()["history"]
        assert applied and all(row["applied"] for row in applied)
        held = (await api.get("/v1/routes/r/history", params=M | {"applied": "false"})).json()["history"]
        assert len(applied) + len(held) == 4
        config = (await api.get("/v1/routes/r/history", params=M | {"reason": "config"})).json()["history"]
        assert [row["actor"] for row in config] == ["api", "api"]
        disabled = (await api.get("/v1/routes/r/history", params=M | {"reason": "disabled"})).json()["history"]
        assert len(disabled) == 1 and disabled[0]["reason"] == "config,disabled"
        oldest = every[-1]["computed_at"]
        until = (await api.get("/v1/routes/r/history", params=M | {"until": oldest})).json()["history"]
        assert [row["computed_at"] for row in until] == [oldest]
        page = (await api.get("/v1/routes/r/history", params=M | {"limit": 2, "offset": 2})).json()["history"]
        assert [row["computed_at"] for row in page] == [row["computed_at"] for row in every[2:]]
        naive = await api.get("/v1/routes/r/history", params=M | {"until": "2026-11-29T08:00:00"})
        assert naive.status_code == 422 and naive.json()["detail"]["field"] == "until"


async def test_model_is_needed_only_when_the_route_has_several(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        await api.put("/v1/routes/r", params=M, json={})
        assert (await api.get("/v1/routes/r")).json()["model"] == "m1"
        await api.put("/v1/routes/r", params={"model": "m2"}, json={})
        for url in ("/v1/routes/r", "/v1/routes/r/history"):
            response = await api.get(url)
            assert response.status_code == 422
            assert response.json()["detail"]["field"] == "model" and "m1, m2" in response.json()["detail"]["message"]
        missing = await api.get("/v1/routes/nope/history")
        assert missing.status_code == 404
        assert missing.json()["detail"]["field"] == "route" and "nope" in missing.json()["detail"]["message"]


async def test_a_pin_outside_the_bounds_is_refused_naming_the_field(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        await api.put("/v1/routes/r", params=M, json={"max_hedge_after_s": 30.0})
        response = await api.patch("/v1/routes/r", params=M, json={"pinned_hedge_after_s": 100.0})
        assert response.status_code == 422
        assert response.json()["detail"]["field"] == "pinned_hedge_after_s"
        assert "30" in response.json()["detail"]["message"]
        threshold = (await api.get("/v1/routes/r", params=M)).json()["threshold"]
        assert threshold["hedge_after_s"] != 100.0


async def test_a_repeated_hold_carries_its_latest_ticks_figures(make_api: MakeApi, call_factory: CallFactory) -> None:
    """A held row merged over several ticks shows the figures of its latest tick (samples,
    quantiles, rates, details), as DESIGN and the README say, with ``computed_at`` still its first
    tick and ``last_at`` its latest; the stored row equals what the latest tick answered."""
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "a", 300, 1.0, route="r")})
        for _ in range(3):
            await api.post("/v1/controller/run")
        before = (await api.get("/v1/routes/r/history")).json()["history"][0]
        assert before["repeats"] == 2 and before["samples"] == 300, before
        await api.post("/v1/calls", json={"calls": recent_calls(call_factory, "b", 200, 1.0, route="r")})
        answer = (await api.post("/v1/controller/run")).json()["history"][0]
        after = (await api.get("/v1/routes/r/history")).json()["history"][0]
    assert answer["reason"] == before["reason"] and answer["repeats"] == 3, answer  # the same hold, merged
    assert after == answer
    assert after["computed_at"] == before["computed_at"] and after["last_at"] > before["last_at"]
    # (quantiles are bucket values, so the same bucket may hold both ticks' P90)
    assert after["samples"] == 500 and after["observed_hedge_rate"] is not None, (before, after)
    assert (
        after["details"] != before["details"]
        and after["details"]["short_window"]["calls"] > (before["details"]["short_window"]["calls"])
    )


async def test_every_history_row_the_api_returns_explains_itself(make_api: MakeApi, call_factory: CallFactory) -> None:
    """``explanation``: the row's sentences (``explain_history_row`` of the row's own fields), in
    the history, in a change's answer and in the controller's run; the numbers are the row's."""
    from hedgerow.controller.policy.explain import explain_history_row

    async with make_api() as (_app, api):
        calls = recent_calls(call_factory, "x", 300, 1.0, route="r")
        assert (await api.post("/v1/calls", json={"calls": calls})).status_code == 202
        run = (await api.post("/v1/controller/run")).json()["history"]
        changed = await api.patch("/v1/routes/r", params=M, json={"pinned_hedge_after_s": 0.75, "actor": "ops"})
        assert changed.status_code == 200, changed.text
        rows = (await api.get("/v1/routes/r/history", params=M)).json()["history"]
    pin, first = rows
    assert run[0] == first and changed.json()["history"] == pin
    for row in rows:
        fields = {key: value for key, value in row.items() if key != "explanation"}
        assert row["explanation"] == explain_history_row(fields), row
    assert pin["explanation"][:3] == [
        f"The value went down from {first['hedge_after_s']:.4g} s to 0.75 s"
        f" ({(0.75 / first['hedge_after_s'] - 1) * 100:+.3g}%).",
        "ops changed the route's configuration (pinned_hedge_after_s none → 0.75 s); the value was decided again"
        " at once.",
        "An operator pinned the value at 0.75 s: it is published as is, and the controller's rules do not apply"
        " while the pin stands.",
    ]
    assert f"Samples: {first['samples']} primary TTFTs over the last" in " ".join(first["explanation"])
