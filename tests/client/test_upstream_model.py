"""``Upstream.model``: each upstream gets its own model name in the body of every attempt sent to
it (streamed and whole-response calls, the library and ``HedgingTransport``), while the record
keeps the caller's model name. The scripted server records the body each attempt carried."""

from __future__ import annotations

import json

import httpx
import pytest

from hedgerow.client import HedgePolicy, HedgingClient, HedgingTransport, Upstream
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse, usage_chunk

FAST = Script(pieces=sse(chunk("hi", role="assistant"), chunk(finish="stop"), usage_chunk(1, 1)))
# A primary that is silent long enough for the hedge (at 0.2 s) to start the backup.
SLOW = Script(pieces=sse(chunk("late", role="assistant"), chunk(finish="stop"), first_delay_s=3.0))
MESSAGE = {"role": "assistant", "content": "ok"}
WHOLE = Script(
    content_type="application/json",
    pieces=[
        (
            0,
            json.dumps(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [{"index": 0, "message": MESSAGE, "finish_reason": "stop"}],
                }
            ).encode(),
        )
    ],
)
POLICY = HedgePolicy(hedge_after_s=0.2, total_timeout_s=20.0)


def test_attempt_body_replaces_only_the_model() -> None:
    up = Upstream("a", "http://127.0.0.1:1/v1", model="upstream-m")
    sent = json.loads(up.attempt_body(b'{"model":"public","messages":[{"role":"user","content":"\xc3\xa9"}]}'))
    assert sent == {"model": "upstream-m", "messages": [{"role": "user", "content": "é"}]}
    plain = Upstream("b", "http://127.0.0.1:1/v1")
    assert plain.attempt_body(b'{"model":"public"}') == b'{"model":"public"}'
    assert up.attempt_body(b"not json") == b"not json"
    with pytest.raises(ValueError, match=r"Upstream\.model"):
        Upstream("c", "http://127.0.0.1:1/v1", model=" ")


async def test_library_stream_sends_each_upstream_its_model() -> None:
    async with ScriptedServer(SLOW) as slow, ScriptedServer(FAST) as fast:
        ups = [Upstream("slow", slow.base_url, model="slow-m"), Upstream("fast", fast.base_url, model="fast-m")]
        async with (
            HedgingClient(ups, route="r", policy=POLICY) as client,
            client.stream_chat({"model": "public", "messages": []}) as stream,
        ):
            async for _ in stream:
                pass
        assert slow.requests[0].json_body["model"] == "slow-m"
        assert fast.requests[0].json_body["model"] == "fast-m"
        assert stream.record is not None and stream.record.model == "public"
        assert stream.record.winner == "backup"  # the winning attempt's role


async def test_transport_unary_and_passthrough_apply_the_model() -> None:
    async with ScriptedServer(WHOLE) as server:
        transport = HedgingTransport([Upstream("a", server.base_url, model="up-m")], route="r", policy=POLICY)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.invalid/v1") as http:
            answer = await http.post("/chat/completions", json={"model": "public", "messages": []})
            assert answer.status_code == 200
            await http.post("/embeddings", json={"model": "public", "input": "x"})
        assert [r.json_body["model"] for r in server.requests] == ["up-m", "up-m"]
        assert [r.path for r in server.requests] == ["/v1/chat/completions", "/v1/embeddings"]


async def test_transport_stream_applies_the_model() -> None:
    async with ScriptedServer(FAST) as server:
        transport = HedgingTransport([Upstream("a", server.base_url, model="up-m")], route="r", policy=POLICY)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.invalid/v1") as http:
            body = {"model": "public", "messages": [], "stream": True}
            async with http.stream("POST", "/chat/completions", json=body) as response:
                text = (await response.aread()).decode()
        assert '"hi"' in text
        assert server.requests[0].json_body["model"] == "up-m"


def test_the_key_is_not_in_the_repr() -> None:
    assert "sk-hidden-0123" not in repr(Upstream("a", "http://127.0.0.1:1/v1", api_key="sk-hidden-0123"))
