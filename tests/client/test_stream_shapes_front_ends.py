"""The 2025-26 stream shapes (``tests/client/streams``: ``null_frame``, ``null_tool_calls``,
``reasoning_mirrored``, the Gemini and tool-call index cases) through every other front end.

``test_conformance`` runs each recorded case through ``HedgingClient.chat`` and ``stream_chat``;
here the same bytes go through ``HedgingTransport`` under the real ``openai`` SDK (async and
sync), and a ``data: null`` frame through the Responses API, so one rule holds everywhere: a
frame without an object is skipped, a list of nulls is no token, a mirrored reasoning text is
assembled once, and a tool call's provider fields (Gemini's thought signature) reach the app
unchanged when the call was hedged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hedgerow.client import AnswerAssembler, HedgePolicy, HedgingClient, HedgingTransport, Upstream
from hedgerow.client.chunks import classify_chunk, reasoning_texts
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.client.sdk import MESSAGES, async_sdk, sync_sdk
from tests.client.streams import CASES_BY_NAME, chunked, split_events
from tests.helpers import BODY, Sink

NEW_SHAPES = [
    "null_frame",
    "null_tool_calls",
    "reasoning_mirrored",
    "gemini_tool_calls",
    "tool_index_missing",
    "tool_index_shifted",
    "tool_index_colliding",
]


def held_silent() -> Script:
    """A primary that sends its headers and a role-only chunk, then no token for 30 s."""
    return Script(pieces=sse(chunk(role="assistant"), chunk("late"), done=False, gap_s=30.0), close=False)


def assemble(chunks: list[dict[str, Any]]) -> AnswerAssembler:
    """The answer the app's chunks make, by the client's own assembly rules."""
    answer = AnswerAssembler()
    for item in chunks:
        answer.add(item)
    return answer


@pytest.mark.parametrize("name", NEW_SHAPES)
async def test_the_async_sdk_gets_every_chunk_of_each_new_shape_unchanged(name: str) -> None:
    case = CASES_BY_NAME[name]
    sink = Sink()
    async with ScriptedServer(case.script(scale=0.2)) as server:
        transport = HedgingTransport(
            [Upstream("u", server.base_url)], route="chat", policy=HedgePolicy(hedge_after_s=30.0), telemetry=sink
        )
        async with async_sdk(transport) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            received = [item.to_dict() async for item in stream]
    # the null frame is no chunk; every other chunk arrives as sent, provider fields included
    assert received == case.chunks()
    answer = assemble(received)
    assert (answer.text, answer.reasoning_text, answer.tool_calls) == (
        case.text,
        case.reasoning_text,
        list(case.tool_calls),
    )
    (record,) = sink.records
    assert (record.status, record.winner, record.completion_tokens) == ("ok", "primary", case.completion_tokens)


async def test_the_sync_sdk_reads_past_a_null_frame() -> None:
    case = CASES_BY_NAME["null_frame"]
    async with ScriptedServer(case.script(scale=0.2)) as server:
        transport = HedgingTransport([Upstream("u", server.base_url)], route="chat")

        def read() -> list[dict[str, Any]]:
            with sync_sdk(transport) as client:
                stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                return [item.to_dict() for item in stream]

        received = await asyncio.to_thread(read)
    assert received == case.chunks()
    assert assemble(received).text == "Four."


@pytest.mark.parametrize("name", ["gemini_tool_calls", "tool_index_missing"])
async def test_a_thought_signature_survives_a_hedge(name: str) -> None:
    # The primary never sends a token; the Gemini-shaped backup wins after the hedge at 0.3 s.
    case = CASES_BY_NAME[name]
    async with ScriptedServer(held_silent()) as primary, ScriptedServer(case.script(scale=0.0)) as backup:
        upstreams = [Upstream("a", primary.base_url), Upstream("b", backup.base_url)]
        async with HedgingClient(upstreams, policy=HedgePolicy(hedge_after_s=0.3)) as library:
            result = await library.chat(BODY)
        transport = HedgingTransport(upstreams, route="chat", policy=HedgePolicy(hedge_after_s=0.3))
        async with async_sdk(transport) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            received = [item async for item in stream]
    assert result.record.hedged and result.record.winner == "backup"
    assert result.tool_calls == list(case.tool_calls)
    signature = case.tool_calls[0]["extra_content"]
    assert result.tool_calls[0]["extra_content"] == signature
    # the SDK keeps the unknown field on its tool-call model
    calls = [call for item in received for choice in item.choices for call in (choice.delta.tool_calls or [])]
    assert signature in [(call.model_extra or {}).get("extra_content") for call in calls]


async def test_a_null_frame_in_a_responses_stream_is_skipped() -> None:
    blocks = split_events((Path(__file__).parent / "streams" / "responses" / "text.sse").read_bytes())
    # data: null after every event (a gateway's filler): the same answer, no failure
    pieces = [(0.01, piece) for block in blocks for piece in (block, b"data: null\n\n")]
    script = Script(pieces=chunked(pieces), headers={"Transfer-Encoding": "chunked"})
    async with (
        ScriptedServer(Script(pieces=chunked([(0.01, b) for b in blocks]))) as plain,
        ScriptedServer(script) as with_nulls,
    ):
        answers = []
        for server in (plain, with_nulls):
            async with HedgingClient([Upstream("u", server.base_url)], policy=HedgePolicy(hedge_after_s=30)) as client:
                answers.append(await client.responses({"model": "gpt-4.1-mini", "input": "hi"}))
    expected, got = answers
    assert got.record.status == "ok" and got.record.error_type is None
    assert got.text and (got.text, got.response, got.record.completion_tokens) == (
        expected.text,
        expected.response,
        expected.record.completion_tokens,
    )


def test_the_token_rules_for_lists_and_mirrored_fields() -> None:
    def delta(**fields: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

    not_tokens = [
        delta(tool_calls=[None]),
        delta(tool_calls=[None, None]),
        delta(tool_calls=[{}]),
        delta(tool_calls=[{"index": 0}]),
        delta(tool_calls=[{"index": 0, "type": "function", "function": {"name": "", "arguments": ""}}]),
        delta(tool_calls=[{"extra_content": {"google": {"thought_signature": "x"}}}]),
        delta(content=[None]),
    ]
    assert [classify_chunk(item).token for item in not_tokens] == [False] * len(not_tokens)
    tokens = [
        delta(tool_calls=[None, {"index": 0, "id": "call_1"}]),
        delta(tool_calls=[{"function": {"name": "f"}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}]),
    ]
    assert [classify_chunk(item).answer for item in tokens] == [True] * len(tokens)
    # one text in both fields: once; two texts: both, reasoning_content first
    assert reasoning_texts({"reasoning": "a", "reasoning_content": "a"}) == ["a"]
    assert reasoning_texts({"reasoning": "b", "reasoning_content": "a"}) == ["a", "b"]
    assert reasoning_texts({"reasoning": "", "reasoning_content": "a"}) == ["a"]
    answer = assemble([delta(reasoning="x", reasoning_content="y"), delta(reasoning="z", reasoning_content="z")])
    assert answer.reasoning_text == "yxz"
    # an empty fragment or a bare index makes no phantom call
    assert assemble([delta(tool_calls=[{}, {"index": 3}, None])]).tool_calls == []
