"""``GET /v1/upstreams``: the per-upstream table over HTTP, its window rules and its scope.

Every test runs on SQLite and PostgreSQL (the ``database_url`` fixture).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from hedgerow.api.app import create_app
from hedgerow.settings import Settings
from tests.api.conftest import MakeApi
from tests.conftest import CallFactory


def _hedged(call_factory: CallFactory, i: int, now: datetime, *, backup_wins: bool, route: str = "r") -> dict[str, Any]:
    # primary "a" is slow; the backup "b" starts at 0.3 s and answers 0.2 s later when it wins
    primary_ttft = 0.9 if backup_wins else 0.4
    record = call_factory(
        f"h{i}",
        route=route,
        started_at=now - timedelta(seconds=60 + i),
        hedge_after_s=0.3,
        primary_ttft_s=primary_ttft,
        backup_ttft_s=0.2,
    )
    return record.to_dict()


async def test_the_table_over_http(make_api: MakeApi, call_factory: CallFactory) -> None:
    now = datetime.now(UTC)
    calls = [_hedged(call_factory, i, now, backup_wins=i % 4 != 0) for i in range(8)]
    calls += [call_factory(f"p{i}", route="r", started_at=now - timedelta(seconds=30)).to_dict() for i in range(4)]
    calls += [call_factory(f"o{i}", route="other", started_at=now - timedelta(seconds=30)).to_dict() for i in range(3)]
    calls += [call_factory("old", route="r", started_at=now - timedelta(days=2)).to_dict()]
    async with make_api() as (_app, api):
        assert (await api.post("/v1/calls", json={"calls": calls})).status_code == 202
        body = (await api.get("/v1/upstreams", params={"route": "r"})).json()
        assert body["route"] == "r" and body["hedges"] == 8 and not body["truncated"]
        assert body["since"].endswith("Z") and body["covered_from"].endswith("Z")
        a, b = body["upstreams"]
        assert (a["upstream"], a["attempts"], b["upstream"], b["attempts"]) == ("a", 12, "b", 8)
        assert a["hedges_caused"] == 8 and a["hedge_share"] == 1.0 and b["hedges_caused"] == 0
        assert (a["raced"], a["wins"], b["raced"], b["wins"]) == (8, 2, 8, 6)
        assert a["ttft_censored"] == 6 and b["ttft_censored"] == 2
        assert b["ttft_s"]["p50"]["value_s"] is not None and abs(b["ttft_s"]["p50"]["value_s"] - 0.2) < 0.01
        everything = (await api.get("/v1/upstreams")).json()
        assert everything["route"] is None and everything["upstreams"][0]["attempts"] == 15
        week = {"since": (now - timedelta(days=3)).isoformat(), "until": now.isoformat()}
        assert (await api.get("/v1/upstreams", params=week | {"route": "r"})).json()["upstreams"][0]["attempts"] == 13
        unknown = await api.get("/v1/upstreams", params={"route": "nobody"})
        assert unknown.status_code == 404 and unknown.json()["detail"]["field"] == "route"
        assert "unknown route 'nobody'" in unknown.json()["detail"]["message"]
        quiet = {
            "route": "r",
            "since": (now - timedelta(days=9)).isoformat(),
            "until": (now - timedelta(days=8)).isoformat(),
        }
        nothing = (await api.get("/v1/upstreams", params=quiet)).json()
        assert nothing["upstreams"] == [] and nothing["attempts"] == 0


async def test_bad_windows_are_422_naming_the_parameter(api: httpx.AsyncClient) -> None:
    now = datetime.now(UTC)
    cases = [
        ({"since": "2026-12-01T00:00:00"}, "since", "timezone"),
        ({"until": "2026-12-01T00:00:00"}, "until", "timezone"),
        ({"since": now.isoformat(), "until": (now - timedelta(hours=1)).isoformat()}, "since", "before until"),
        ({"since": (now - timedelta(days=40)).isoformat()}, "since", "at most 32 days"),
        ({"since": "yesterday"}, "since", "not an ISO 8601 time"),
        ({"until": "0.5"}, "until", "not an ISO 8601 time"),  # not read as a Unix time
        ({"until": "0001-01-01T12:00:00Z"}, "until", "outside years 1..9999"),
        ({"route": "a\x01b"}, "route", "control"),
        ({"limit": "0"}, "limit", ""),
        ({"since": "0001-01-01T00:00:00+05:00"}, "since", "out of range"),
    ]
    for params, field, words in cases:
        answer = await api.get("/v1/upstreams", params=params)
        assert answer.status_code == 422, (params, answer.text)
        detail = answer.json()["detail"]
        assert detail["field"] == field and words in detail["message"], (params, detail)


async def test_needs_the_read_scope(make_api: MakeApi) -> None:
    async with make_api(tokens="r3ad:read") as (_app, api):
        assert (await api.get("/v1/upstreams")).status_code == 401
        answer = await api.get("/v1/upstreams", headers={"Authorization": "Bearer r3ad"})
        assert answer.status_code == 200 and answer.json()["upstreams"] == []


def test_documented_in_openapi() -> None:
    doc = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:")).openapi()
    operation = doc["paths"]["/v1/upstreams"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/UpstreamTableOut"
    }
    assert operation["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/FieldError"
    }
    assert {"401", "403", "503"} <= set(operation["responses"])
    assert {p["name"] for p in operation["parameters"]} == {"since", "until", "route", "limit"}
    assert "win_rate" in doc["components"]["schemas"]["UpstreamOut"]["properties"]
