"""The replica's HTTP surface: SSE chunk sequence, non-streaming answer, validation, errors."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.sim.conftest import StartReplica

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hello"}]}


def parse_sse(raw: str) -> list[str]:
    """Data payloads of an SSE body, in order."""
    out = []
    for event in raw.split("\n\n"):
        if not event.strip():
            continue
        lines = [ln for ln in event.split("\n") if ln.startswith("data:")]
        assert lines, f"event without data: {event!r}"
        out.append("\n".join(ln[5:].strip() for ln in lines))
    return out


@pytest.mark.parametrize("tokens_per_chunk", [1, 4])
async def test_stream_chunk_sequence(start_replica: StartReplica, tokens_per_chunk: int) -> None:
    rep = start_replica(name="r1", time_scale=0.02, tokens_per_chunk=tokens_per_chunk)
    body = {
        **BODY,
        "stream": True,
        "max_tokens": 11,
        "hedgerow_prompt_tokens": 300,
        "stream_options": {"include_usage": True},
    }
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("POST", f"{rep.base_url}/chat/completions", json=body, headers={"X-Request-ID": "rid-1"}) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-request-id"] == "rid-1"
        assert resp.headers["x-hedgerow-replica"] == "r1"
        writes = [piece async for piece in resp.aiter_text()]
    raw = "".join(writes)
    # The role chunk travels in the same write as the first token's chunk, not before it.
    assert writes[0].count("data:") >= 2
    datas = parse_sse(raw)
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == "m1" and c["id"].startswith("chatcmpl-") and isinstance(c["created"], int)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"].get("content")]
    tokens = [c["choices"][0]["delta"]["content"].count("tok ") for c in content]
    assert sum(tokens) == 11
    assert tokens[0] == 1  # the first token alone
    assert all(t == tokens_per_chunk for t in tokens[1:-1])
    assert 1 <= tokens[-1] <= tokens_per_chunk
    final, usage = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["delta"] == {}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 300, "completion_tokens": 11, "total_tokens": 311}
    assert len(chunks) == 1 + len(content) + 2


async def test_stream_without_usage_and_stop_reason(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=0.02)
    body = {**BODY, "stream": True, "max_tokens": 50, "hedgerow_output_tokens": 3}
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/chat/completions", json=body)
    datas = parse_sse(resp.text)
    chunks = [json.loads(d) for d in datas[:-1]]
    assert datas[-1] == "[DONE]"
    assert all(c["choices"] for c in chunks)  # no usage chunk
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert sum(c["choices"][0]["delta"].get("content", "").count("tok ") for c in chunks) == 3


async def test_non_streaming(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=0.02)
    body = {**BODY, "messages": [{"role": "user", "content": "x" * 400}], "max_completion_tokens": 7}
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/chat/completions", json=body, headers={"X-Request-ID": "r2"})
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert resp.status_code == 200 and resp.headers["x-request-id"] == "r2"
    data = resp.json()
    assert data["object"] == "chat.completion"
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"].count("tok ") == 7
    assert choice["finish_reason"] == "length"
    assert data["usage"] == {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}
    assert stats["finished"] == 1 and stats["admitted"] == 1 and stats["aborted"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m1"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({**BODY, "messages": []}, "messages"),
        ({**BODY, "max_tokens": 0}, "max_tokens"),
        ({**BODY, "max_tokens": "ten"}, "max_tokens"),
        ({**BODY, "max_completion_tokens": -3}, "max_completion_tokens"),
        ({**BODY, "stream": "yes"}, "stream"),
        ({**BODY, "hedgerow_prompt_tokens": -1}, "hedgerow_prompt_tokens"),
        ({**BODY, "messages": [{"content": "no role"}]}, "messages[0].role"),
        ([1, 2], "body"),
    ],
)
async def test_bad_body_is_422_naming_the_field(start_replica: StartReplica, body: object, field: str) -> None:
    rep = start_replica()
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/chat/completions", json=body)
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert resp.status_code == 422
    err = resp.json()["error"]
    assert err["param"] == field
    assert err["message"].startswith(field)
    assert stats["submitted"] == 0


async def test_invalid_json_is_422(start_replica: StartReplica) -> None:
    rep = start_replica()
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(
            f"{rep.base_url}/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert resp.status_code == 422 and resp.json()["error"]["param"] == "body"


async def test_error_rate_answers_503_at_once(start_replica: StartReplica) -> None:
    rep = start_replica(error_rate=1.0, seed=3)
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{rep.base_url}/chat/completions", json={**BODY, "stream": True})
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert resp.status_code == 503
    assert resp.json()["error"]["type"] == "server_error"
    assert stats["rejected"] == 1 and stats["submitted"] == 0


async def test_models_healthz_stats(start_replica: StartReplica) -> None:
    rep = start_replica(name="r9", max_batch=8)
    async with httpx.AsyncClient(timeout=10) as client:
        models = (await client.get(f"{rep.base_url}/models")).json()
        health = (await client.get(f"{rep.url}/healthz")).json()
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "llama2-70b"
    assert health == {"status": "ok"}
    assert stats["name"] == "r9" and stats["max_batch"] == 8 and stats["waiting"] == 0


async def test_stall_delays_one_chunk(start_replica: StartReplica) -> None:
    rep = start_replica(time_scale=0.01, stall_rate=1.0, stall_s=0.5, seed=1)
    body = {**BODY, "stream": True, "max_tokens": 5}
    gaps = []
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("POST", f"{rep.base_url}/chat/completions", json=body) as resp:
            last = time.monotonic()
            async for _ in resp.aiter_text():
                now = time.monotonic()
                gaps.append(now - last)
                last = now
        stats = (await client.get(f"{rep.url}/stats")).json()
    assert max(gaps[1:]) >= 0.45  # the stall happens after the first token
    assert stats["stalls"] == 1


def test_listening_socket_is_tcp_proto(start_replica: StartReplica) -> None:
    # asyncio turns TCP_NODELAY on only for accepted sockets whose proto is TCP; without it,
    # Nagle + delayed ACK hold each small SSE write back by ~40 ms on a keep-alive connection.
    import socket

    rep = start_replica()
    assert rep._sock is not None and rep._sock.proto == socket.IPPROTO_TCP


async def test_put_slowdown_changes_service_times_from_the_next_step(start_replica: StartReplica) -> None:
    rep = start_replica(name="r5", time_scale=0.01)
    body = {**BODY, "max_tokens": 5, "hedgerow_prompt_tokens": 512}

    async def busy_s_of_one_request(client: httpx.AsyncClient) -> float:
        before: float = (await client.get(f"{rep.url}/stats")).json()["busy_s"]
        assert (await client.post(f"{rep.base_url}/chat/completions", json=body)).status_code == 200
        return float((await client.get(f"{rep.url}/stats")).json()["busy_s"]) - before

    async with httpx.AsyncClient(timeout=10) as client:
        normal = await busy_s_of_one_request(client)
        changed = await client.put(f"{rep.url}/slowdown", json={"slowdown": 3.0})
        assert changed.status_code == 200 and changed.json() == {"name": "r5", "slowdown": 3.0}
        slow = await busy_s_of_one_request(client)
        assert (await client.get(f"{rep.url}/stats")).json()["slowdown"] == 3.0
        for bad in ({"slowdown": 0}, {"slowdown": -1}, {"slowdown": "fast"}, {"slowdown": True}, {}, [1]):
            refused = await client.put(f"{rep.url}/slowdown", json=bad)
            assert refused.status_code == 422 and refused.json()["error"]["param"] == "slowdown", bad
        not_json = await client.put(f"{rep.url}/slowdown", content=b"{")
        assert not_json.status_code == 422 and not_json.json()["error"]["param"] == "body"
        assert (await client.get(f"{rep.url}/stats")).json()["slowdown"] == 3.0  # refusals changed nothing
    # busy_s adds the simulated step times (one prefill, four decode steps), not wall time.
    assert slow == pytest.approx(3 * normal, rel=1e-3)


async def test_stats_say_when_the_embedded_speed_table_is_in_use(
    start_replica: StartReplica, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hedgerow.sim import perf_model

    with_file = start_replica(name="f")
    monkeypatch.setattr(perf_model, "default_perf_model_path", lambda repo_root=None: None)
    embedded = start_replica(name="e")
    async with httpx.AsyncClient(timeout=10) as client:
        file_stats = (await client.get(f"{with_file.url}/stats")).json()
        embedded_stats = (await client.get(f"{embedded.url}/stats")).json()
    assert embedded_stats["perf_model_embedded"] is True and "embedded table" in embedded_stats["perf_model"]
    if "splitwise_perf_model.csv" in file_stats["perf_model"]:  # the shared CSV is present here
        assert file_stats["perf_model_embedded"] is False
