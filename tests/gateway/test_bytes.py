"""Byte pass-through: the caller gets the winner's own SSE bytes, re-encoded only where the
gateway sets the model name back to the public one (an upstream with its own ``model``)."""

from __future__ import annotations

import json

import httpx

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp
from tests.client.scripted_server import Script, ScriptedServer
from tests.gateway.conftest import GatewayServer, one_route

POLICY = HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0)
#: Data fields as an upstream might write them: odd spacing, key order, escapes and raw UTF-8
#: that a parse and re-encode would change, and a usage chunk the caller asked for.
DATA = [
    b'{"id":"c1", "object":"chat.completion.chunk","created":1,"model":"up-model",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    b'{ "choices" : [ {"index":0, "delta":{"content":"caf\\u00e9 \xc3\xa9t\xc3\xa9"}, "finish_reason":null} ],'
    b' "model":"up-model", "id":"c1", "extra": 1.50}',
    b'{"id":"c1","choices":[{"index":0,"delta":{"content":" \\ud83d\\ude00 tail"},"finish_reason":null}]}',
    b'{"id":"c1","model":"up-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b'{"id":"c1","model":"up-model","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}',
]
UPSTREAM_BODY = b"".join(b"data: " + d + b"\n\n" for d in DATA) + b"data: [DONE]\n\n"
STREAM = {
    "model": "gpt-fast",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


def events(body: bytes) -> list[bytes]:
    """The ``data`` fields of an SSE body written as ``data: ...`` + a blank line per event."""
    assert body.endswith(b"\n\n"), body[-40:]
    out = []
    for event in body[:-2].split(b"\n\n"):
        assert event.startswith(b"data: "), event
        out.append(event[len(b"data: ") :])
    return out


async def stream_through(upstream: Upstream, body: dict[str, object]) -> tuple[httpx.Response, bytes]:
    with GatewayServer(GatewayApp(one_route([upstream], policy=POLICY))) as server:
        async with (
            httpx.AsyncClient(timeout=30) as caller,
            caller.stream("POST", server.base_url + "/chat/completions", json=body) as response,
        ):
            received = b"".join([piece async for piece in response.aiter_raw()])
    return response, received


async def test_a_stream_is_the_winners_bytes_unchanged() -> None:
    # Split at awkward places: inside a chunk and inside a UTF-8 character.
    cut_a, cut_b = 40, UPSTREAM_BODY.index(b"\xc3\xa9t") + 1
    pieces = [(0.0, UPSTREAM_BODY[:cut_a]), (0.01, UPSTREAM_BODY[cut_a:cut_b]), (0.01, UPSTREAM_BODY[cut_b:])]
    async with ScriptedServer(Script(pieces=pieces)) as upstream:
        response, received = await stream_through(Upstream("a", upstream.base_url), STREAM)
    assert response.status_code == 200
    assert response.headers["x-hedgerow-winner"] == "a"
    assert received == UPSTREAM_BODY  # byte for byte, the usage chunk included (it was asked for)


async def test_only_chunks_naming_the_upstreams_own_model_are_re_encoded() -> None:
    async with ScriptedServer(Script(pieces=[(0.0, UPSTREAM_BODY)])) as upstream:
        response, received = await stream_through(Upstream("a", upstream.base_url, model="up-model"), STREAM)
    assert response.status_code == 200
    sent = upstream.requests[0].body
    assert sent is not None and sent["model"] == "up-model"  # the upstream got its own model name
    got = events(received)
    assert got[-1] == b"[DONE]"
    assert len(got) == len(DATA) + 1
    for original, passed in zip(DATA, got, strict=False):
        before = json.loads(original)
        if "model" in before:  # re-encoded, with the public model name and nothing else changed
            assert json.loads(passed) == {**before, "model": "gpt-fast"}
            assert b"up-model" not in passed
        else:
            assert passed == original


async def test_a_whole_answer_gets_the_public_model_name_back() -> None:
    answer = {
        "id": "c2",
        "object": "chat.completion",
        "created": 1,
        "model": "up-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    script = Script(content_type="application/json", pieces=[(0.0, json.dumps(answer).encode())])
    async with ScriptedServer(script) as upstream:
        config = one_route([Upstream("a", upstream.base_url, model="up-model")], policy=POLICY)
        with GatewayServer(GatewayApp(config)) as server:
            async with httpx.AsyncClient(timeout=30) as caller:
                plain = {"model": "gpt-fast", "messages": [{"role": "user", "content": "hi"}]}
                response = await caller.post(server.base_url + "/chat/completions", json=plain)
    assert response.status_code == 200
    assert response.json() == {**answer, "model": "gpt-fast"}
