"""The replica's Responses API (``POST /v1/responses``): event sequence, whole response, validation."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.sim.conftest import StartReplica

BODY = {"model": "m1", "input": "hello"}


def parse_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data object)`` of every event of an SSE body, in order."""
    out: list[tuple[str, dict[str, Any]]] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        names = [ln[len("event: ") :] for ln in lines if ln.startswith("event: ")]
        datas = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
        assert len(names) == 1 and len(datas) == 1, f"event without one name and one data: {block!r}"
        out.append((names[0], json.loads(datas[0])))
    return out


@pytest.mark.parametrize(("tokens_per_chunk", "limited"), [(1, False), (4, True)])
async def test_stream_event_sequence(start_replica: StartReplica, tokens_per_chunk: int, limited: bool) -> None:
    rep = start_replica(name="r1", time_scale=0.02, tokens_per_chunk=tokens_per_chunk)
    body = {**BODY, "stream": True, "hedgerow_prompt_tokens": 300, "instructions": "be brief"}
    body |= {"max_output_tokens": 11} if limited else {"hedgerow_output_tokens": 11}
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("POST", f"{rep.base_url}/responses", json=body, headers={"X-Request-ID": "rid-1"}) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-request-id"] == "rid-1" and resp.headers["x-hedgerow-replica"] == "r1"
        writes = [piece async for piece in resp.aiter_text()]
    events = parse_events("".join(writes))
    names = [name for name, _ in events]
    status = "incomplete" if limited else "completed"
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{status}",
    ]
    for name, data in events:
        assert data["type"] == name
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    # The message opens in the same write as the first delta (reads may merge writes, never split them).
    opening = next(w for w in writes if "response.output_item.added" in w)
    assert "response.output_text.delta" in opening
    tokens = [d["delta"].count("tok ") for d in deltas]
    assert sum(tokens) == 11 and tokens[0] == 1 and all(t == tokens_per_chunk for t in tokens[1:-1])
    created = events[0][1]["response"]
    final = events[-1][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    item_id = events[2][1]["item"]["id"]
    assert {d["item_id"] for d in deltas} == {item_id} and created["id"] == final["id"]
    assert final["status"] == status and final["model"] == "m1" and final["instructions"] == "be brief"
    assert final["incomplete_details"] == ({"reason": "max_output_tokens"} if limited else None)
    assert final["output"][0]["id"] == item_id and final["output"][0]["content"][0]["text"] == "tok " * 11
    assert final["usage"]["input_tokens"] == 300 and final["usage"]["output_tokens"] == 11
    assert final["usage"]["total_tokens"] == 311
    assert events[-4][1]["text"] == "tok " * 11


async def test_whole_response(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=0.02)
    body = {"model": "m1", "input": [{"role": "user", "content": [{"type": "input_text", "text": "x" * 400}]}]}
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/responses", json={**body, "max_output_tokens": 7})
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert resp.status_code == 200
    data = resp.json()
    assert data["object"] == "response" and data["id"].startswith("resp_")
    assert data["status"] == "incomplete" and data["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = data["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [{"type": "output_text", "annotations": [], "logprobs": [], "text": "tok " * 7}]
    assert data["usage"]["input_tokens"] == 100 and data["usage"]["output_tokens"] == 7
    assert stats["finished"] == 1 and stats["aborted"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m1"}, "input"),
        ({"input": "hi"}, "model"),
        ({**BODY, "input": []}, "input"),
        ({**BODY, "input": [3]}, "input[0]"),
        ({**BODY, "max_output_tokens": 0}, "max_output_tokens"),
        ({**BODY, "hedgerow_output_tokens": "ten"}, "hedgerow_output_tokens"),
        ({**BODY, "instructions": 5}, "instructions"),
        ({**BODY, "stream": "yes"}, "stream"),
        ({**BODY, "hedgerow_prompt_tokens": -1}, "hedgerow_prompt_tokens"),
        ([1, 2], "body"),
    ],
)
async def test_bad_body_is_422_naming_the_field(start_replica: StartReplica, body: object, field: str) -> None:
    rep = start_replica()
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/responses", json=body)
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert resp.status_code == 422
    err = resp.json()["error"]
    assert err["param"] == field and err["message"].startswith(field)
    assert stats["submitted"] == 0


async def test_error_rate_answers_503_at_once(start_replica: StartReplica) -> None:
    rep = start_replica(error_rate=1.0, seed=3)
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/responses", json={**BODY, "stream": True})
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "server_error"


async def test_a_client_that_leaves_mid_stream_aborts_the_request(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=1.0)  # 129 tokens at full speed: seconds of decoding left
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("POST", f"{rep.base_url}/responses", json={**BODY, "stream": True}) as resp:
            async for piece in resp.aiter_text():
                if "response.output_text.delta" in piece:
                    break
        for _ in range(100):
            stats = (await client.get(f"{rep.url}/stats")).json()
            if stats["aborted"] == 1:
                break
            await asyncio.sleep(0.05)
    assert stats["aborted"] == 1 and stats["finished"] == 0
