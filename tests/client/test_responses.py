"""The Responses API (``POST /v1/responses``) through ``HedgingClient`` and ``HedgingTransport``.

Recorded, byte-exact event streams (``tests/client/streams/responses/*.sse``, OpenAI's shapes:
``event:`` + ``data:`` pairs with ``sequence_number``, no ``[DONE]``) are served by the scripted
server on 127.0.0.1 with HTTP chunked encoding; the first output delta comes at 0.6 s, the first
answer delta of the reasoning stream at 1.2 s, everything before them in the first ~0.2 s.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from hedgerow.client import HedgePolicy, HedgingClient, HedgingTransport, StreamError, Upstream
from hedgerow.client._responses import classify_event
from tests.client.scripted_server import Script, ScriptedServer
from tests.client.sdk import async_sdk, sync_sdk
from tests.client.streams import chunked, split_events
from tests.helpers import Sink

STREAMS = Path(__file__).parent / "streams" / "responses"
BODY = {"model": "gpt-4.1-mini", "input": "hi"}
LATE_S = 1.5


def events(name: str) -> list[bytes]:
    return split_events((STREAMS / f"{name}.sse").read_bytes())


def event_type(block: bytes) -> str:
    return block.split(b"\n", 1)[0].removeprefix(b"event: ").decode()


def timed(blocks: list[bytes], first_delta_s: float = 0.6, answer_s: float | None = None) -> Script:
    """Non-delta events 0.02 s apart from 0; the first delta at ``first_delta_s``, the first
    output_text delta at ``answer_s`` (when given), later events 0.02 s apart."""
    pieces: list[tuple[float, bytes]] = []
    now = 0.0
    seen_delta = seen_answer = False
    for block in blocks:
        kind = event_type(block)
        at = now + 0.02 if pieces else 0.0
        if kind.endswith(".delta") and not seen_delta:
            at, seen_delta = max(at, first_delta_s), True
        if answer_s is not None and kind == "response.output_text.delta" and not seen_answer:
            at, seen_answer = max(at, answer_s), True
        pieces.append((at - now, block))
        now = at
    return Script(pieces=chunked(pieces), headers={"Transfer-Encoding": "chunked"})


def failing(kind: str) -> Script:
    """A stream that fails before any delta: created, in_progress, then ``kind``."""
    head = events("text")[:2]
    tail = {
        "response.failed": b'event: response.failed\ndata: {"type":"response.failed","sequence_number":2,'
        b'"response":{"id":"resp_x","status":"failed","error":{"code":"server_error","message":"boom"}}}\n\n',
        "error": b'event: error\ndata: {"type":"error","sequence_number":2,"code":"server_error",'
        b'"message":"The server had an error","param":null}\n\n',
        "response.incomplete": b'event: response.incomplete\ndata: {"type":"response.incomplete",'
        b'"sequence_number":2,"response":{"id":"resp_x","status":"incomplete",'
        b'"incomplete_details":{"reason":"max_output_tokens"},"usage":null}}\n\n',
    }[kind]
    return Script(
        pieces=chunked([(0.0, head[0]), (0.02, head[1]), (0.02, tail)]), headers={"Transfer-Encoding": "chunked"}
    )


def single(server: ScriptedServer, route: str = "default") -> HedgingClient:
    """A client with the one upstream ``u`` of ``server``, hedging far off (30 s)."""
    return HedgingClient([Upstream("u", server.base_url)], route=route, policy=HedgePolicy(hedge_after_s=30))


#: The SDK arguments shared by the async and sync clients here (no SDK retries).
SDK_ARGS: dict[str, Any] = {"base_url": "http://hedgerow.invalid/v1", "api_key": "x", "max_retries": 0}


def test_classify_event_rules() -> None:
    delta = {"type": "response.output_text.delta", "delta": "x"}
    assert classify_event(delta).token and classify_event(delta).answer
    reasoning = classify_event({"type": "response.reasoning_summary_text.delta", "delta": "x"})
    assert reasoning.token and not reasoning.answer
    assert classify_event({"type": "response.function_call_arguments.delta", "delta": "{"}).answer
    for kind in ("keepalive", "response.created", "response.in_progress", "response.output_item.added"):
        assert not classify_event({"type": kind}).token
    assert not classify_event({"type": "response.output_text.delta", "delta": ""}).token
    done = classify_event(
        {"type": "response.completed", "response": {"usage": {"input_tokens": 3, "output_tokens": 4}}}
    )
    assert done.finished == (0,) and done.usage == {"prompt_tokens": 3, "completion_tokens": 4}


async def test_text_stream_answer_timings_usage_and_record() -> None:
    async with ScriptedServer(timed(events("text"))) as server:
        async with HedgingClient(
            [Upstream("u", server.base_url)], route="ask", policy=HedgePolicy(hedge_after_s=30)
        ) as client:
            result = await client.responses(BODY)
        seen = server.requests[0]
    assert seen.path == "/v1/responses" and seen.body == {**BODY, "stream": True}
    assert result.text == "Grüße, Welt!"
    assert result.response is not None and result.response["status"] == "completed"
    record = result.record
    assert (record.api, record.route, record.status, record.winner) == ("responses", "ask", "ok", "primary")
    assert (record.prompt_tokens, record.completion_tokens) == (12, 4)
    assert record.ttft_s is not None
    assert 0.6 - 0.005 <= record.ttft_s <= 0.6 + LATE_S and record.ttfo_s == record.ttft_s
    assert record.to_dict()["api"] == "responses"


async def test_reasoning_keepalives_are_not_tokens_and_reasoning_is_ttft_not_ttfo() -> None:
    async with ScriptedServer(timed(events("reasoning"), answer_s=1.2)) as server, single(server) as client:
        result = await client.responses(BODY)
    assert (result.text, result.reasoning_text) == ("4.", "**Adding** two and two")
    record = result.record
    assert record.ttft_s is not None and record.ttfo_s is not None
    assert record.ttft_s >= 0.6 - 0.005 and 1.2 - 0.005 <= record.ttfo_s <= 1.2 + LATE_S
    # The answer is written 0.6 s after the reasoning (a stall of this process delays both): a
    # client that took the answer for the first token would give ttft_s == ttfo_s.
    assert record.ttft_s <= record.ttfo_s - 0.3
    assert record.completion_tokens == 70


async def test_function_call_arguments_are_tokens_and_cached_tokens_are_counted() -> None:
    async with ScriptedServer(timed(events("function_call"))) as server, single(server) as client:
        result = await client.responses(BODY)
    assert result.arguments == {"fc_68af3e11c0d481a0": '{"city":"Zürich"}'}
    assert result.record.ttft_s is not None and result.record.ttft_s >= 0.595
    assert result.record.attempts[0].cached_prompt_tokens == 32


async def test_keepalives_and_lifecycle_events_do_not_hold_off_a_hedge() -> None:
    # The primary sends created, in_progress, an item and keepalives, its first delta at 3 s;
    # the hedge is due at 0.5 s and the backup answers at once.
    async with (
        ScriptedServer(timed(events("reasoning"), first_delta_s=3.0)) as slow,
        ScriptedServer(timed(events("text"), first_delta_s=0.0)) as fast,
        HedgingClient(
            [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)], policy=HedgePolicy(hedge_after_s=0.5)
        ) as client,
    ):
        result = await client.responses(BODY)
        assert await slow.wait_disconnect(0, timeout_s=2.0) is not None  # the loser is closed
    record = result.record
    assert result.text == "Grüße, Welt!"
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    assert record.attempts[0].outcome == "cancelled" and record.attempts[0].first_token_s is None


@pytest.mark.parametrize("kind", ["response.failed", "error", "response.incomplete"])
async def test_a_failure_before_any_delta_fails_over(kind: str) -> None:
    async with (
        ScriptedServer(failing(kind)) as bad,
        ScriptedServer(timed(events("text"), first_delta_s=0.0)) as good,
        HedgingClient(
            [Upstream("a", bad.base_url), Upstream("b", good.base_url)], policy=HedgePolicy(hedge_after_s=30)
        ) as client,
    ):
        result = await client.responses(BODY)
    expected = {
        "response.failed": "response_failed",
        "error": "sse_error",
        "response.incomplete": "response_incomplete",
    }
    record = result.record
    assert result.text == "Grüße, Welt!" and record.status == "ok" and record.hedge_reason == "primary_error"
    assert [(a.outcome, a.error_type) for a in record.attempts] == [("failed", expected[kind]), ("won", None)]


async def test_incomplete_after_a_delta_is_a_finished_answer() -> None:
    blocks = events("text")
    incomplete = (
        blocks[-1]
        .replace(b"response.completed", b"response.incomplete")
        .replace(b'"status":"completed"', b'"status":"incomplete"')
    )
    async with ScriptedServer(timed([*blocks[:-1], incomplete])) as server, single(server) as client:
        result = await client.responses(BODY)
    assert result.record.status == "ok" and result.text == "Grüße, Welt!"


async def test_a_failure_after_a_delta_fails_the_call() -> None:
    blocks = events("text")
    failed = failing("response.failed").pieces[-2][1]  # the chunked frame of the failed event
    body = failed.split(b"\r\n", 1)[1].rsplit(b"\r\n", 1)[0]
    async with ScriptedServer(timed([*blocks[:6], body])) as server, single(server) as client:
        with pytest.raises(StreamError) as info:
            await client.responses(BODY)
    assert info.value.record is not None and info.value.record.error_type == "response_failed"


def non_streaming_response(text: str) -> Script:
    body: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "error": None,
        "model": "gpt-4.1-mini",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 5,
            "output_tokens": 2,
            "total_tokens": 7,
            "input_tokens_details": {"cached_tokens": 0},
        },
    }
    return Script(pieces=[(0.0, json.dumps(body).encode())], content_type="application/json", header_delay_s=0.0)


async def test_the_async_sdk_hedges_responses_streaming_and_not() -> None:
    sink = Sink()
    slow_stream = timed(events("text"), first_delta_s=4.0)
    slow_unary = non_streaming_response("slow")
    slow_unary.header_delay_s = 4.0

    def slow_for(index: int, seen: Any) -> Script:
        return slow_stream if seen.body and seen.body.get("stream") else slow_unary

    def fast_for(index: int, seen: Any) -> Script:
        return (
            timed(events("text"), first_delta_s=0.0)
            if seen.body and seen.body.get("stream")
            else non_streaming_response("fast")
        )

    async with ScriptedServer(slow_for) as slow, ScriptedServer(fast_for) as fast:
        transport = HedgingTransport(
            [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)],
            route="ask",
            policy=HedgePolicy(hedge_after_s=0.5),
            telemetry=sink,
        )
        client = async_sdk(transport, api_key="x")
        stream = await client.responses.create(model="gpt-4.1-mini", input="hi", stream=True)
        text = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
        answer = await client.responses.create(model="gpt-4.1-mini", input="hi")
        await client.close()
    assert text == "Grüße, Welt!" and answer.output_text == "fast"
    streamed, unary = sink.records
    assert (streamed.api, streamed.route, streamed.winner, streamed.hedge_reason) == (
        "responses",
        "ask",
        "backup",
        "ttft_timeout",
    )
    assert (unary.api, unary.route, unary.winner) == ("responses", "ask.unary", "backup")
    assert unary.completion_tokens == 2 and unary.prompt_tokens == 5
    assert [s.path for s in fast.requests] == ["/v1/responses", "/v1/responses"]


async def test_the_sync_sdk_hedges_a_streamed_response() -> None:
    sink = Sink()
    async with (
        ScriptedServer(timed(events("text"), first_delta_s=4.0)) as slow,
        ScriptedServer(timed(events("text"), first_delta_s=0.0)) as fast,
    ):
        transport = HedgingTransport(
            [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)],
            route="ask",
            policy=HedgePolicy(hedge_after_s=0.5),
            telemetry=sink,
        )

        def run() -> str:
            with sync_sdk(transport, api_key="x") as client:
                stream = client.responses.create(model="gpt-4.1-mini", input="hi", stream=True)
                return "".join(e.delta for e in stream if e.type == "response.output_text.delta")

        text = await asyncio.to_thread(run)
    assert text == "Grüße, Welt!"
    (record,) = sink.records
    assert (record.api, record.winner, record.status) == ("responses", "backup", "ok")
