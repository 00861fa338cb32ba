"""No upstream key in any header the gateway passes on: an upstream that echoes its own key in a
response header (as well as its body) on a 401, a 200 whole or streamed, for chat, Responses and
pass-through paths (``/v1/embeddings``, ``GET /v1/models``), has it replaced by ``[redacted]``
in every header and body the caller receives. Real HTTP on loopback against a scripted upstream."""

from __future__ import annotations

import json
from typing import Any

import httpx

from hedgerow.client import HedgePolicy, Upstream
from hedgerow.gateway import GatewayApp, GatewayConfig, RouteSpec
from tests.client.scripted_server import Script, ScriptedServer, Seen, chunk, sse
from tests.gateway.conftest import FAKE_UPSTREAM_KEY, GatewayServer

ECHO = {"x-echo-auth": f"Bearer {FAKE_UPSTREAM_KEY}"}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
}

RESPONSES_DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
RESPONSES_DONE = (
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r","status":"completed"}}\n\n'
)


def whole(status: int, body: dict[str, Any]) -> Script:
    """A JSON answer with the echoing header."""
    return Script(status=status, content_type="application/json", headers=ECHO, pieces=[(0, json.dumps(body).encode())])


def echoing(index: int, seen: Seen) -> Script:
    """The upstream: 401 for the model ``refuse``, else a success of the path's kind, every
    answer with the upstream's key in a header."""
    body = seen.body or {}
    if body.get("model") == "refuse":
        return whole(401, {"error": {"message": f"bad key {FAKE_UPSTREAM_KEY}", "type": "x", "code": None}})
    if seen.path.endswith("/models"):
        return whole(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]})
    if seen.path.endswith("/embeddings"):
        return whole(200, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.0]}]})
    if body.get("stream") and seen.path.endswith("/responses"):
        return Script(headers=ECHO, pieces=[(0, RESPONSES_DELTA), (0, RESPONSES_DONE)])
    if body.get("stream"):
        return Script(headers=ECHO, pieces=sse(chunk("hi", role="assistant"), chunk(finish="stop")))
    return whole(200, COMPLETION)


async def test_an_upstream_key_in_a_response_header_reaches_the_caller_redacted() -> None:
    async with ScriptedServer(echoing) as upstream:
        spec = RouteSpec(
            None,
            "r-any",
            (Upstream("u", upstream.base_url, api_key=FAKE_UPSTREAM_KEY),),
            HedgePolicy(hedge_after_s=5.0, total_timeout_s=20.0),
        )
        app = GatewayApp(GatewayConfig(routes={}, any_model=spec))
        with GatewayServer(app) as server:
            base = server.base_url
            seen: list[httpx.Response] = []
            async with httpx.AsyncClient(timeout=30) as caller:
                for path in ("/chat/completions", "/responses"):
                    for model in ("refuse", "m"):
                        for stream in (False, True):
                            body: dict[str, Any] = {"model": model, "stream": stream}
                            if path == "/chat/completions":
                                body["messages"] = [{"role": "user", "content": "hi"}]
                            else:
                                body["input"] = "hi"
                            seen.append(await caller.post(base + path, json=body))
                seen.append(await caller.post(base + "/embeddings", json={"model": "m", "input": "hi"}))
                seen.append(await caller.get(base + "/models"))
    assert {r.status_code for r in seen} == {200, 401}, [(r.status_code, r.text) for r in seen]
    for response in seen:
        shown = f"{response.headers.multi_items()} {response.text}"
        assert FAKE_UPSTREAM_KEY not in shown, (response.request.url, shown)
        echoed = response.headers.get("x-echo-auth")
        assert echoed in (None, "Bearer [redacted]"), (response.request.url, shown)
    # hedgerow drops a streamed call's 4xx headers; every other answer carried the upstream's
    assert sum(r.headers.get("x-echo-auth") is not None for r in seen) == len(seen) - 2
