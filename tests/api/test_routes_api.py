"""Route configuration over HTTP: PUT (replace, creates), PATCH, GET /v1/routes, and the audit trail.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from hedgerow.controller.policy.ttft_histogram import BUCKET_RATIO
from hedgerow.controller.store.models import ThresholdHistory
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory

M = {"model": "m1"}


def _calls(call_factory: CallFactory, prefix: str, n: int, ttft_s: float) -> list[dict[str, Any]]:
    rng = random.Random(prefix)
    now = datetime.now(UTC)
    return [
        call_factory(
            f"{prefix}{i}",
            started_at=now - timedelta(seconds=rng.uniform(1, 600)),
            primary_ttft_s=ttft_s * rng.uniform(0.5, 1.5),
        ).to_dict()
        for i in range(n)
    ]


async def _rows(app: FastAPI) -> int:
    async with app.state.sessionmaker() as session:
        count: int = await session.scalar(select(func.count()).select_from(ThresholdHistory))
        return count


async def test_put_creates_a_missing_route_and_publishes_at_once(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        assert (await api.get("/v1/routes")).json()["routes"] == []
        created = await api.put("/v1/routes/new-route", params=M, json={"enabled": False, "budget": 0.05})
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["created"] is True
        route = body["route"]
        assert (route["route"], route["model"], route["enabled"], route["budget"]) == ("new-route", "m1", False, 0.05)
        # omitted fields take the defaults of a new route
        assert (
            route["default_hedge_after_s"],
            route["min_hedge_after_s"],
            route["max_hedge_after_s"],
            route["pinned_hedge_after_s"],
        ) == (2.0, 0.05, 30.0, None)
        assert body["changes"] == {
            "enabled": {"from": None, "to": False},
            "budget": {"from": None, "to": 0.05},
            "default_hedge_after_s": {"from": None, "to": 2.0},
            "min_hedge_after_s": {"from": None, "to": 0.05},
            "max_hedge_after_s": {"from": None, "to": 30.0},
        }  # no no-op entry for the unset pin
        assert body["history"]["applied"] is True  # first publication of the route's threshold
        history = body["history"]
        assert history["reason"] == "config,disabled" and history["actor"] == "api"
        assert history["details"]["changes"] == body["changes"] and history["details"]["created"] is True
        # published in the same call: clients see the disabled route at once
        assert route["threshold"]["enabled"] is False and route["threshold"]["version"] == 1
        [listed] = (await api.get("/v1/routes")).json()["routes"]
        assert listed == route | {"recent_calls": 0, "recent_failed_calls": 0}  # the list's last hour: no call
        [row] = (await api.get("/v1/routes/new-route/history", params=M)).json()["history"]
        assert row == history


async def test_put_replaces_every_field_and_patch_only_the_given_ones(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "r", 5, 0.3)})
        patched = await api.patch(
            "/v1/routes/summarize", params=M, json={"budget": 0.05, "pinned_hedge_after_s": 0.7, "actor": "alice"}
        )
        assert patched.status_code == 200 and patched.json()["created"] is False
        assert patched.json()["changes"] == {
            "budget": {"from": 0.10, "to": 0.05},
            "pinned_hedge_after_s": {"from": None, "to": 0.7},
        }
        assert patched.json()["route"]["max_hedge_after_s"] == 30.0  # untouched
        replaced = await api.put("/v1/routes/summarize", params=M, json={"max_hedge_after_s": 10.0, "actor": "bob"})
        assert replaced.status_code == 200, replaced.text
        body = replaced.json()
        # budget and pin were omitted: back to the defaults (0.10, unpinned)
        assert body["changes"] == {
            "budget": {"from": 0.05, "to": 0.10},
            "max_hedge_after_s": {"from": 30.0, "to": 10.0},
            "pinned_hedge_after_s": {"from": 0.7, "to": None},
        }
        assert body["history"]["reason"].startswith("config,") and body["history"]["actor"] == "bob"
        # unpinned with 5 samples: a cold route, no value below the (new) maximum is supported
        threshold = body["route"]["threshold"]
        assert (threshold["hedge_after_s"], threshold["source"]) == (10.0, "cold_start")
        history = (await api.get("/v1/routes/summarize/history", params=M)).json()["history"]
        assert [h["actor"] for h in history] == ["bob", "alice"]
        assert [h["reason"].split(",")[0] for h in history] == ["config", "config"]


async def test_a_change_of_nothing_writes_no_row(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "n", 5, 0.3)})
        await api.post("/v1/controller/run")
        before = await _rows(app)
        for method, body in (
            ("patch", {}),
            ("patch", {"budget": 0.10}),
            ("patch", {"enabled": True, "actor": "x"}),
            ("put", {}),
            ("put", {"budget": 0.1, "default_hedge_after_s": 2.0}),
        ):
            response = await getattr(api, method)("/v1/routes/summarize", params=M, json=body)
            assert response.status_code == 200, (method, body, response.text)
            assert response.json()["changes"] == {} and response.json()["history"] is None, (method, body)
        assert await _rows(app) == before
        version = (await api.get("/v1/thresholds/summarize", params=M)).json()["version"]
        assert version == 1


async def test_changes_that_move_the_published_value_bump_the_version(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    async with make_api() as (_app, api):
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "v", 5, 0.3)})
        await api.post("/v1/controller/run")  # a cold route, 5 samples: the maximum, version 1

        async def published() -> tuple[float, bool, int, str]:
            t = (await api.get("/v1/thresholds/summarize", params=M)).json()
            return t["hedge_after_s"], t["enabled"], t["version"], t["source"]

        assert await published() == (30.0, True, 1, "cold_start")
        await api.patch("/v1/routes/summarize", params=M, json={"pinned_hedge_after_s": 0.9})
        assert await published() == (0.9, True, 2, "pinned")
        await api.patch("/v1/routes/summarize", params=M, json={"enabled": False})
        assert await published() == (0.9, False, 3, "disabled")
        await api.patch("/v1/routes/summarize", params=M, json={"enabled": True, "pinned_hedge_after_s": None})
        assert (await published())[1:3] == (True, 4)
        # a max bound under the current value clamps it at once
        clamp = await api.patch(
            "/v1/routes/summarize", params=M, json={"max_hedge_after_s": 0.5, "default_hedge_after_s": 0.5}
        )
        assert clamp.status_code == 200, clamp.text
        assert "clamped_max" in clamp.json()["history"]["reason"].split(",")
        # a cold route: nothing below the new max (0.5 s) is supported, and the new default,
        # 0.5 s, is that max: the default
        assert await published() == (0.5, True, 5, "default")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"budget": 0}, "budget"),
        ({"budget": 1.5}, "budget"),
        ({"budget": "0.1"}, "budget"),
        ({"enabled": "yes"}, "enabled"),
        ({"min_hedge_after_s": -1.0}, "min_hedge_after_s"),
        ({"min_hedge_after_s": 5.0, "max_hedge_after_s": 1.0}, "min_hedge_after_s"),
        ({"default_hedge_after_s": 40.0}, "default_hedge_after_s"),  # above max 30 s
        ({"min_hedge_after_s": 3.0}, "default_hedge_after_s"),  # default 2 s now below min
        ({"pinned_hedge_after_s": 0}, "pinned_hedge_after_s"),
        ({"hedge_after_s": 1.0}, "hedge_after_s"),
        ({"actor": ""}, "actor"),
    ],
)
async def test_bad_values_are_422_naming_the_field_and_change_nothing(
    make_api: MakeApi, call_factory: CallFactory, body: dict[str, object], field: str
) -> None:
    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "b", 3, 0.3)})
        before = (await api.get("/v1/routes/summarize", params=M)).json()
        for method in ("patch", "put"):
            response = await getattr(api, method)("/v1/routes/summarize", params=M, json=body)
            assert response.status_code == 422, (method, response.text)
            assert response.json()["detail"]["field"] == field, (method, response.json())
            assert response.json()["detail"]["message"]
        assert (await api.get("/v1/routes/summarize", params=M)).json() == before
        assert await _rows(app) == 0


async def test_malformed_bodies_and_unknown_routes(make_api: MakeApi) -> None:
    async with make_api() as (_app, api):
        headers = {"Content-Type": "application/json"}
        for content in (b"{not json", b"[1, 2]", b'{"default_hedge_after_s": NaN}'):
            response = await api.put("/v1/routes/x", params=M, content=content, headers=headers)
            assert response.status_code == 422, content
            assert response.json()["detail"]["field"] in ("body", "default_hedge_after_s")
        assert (await api.patch("/v1/routes/nope", params=M, json={"budget": 0.2})).status_code == 404
        assert (await api.put("/v1/routes/x", json={})).status_code == 422  # model is required
        assert (await api.get("/v1/routes")).json()["routes"] == []  # nothing was created


async def test_actor_is_the_token_fingerprint(make_api: MakeApi) -> None:
    async with make_api(tokens="s3cret-admin:admin,r3ad:read") as (app, api):
        admin = {"Authorization": "Bearer s3cret-admin"}
        # keyed by every configured token (issue 13: a read token must not test guesses against it)
        key = b"r3ad\ns3cret-admin"
        fingerprint = "token:" + hmac.new(key, b"s3cret-admin", hashlib.sha256).hexdigest()[:12]
        assert fingerprint != "token:" + hashlib.sha256(b"s3cret-admin").hexdigest()[:12]
        assert (
            await api.put("/v1/routes/a", params=M, json={}, headers={"Authorization": "Bearer r3ad"})
        ).status_code == 403
        first = await api.put("/v1/routes/a", params=M, json={"budget": 0.2}, headers=admin)
        assert first.status_code == 201 and first.json()["history"]["actor"] == fingerprint
        named = await api.patch("/v1/routes/a", params=M, json={"budget": 0.3, "actor": "alice"}, headers=admin)
        assert named.json()["history"]["actor"] == f"{fingerprint} (note: alice)"  # a note, not the identity
        async with app.state.sessionmaker() as session:
            actors = (await session.scalars(select(ThresholdHistory.actor))).all()
        assert all("s3cret" not in a for a in actors)  # the token itself is never stored


async def test_a_named_token_is_the_actor_and_a_claimed_actor_only_a_note(make_api: MakeApi) -> None:
    async with make_api(tokens="alice=s3cret-admin:admin,padded==:read") as (app, api):
        assert app.state.token_names == {"s3cret-admin": "alice"}  # trailing base64 padding is no name
        admin = {"Authorization": "Bearer s3cret-admin"}
        first = await api.put("/v1/routes/a", params=M, json={"budget": 0.2}, headers=admin)
        assert first.json()["history"]["actor"] == "alice"
        spoofed = await api.patch("/v1/routes/a", params=M, json={"budget": 0.3, "actor": "bob"}, headers=admin)
        assert spoofed.json()["history"]["actor"] == "alice (note: bob)"
        assert (await api.get("/v1/routes", headers={"Authorization": "Bearer padded=="})).status_code == 200


async def test_401_and_403_bodies_name_the_field(make_api: MakeApi) -> None:
    async with make_api(tokens="r3ad:read") as (_app, api):
        missing = await api.get("/v1/routes")
        assert missing.status_code == 401
        assert missing.json()["detail"] == {"field": "authorization", "message": "missing or invalid bearer token"}
        denied = await api.post("/v1/controller/run", headers={"Authorization": "Bearer r3ad"})
        assert denied.status_code == 403
        assert denied.json()["detail"]["field"] == "authorization" and "admin" in denied.json()["detail"]["message"]


async def test_controller_run_ticks_now_and_reports_its_rows(make_api: MakeApi, call_factory: CallFactory) -> None:
    async with make_api() as (app, api):
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "c", 120, 0.4)})
        first = await api.post("/v1/controller/run")
        assert first.status_code == 200 and first.json()["ran"] is True
        [row] = first.json()["history"]
        assert row["route"] == "summarize" and row["samples"] == 120 and row["actor"] is None
        assert row["details"]["target_s"] is not None
        second = await api.post("/v1/controller/run")
        assert second.json()["history"][0]["previous_hedge_after_s"] == row["hedge_after_s"]
        assert await _rows(app) == 2


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    "field", ["budget", "default_hedge_after_s", "min_hedge_after_s", "max_hedge_after_s", "pinned_hedge_after_s"]
)
async def test_non_finite_numbers_are_422_saying_must_be_finite(make_api: MakeApi, field: str, literal: str) -> None:
    """Python's JSON reader takes ``NaN`` and ``Infinity``; ``{"budget": NaN}`` was answered
    "Input should be less than 1" (and ``-Infinity`` "greater than 0"), where the console says
    "must be finite". Every numeric route setting now gets the console's answer, by PUT and PATCH."""
    async with make_api() as (_app, api):
        assert (await api.put("/v1/routes/r", params=M, json={})).status_code == 201
        before = (await api.get("/v1/routes/r", params=M)).json()
        for method in ("patch", "put"):
            response = await api.request(
                method.upper(),
                "/v1/routes/r",
                params=M,
                content=f'{{"{field}": {literal}}}'.encode(),
                headers={"Content-Type": "application/json"},
            )
            assert response.status_code == 422, (method, response.text)
            assert response.json()["detail"] == {"field": field, "message": f"must be finite, got {literal}"}
        assert (await api.get("/v1/routes/r", params=M)).json() == before


async def _one_call_and_a_tick(
    api: httpx.AsyncClient, call_factory: CallFactory, tag: str
) -> Callable[[], Awaitable[tuple[float, str]]]:
    """Ingest one call of route ``summarize`` and run a tick; returns a reader of the published
    (hedge_after_s, source)."""
    await api.post("/v1/calls", json={"calls": _calls(call_factory, tag, 1, 0.3)})
    await api.post("/v1/controller/run")

    async def published() -> tuple[float, str]:
        t = (await api.get("/v1/thresholds/summarize", params=M)).json()
        return t["hedge_after_s"], t["source"]

    return published


async def test_unpinning_returns_a_route_with_too_few_samples_to_its_cold_start(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    """A pin is the operator's value, not the controller's: after ``--unpin`` a route whose
    samples are too few for a quantile is cold again (the lowest value its samples support,
    here the maximum), not the pinned value."""
    async with make_api() as (_app, api):
        published = await _one_call_and_a_tick(api, call_factory, "u")
        assert await published() == (30.0, "cold_start")
        await api.patch("/v1/routes/summarize", params=M, json={"pinned_hedge_after_s": 0.5})
        assert await published() == (0.5, "pinned")
        unpinned = await api.patch("/v1/routes/summarize", params=M, json={"pinned_hedge_after_s": None})
        assert unpinned.status_code == 200, unpinned.text
        history = unpinned.json()["history"]
        assert history["reason"] == "config,cold_start_supported,clamped_max" and history["applied"] is True
        assert (history["previous_hedge_after_s"], history["hedge_after_s"]) == (0.5, 30.0)
        assert await published() == (30.0, "cold_start")
        await api.post("/v1/controller/run")  # the next tick keeps the value
        assert (await published())[0] == 30.0
        # pinned, then disabled (the pin's value is kept, source "disabled"), then enabled and
        # unpinned in one change: cold again
        await api.patch("/v1/routes/summarize", params=M, json={"pinned_hedge_after_s": 0.7})
        await api.patch("/v1/routes/summarize", params=M, json={"enabled": False})
        assert await published() == (0.7, "disabled")
        await api.patch("/v1/routes/summarize", params=M, json={"enabled": True, "pinned_hedge_after_s": None})
        assert await published() == (30.0, "cold_start")


async def test_a_new_default_is_published_on_a_route_still_at_its_default(
    make_api: MakeApi, call_factory: CallFactory
) -> None:
    """A cold route whose samples support its default publishes it: a changed default is
    published at once while the samples support it, and a default kept by a tick stays
    labelled ``default`` (not ``controller``); a default below what they support is not."""
    async with make_api() as (_app, api):
        # 36 calls of 0.15-0.45 s: 0 of 36 past the slowest (upper bound 0.097 <= 0.10 at the
        # cold period's 97.5% per look)
        await api.post("/v1/calls", json={"calls": _calls(call_factory, "d", 36, 0.3)})
        await api.post("/v1/controller/run")

        async def published() -> tuple[float, str]:
            t = (await api.get("/v1/thresholds/summarize", params=M)).json()
            return t["hedge_after_s"], t["source"]

        assert await published() == (2.0, "default")
        await api.post("/v1/controller/run")
        assert await published() == (2.0, "default")
        changed = await api.patch("/v1/routes/summarize", params=M, json={"default_hedge_after_s": 1.0})
        assert changed.status_code == 200, changed.text
        history = changed.json()["history"]
        assert history["reason"] == "config,too_few_samples" and history["applied"] is True
        assert (history["previous_hedge_after_s"], history["hedge_after_s"]) == (2.0, 1.0)
        assert await published() == (1.0, "default")
        # 0.1 s lies below the samples: the lowest supported value, the slowest sample
        lower = await api.patch("/v1/routes/summarize", params=M, json={"default_hedge_after_s": 0.1})
        assert lower.json()["history"]["reason"] == "config,cold_start_supported"
        value, source = await published()
        # (the slowest sample as the tick reads it: older calls at their bucket's end)
        assert source == "cold_start" and 0.3 <= value <= 0.45 * BUCKET_RATIO
