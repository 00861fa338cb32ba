"""``GET /v1/routes/{route}/calls``: pages, filters, 422s naming the field, auth, OpenAPI."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.api.conftest import MakeApi
from tests.controller.calls_seed import explorer_records, with_clients

M = {"model": "m1"}


def _end() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)


async def _seed(api: httpx.AsyncClient, count: int, end: datetime | None = None, **where: str) -> datetime:
    end = end or _end()
    records = [r.to_dict() for r in explorer_records(end, count, **where)]
    answer = await api.post("/v1/calls", json={"calls": records})
    assert answer.status_code == 202 and answer.json()["accepted"] == count, answer.text
    return end


async def test_the_pages_walk_every_call_newest_first(api: httpx.AsyncClient) -> None:
    await _seed(api, 12)
    seen: list[str] = []
    params = M | {"limit": 5}
    for _ in range(10):
        answer = await api.get("/v1/routes/r/calls", params=params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["route"] == "r" and body["model"] == "m1" and body["retention_note"] is None
        assert body["scan_stopped_at"] is None
        seen += [call["request_id"] for call in body["calls"]]
        if body["next_cursor"] is None:
            break
        params = M | {"limit": 5, "cursor": body["next_cursor"]}
    assert seen == [f"c{i:04d}" for i in range(12)]


async def test_a_call_shows_its_attempts_and_the_upstream_that_won(api: httpx.AsyncClient) -> None:
    await _seed(api, 5)
    body = (await api.get("/v1/routes/r/calls", params={"outcome": "failover"})).json()  # model: the only one
    (call,) = body["calls"]
    assert call["outcome"] == "failover" and call["winner_upstream"] == "c" and call["hedge_reason"] == "primary_error"
    assert [(a["upstream"], a["role"], a["outcome"]) for a in call["attempts"]] == [
        ("a", "primary", "failed"),
        ("c", "backup", "won"),
    ]
    assert call["attempts"][0]["error_type"] == "http_503"


async def test_filters_combine(api: httpx.AsyncClient) -> None:
    end = await _seed(api, 20)
    answer = await api.get(
        "/v1/routes/r/calls",
        params=M
        | {
            "winner": "b",
            "since": (end - timedelta(minutes=10)).isoformat(),
            "until": end.isoformat().replace("+00:00", "Z"),
        },
    )
    assert [c["request_id"] for c in answer.json()["calls"]] == ["c0001", "c0006"]


async def test_a_window_older_than_retention_says_so(make_api: MakeApi) -> None:
    async with make_api(retention_s=86_400.0, max_window_s=3600.0) as (_app, api):
        await _seed(api, 2)
        old = (datetime.now(UTC) - timedelta(days=3)).isoformat()
        body = (await api.get("/v1/routes/r/calls", params=M | {"since": old})).json()
        assert body["retention_note"].startswith("Raw calls are kept 1 days")
        assert len(body["calls"]) == 2


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"outcome": "won"}, "outcome", "unknown outcome 'won'; outcomes: primary_won, hedge_won"),
        ({"limit": "501"}, "limit", "less than or equal to 500"),
        ({"limit": "0"}, "limit", "greater than or equal to 1"),
        ({"cursor": "junk"}, "cursor", "not a cursor of this api"),
        ({"since": "yesterday"}, "since", "datetime"),
        ({"since": "2026-12-03T10:00:00"}, "since", "must carry a timezone"),
        ({"until": "0001-01-01T00:00:00+05:00"}, "until", "out of range"),
        ({"since": "2026-12-03T10:00:00Z", "until": "2026-12-03T09:00:00Z"}, "since", "must not be after until"),
        ({"winner": "a\x01b"}, "winner", "control characters"),
        ({"client": "alice\x1b[31m"}, "client", "control characters"),
        ({"client": "k" * 201}, "client", "at most 200 characters"),
        ({"client": ""}, "client", "at least 1 character"),
    ],
)
async def test_bad_filters_are_422_naming_the_field(
    api: httpx.AsyncClient, params: dict[str, str], field: str, words: str
) -> None:
    await _seed(api, 1)
    answer = await api.get("/v1/routes/r/calls", params=M | params)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail["field"] == field and words in detail["message"], detail


async def test_unknown_routes_are_404_and_the_calls_path_is_read_only(api: httpx.AsyncClient) -> None:
    await _seed(api, 1)
    missing = await api.get("/v1/routes/nope/calls", params=M)
    assert missing.status_code == 404 and missing.json()["detail"]["field"] == "route"
    for method in ("PUT", "PATCH", "POST", "DELETE"):
        answer = await api.request(method, "/v1/routes/r/calls", params=M, json={})
        assert answer.status_code == 405 and answer.headers["allow"] == "GET", (method, answer.text)
    named = await api.put("/v1/routes/team/calls", params=M, json={})  # only ever via the 405 above
    assert named.status_code == 405


async def test_route_names_with_a_slash_and_a_calls_suffix(api: httpx.AsyncClient) -> None:
    await _seed(api, 3, route="team/summarize")
    body = (await api.get("/v1/routes/team/summarize/calls", params=M)).json()
    assert body["route"] == "team/summarize" and len(body["calls"]) == 3
    refused = await api.post("/v1/calls", json={"calls": [explorer_records(_end(), 1, route="x/calls")[0].to_dict()]})
    assert refused.status_code == 422 and "must not end in '/calls'" in refused.text


async def test_the_read_scope_is_needed(make_api: MakeApi) -> None:
    tokens = "reader=r-token:read,writer=w-token:ingest"
    async with make_api(tokens=tokens) as (_app, api):
        await api.post(
            "/v1/calls",
            json={"calls": [r.to_dict() for r in explorer_records(_end(), 1)]},
            headers={"Authorization": "Bearer w-token"},
        )
        assert (await api.get("/v1/routes/r/calls", params=M)).status_code == 401
        forbidden = await api.get("/v1/routes/r/calls", params=M, headers={"Authorization": "Bearer w-token"})
        assert forbidden.status_code == 403
        read = await api.get("/v1/routes/r/calls", params=M, headers={"Authorization": "Bearer r-token"})
        assert read.status_code == 200 and len(read.json()["calls"]) == 1


async def test_the_openapi_document_describes_the_endpoint(api: httpx.AsyncClient) -> None:
    document = (await api.get("/openapi.json")).json()
    operation = document["paths"]["/v1/routes/{route}/calls"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert names == {
        "route", "model", "since", "until", "outcome", "winner", "upstream", "failed_upstream", "client", "cursor",
        "limit",
    }  # fmt: skip
    outcome = next(p for p in operation["parameters"] if p["name"] == "outcome")
    assert "hedge_won" in str(outcome["schema"])
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/CallsPageOut")
    assert "CallAttemptOut" in document["components"]["schemas"]


async def test_an_attempt_on_an_upstream_failed_or_was_sent(api: httpx.AsyncClient) -> None:
    await _seed(api, 20)  # a fails in every failover (503, c wins) and every failed call (timeout)
    failed_on_a = (await api.get("/v1/routes/r/calls", params=M | {"failed_upstream": "a"})).json()["calls"]
    assert {c["outcome"] for c in failed_on_a} == {"failover", "failed"} and len(failed_on_a) == 8
    assert all(any(a["upstream"] == "a" and a["outcome"] == "failed" for a in c["attempts"]) for c in failed_on_a)
    assert (await api.get("/v1/routes/r/calls", params=M | {"failed_upstream": "c"})).json()["calls"] == []
    on_c = (await api.get("/v1/routes/r/calls", params=M | {"upstream": "c"})).json()["calls"]
    assert [c["outcome"] for c in on_c] == ["failover"] * 4
    both = await api.get("/v1/routes/r/calls", params=M | {"failed_upstream": "a", "outcome": "failed"})
    assert len(both.json()["calls"]) == 4
    bad = await api.get("/v1/routes/r/calls", params=M | {"failed_upstream": "a\x00"})
    assert bad.status_code == 422 and "failed_upstream" in bad.text


async def test_the_client_filter_keeps_one_callers_calls(api: httpx.AsyncClient) -> None:
    """Gateway calls carry the calling key's name as ``client``: the filter keeps that key's calls."""
    records = with_clients(explorer_records(_end(), 10), ["alice", "bob", None])
    answer = await api.post("/v1/calls", json={"calls": [r.to_dict() for r in records]})
    assert answer.status_code == 202, answer.text
    alice = (await api.get("/v1/routes/r/calls", params=M | {"client": "alice"})).json()["calls"]
    assert [c["request_id"] for c in alice] == ["c0000", "c0003", "c0006", "c0009"]
    assert {c["client"] for c in alice} == {"alice"}
    bob_hedges = await api.get("/v1/routes/r/calls", params=M | {"client": "bob", "outcome": "hedge_won"})
    assert [c["request_id"] for c in bob_hedges.json()["calls"]] == ["c0001"]
    assert (await api.get("/v1/routes/r/calls", params=M | {"client": "ALICE"})).json()["calls"] == []
