"""``HedgingTransport`` under the real ``openai`` SDK, against real servers on 127.0.0.1.

Hedging races use simulated replicas (``hedgerow.sim``): a sick one (``slowdown=100``: first
token after ~5 s, whole answer after ~15 s) as primary and a healthy one (first token in ~0.05 s)
as backup, with ``hedge_after_s=0.5``; the orderings are seconds apart, safe on a loaded machine.
Headers, paths and failures use the scripted server, which records what it was sent.
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from hedgerow.client import (
    AllAttemptsFailed,
    HedgePolicy,
    HedgingTransport,
    Upstream,
)
from hedgerow.client.hedging import attempt_request_id
from hedgerow.client.records import AttemptRole
from hedgerow.client.transport import rebase_path
from hedgerow.sim import ReplicaConfig, ReplicaThread
from tests.client.conftest import Replicas
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse, usage_chunk
from tests.client.sdk import BASE_URL, MESSAGES, async_sdk
from tests.helpers import Sink, free_port


def sdk(transport: HedgingTransport, base_url: str = BASE_URL) -> openai.AsyncOpenAI:
    """The app's client: the real SDK, only ``http_client`` differs; no SDK retries."""
    return async_sdk(transport, base_url=base_url)


def answer_script(text_pieces: list[str], first_delay_s: float = 0.0, gap_s: float = 0.01) -> Script:
    chunks = [chunk(text_pieces[0], role="assistant")] + [chunk(t) for t in text_pieces[1:]]
    chunks += [chunk(finish="stop"), usage_chunk(3, len(text_pieces))]
    return Script(pieces=sse(*chunks, first_delay_s=first_delay_s, gap_s=gap_s))


def completion_script(text: str, header_delay_s: float = 0.0) -> Script:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    return Script(
        pieces=[(0, json.dumps(body).encode())], content_type="application/json", header_delay_s=header_delay_s
    )


def error_script(status: int, message: str) -> Script:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return Script(status=status, content_type="application/json", pieces=[(0, json.dumps(body).encode())])


@pytest.fixture
async def hedged(replicas: Replicas) -> AsyncIterator[tuple[openai.AsyncOpenAI, Sink]]:
    """The SDK over a transport whose primary is the slow replica."""
    slow, fast = replicas
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("slow", slow.base_url, api_key="k-slow"), Upstream("fast", fast.base_url, api_key="k-fast")],
        route="chat",
        policy=HedgePolicy(hedge_after_s=0.5),
        telemetry=sink,
    )
    client = sdk(transport)
    yield client, sink
    await client.close()


# -- sim replicas: hedging through the SDK --------------------------------------------------------


async def test_stream_hedges_and_fast_replica_wins(hedged: tuple[openai.AsyncOpenAI, Sink]) -> None:
    client, sink = hedged
    t0 = time.monotonic()
    raw = await client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, stream=True, max_tokens=5
    )
    headers_s = time.monotonic() - t0
    assert raw.headers["x-hedgerow-winner"] == "fast"
    assert raw.headers["x-hedgerow-hedged"] == "true"
    assert raw.headers["x-hedgerow-replica"] == "fast"  # the winner's own headers come along
    request_id = raw.headers["x-hedgerow-request-id"]
    # The response (headers) arrives with the winner's first token: after the hedge, long
    # before the sick primary's first token (~5 s).
    assert 0.45 <= headers_s < 3.0
    text, finish, chunks = "", None, []
    async for c in raw.parse():
        chunks.append(c)
        if c.choices and c.choices[0].delta.content:
            text += c.choices[0].delta.content
        if c.choices and c.choices[0].finish_reason:
            finish = c.choices[0].finish_reason
    assert text == "tok " * 5 and finish == "length"
    # The caller did not ask for usage: the usage-only chunk the client asked for is withheld.
    assert all(c.choices for c in chunks)
    assert len(sink.records) == 1
    record = sink.records[0]
    assert record.request_id == request_id and record.route == "chat"
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    assert record.status == "ok" and record.completion_tokens == 5
    primary, backup = record.attempts
    assert (primary.upstream, primary.outcome, primary.first_token_s) == ("slow", "cancelled", None)
    assert (backup.upstream, backup.outcome) == ("fast", "won")


async def test_stream_without_hedge_passes_usage_when_asked(replicas: Replicas) -> None:
    slow, fast = replicas
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("fast", fast.base_url), Upstream("slow", slow.base_url)],
        route="chat",
        policy=HedgePolicy(hedge_after_s=2.0),
        telemetry=sink,
    )
    async with sdk(transport) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=True, max_tokens=3, stream_options={"include_usage": True}
        )
        assert raw.headers["x-hedgerow-hedged"] == "false" and raw.headers["x-hedgerow-winner"] == "fast"
        chunks = [c async for c in raw.parse()]
    assert chunks[-1].usage is not None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    (record,) = sink.records
    assert not record.hedged and record.winner == "primary" and record.status == "ok"


async def test_non_streaming_call_hedges_on_the_whole_response(hedged: tuple[openai.AsyncOpenAI, Sink]) -> None:
    client, sink = hedged
    t0 = time.monotonic()
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=5)
    elapsed = time.monotonic() - t0
    completion = raw.parse()
    assert completion.choices[0].message.content == "tok " * 5
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert raw.headers["x-hedgerow-winner"] == "fast" and raw.headers["x-hedgerow-hedged"] == "true"
    assert 0.45 <= elapsed < 5.0  # the sick replica needs ~15 s for the whole answer
    (record,) = sink.records
    assert record.route == "chat.unary" and record.request_id == raw.headers["x-hedgerow-request-id"]
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    assert record.status == "ok" and record.ttft_s == record.e2e_s and record.tpot_s is None
    assert record.completion_tokens == 5 and record.prompt_tokens is not None
    assert [a.outcome for a in record.attempts] == ["cancelled", "won"]


async def test_other_paths_pass_through_to_the_primary(
    hedged: tuple[openai.AsyncOpenAI, Sink], replicas: Replicas
) -> None:
    client, sink = hedged
    raw = await client.models.with_raw_response.list()
    page = raw.parse()
    assert [m.id for m in page.data] and raw.headers["x-hedgerow-replica"] == "slow"
    assert raw.headers["x-hedgerow-winner"] == "slow" and raw.headers["x-hedgerow-hedged"] == "false"
    assert "x-hedgerow-request-id" in raw.headers
    assert sink.records == []  # not a chat call: no record


# -- scripted servers: what the upstreams see ----------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_path_rebased_key_replaced_headers_forwarded(stream: bool) -> None:
    script = answer_script(["he", "llo"]) if stream else completion_script("hello")
    async with ScriptedServer(script) as a, ScriptedServer(script) as b:
        sink = Sink()
        transport = HedgingTransport(
            [
                Upstream("a", f"http://127.0.0.1:{a.port}/gateway/v1", api_key="key-a", headers={"X-Tenant": "t1"}),
                Upstream("b", b.base_url, api_key="key-b"),
            ],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        async with sdk(transport, base_url="http://anything.invalid/some/prefix/v1") as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="m",
                messages=MESSAGES,
                stream=stream,
                extra_headers={"X-App": "demo"},
                extra_query={"api-version": "7"},
            )
            parsed = raw.parse()
            text: str | None
            if stream:
                assert isinstance(parsed, openai.AsyncStream)
                text = "".join([c.choices[0].delta.content or "" async for c in parsed if c.choices])
            else:
                assert isinstance(parsed, ChatCompletion)
                text = parsed.choices[0].message.content
        assert text == "hello"
        assert b.requests == []
        (seen,) = a.requests
        assert seen.path == "/gateway/v1/chat/completions?api-version=7"
        assert seen.headers["authorization"] == "Bearer key-a"
        assert "caller-key" not in json.dumps(seen.headers)
        assert seen.headers["x-tenant"] == "t1" and seen.headers["x-app"] == "demo"
        request_id = raw.headers["x-hedgerow-request-id"]
        assert seen.headers["idempotency-key"] == request_id
        assert seen.headers["x-request-id"] == attempt_request_id(request_id, "primary")
        assert str(uuid.UUID(seen.headers["x-request-id"])) == seen.headers["x-request-id"]
        assert seen.headers["x-hedgerow-attempt"] == "primary"
        assert seen.json_body["messages"] == MESSAGES and seen.json_body["model"] == "m"
        if stream:
            assert seen.json_body["stream"] is True and seen.json_body["stream_options"] == {"include_usage": True}
        else:
            assert seen.json_body.get("stream") in (None, False)
        (record,) = sink.records
        assert record.request_id == request_id and record.status == "ok" and not record.hedged


async def test_explicit_base_path() -> None:
    async with ScriptedServer(completion_script("ok")) as a:
        transport = HedgingTransport(
            [Upstream("a", a.base_url)], route="chat", policy=HedgePolicy(), base_path="/openai"
        )
        async with sdk(transport, base_url="http://gw.invalid/openai") as client:
            done = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert done.choices[0].message.content == "ok"
            assert a.requests[0].path == "/v1/chat/completions"
            with pytest.raises(openai.NotFoundError):  # the SDK's own paths are all under its base
                await client.get("http://gw.invalid/elsewhere/models", cast_to=object)
        transport = HedgingTransport(
            [Upstream("a", a.base_url)], route="chat", policy=HedgePolicy(), base_path="/openai"
        )
        async with httpx.AsyncClient(transport=transport) as http:
            response = await http.get("http://gw.invalid/elsewhere/models")
        assert response.status_code == 404
        assert "/elsewhere/models" in response.json()["error"]["message"]
        assert len(a.requests) == 1


@pytest.mark.parametrize(
    ("path", "base_path", "expected"),
    [
        ("/v1/chat/completions", None, "/chat/completions"),
        ("/proxy/v1/chat/completions", None, "/chat/completions"),
        ("/v1", None, ""),
        ("/chat/completions", None, "/chat/completions"),
        ("/a/v1/b/v1/models", None, "/b/v1/models"),
        ("/openai/chat/completions", "/openai", "/chat/completions"),
        ("/openai/chat/completions", "/openai/", "/chat/completions"),
        ("/openaiX/chat/completions", "/openai", None),
        ("/other/models", "/openai", None),
    ],
)
def test_rebase_path(path: str, base_path: str | None, expected: str | None) -> None:
    assert rebase_path(path, base_path) == expected


async def aborted_upstream_requests(replica: ReplicaThread, timeout_s: float = 5.0) -> int:
    """Wait until the replica runs nothing; return how many requests it aborted (disconnects)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as http:
        while True:
            stats = (await http.get(f"{replica.url}/stats")).json()
            if (stats["running"] == 0 and stats["waiting"] == 0) or time.monotonic() > deadline:
                aborted: int = stats["aborted"]
                return aborted
            await asyncio.sleep(0.05)


@pytest.fixture
def long_replica() -> Iterator[ReplicaThread]:
    """A fresh healthy replica (its counters are this test's alone)."""
    with ReplicaThread(ReplicaConfig(name="long")) as replica:
        yield replica


async def test_closing_the_stream_early_cancels_the_call(long_replica: ReplicaThread) -> None:
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("long", long_replica.base_url)], route="chat", policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink
    )
    async with sdk(transport) as client:
        # 3,000 tokens take the replica over a minute: only a cancellation ends it early.
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=3000)
        got = []
        async with stream:
            async for c in stream:
                if c.choices and c.choices[0].delta.content:
                    got.append(c.choices[0].delta.content)
                if len(got) == 2:
                    break
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("hedgerow-") and not t.done()]
        assert await aborted_upstream_requests(long_replica) == 1
    assert got == ["tok ", "tok "]
    (record,) = sink.records
    assert record.status == "cancelled" and record.winner == "primary"
    assert record.completion_tokens is not None and record.completion_tokens < 100


@pytest.mark.parametrize("stream", [True, False])
async def test_all_attempts_failing_with_http_errors_raise_the_sdk_status_error(stream: bool) -> None:
    async with ScriptedServer(error_script(503, "a is busy")) as a, ScriptedServer(error_script(502, "b is down")) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        async with sdk(transport) as client:
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
        error = caught.value
        assert error.status_code == 502 and "b is down" in error.message  # the last upstream's answer
        assert error.response.headers["x-hedgerow-winner"] == ""  # nobody won; "b" is in the record
        assert error.response.headers["x-hedgerow-hedged"] == "true"
        assert len(a.requests) == 1 and len(b.requests) == 1
        (record,) = sink.records
        assert record.status == "error" and record.hedge_reason == "primary_error" and record.winner is None
        assert [a.error_type for a in record.attempts] == ["http_503", "http_502"]


@pytest.mark.parametrize("stream", [True, False])
async def test_all_attempts_refused_raise_a_connection_error_naming_each(stream: bool) -> None:
    dead_a, dead_b = f"http://127.0.0.1:{free_port()}/v1", f"http://127.0.0.1:{free_port()}/v1"
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("a", dead_a), Upstream("b", dead_b)],
        route="chat",
        policy=HedgePolicy(hedge_after_s=5.0),
        telemetry=sink,
    )
    async with sdk(transport) as client:
        with pytest.raises(openai.APIConnectionError) as caught:
            await client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
    cause = caught.value.__cause__
    assert isinstance(cause, httpx.ConnectError)
    assert "a: ConnectError" in str(cause) and "b: ConnectError" in str(cause)
    assert isinstance(cause.__cause__, AllAttemptsFailed)
    (record,) = sink.records
    assert record.status == "error" and [x.outcome for x in record.attempts] == ["failed", "failed"]


@pytest.mark.parametrize("stream", [True, False])
async def test_non_retryable_4xx_is_returned_without_failover(stream: bool) -> None:
    async with ScriptedServer(error_script(400, "bad messages")) as a, ScriptedServer(completion_script("x")) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        async with sdk(transport) as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
        assert "bad messages" in caught.value.message
        assert caught.value.response.headers["x-hedgerow-hedged"] == "false"
        assert caught.value.response.headers["x-hedgerow-winner"] == ""  # a failed call has no winner
        assert b.requests == []
        (record,) = sink.records
        assert record.status == "error" and not record.hedged and record.attempts[0].status_code == 400


async def test_non_streaming_failover_on_503() -> None:
    async with ScriptedServer(error_script(503, "busy")) as a, ScriptedServer(completion_script("fine")) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        async with sdk(transport) as client:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
        assert raw.parse().choices[0].message.content == "fine"
        assert raw.headers["x-hedgerow-winner"] == "b" and raw.headers["x-hedgerow-hedged"] == "true"
        (record,) = sink.records
        assert record.hedge_reason == "primary_error" and record.winner == "backup" and record.status == "ok"
        assert record.attempts[1].start_s < 2.0  # at once, not after hedge_after_s


async def test_mid_stream_truncation_surfaces_as_sdk_connection_error() -> None:
    pieces = sse(chunk("par", role="assistant"), chunk("tial"), done=False, gap_s=0.05)
    async with ScriptedServer(Script(pieces=pieces)) as a, ScriptedServer(answer_script(["x"])) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            telemetry=sink,
        )
        got = []
        async with sdk(transport) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            with pytest.raises(openai.APIConnectionError) as caught:
                async for c in stream:
                    got.append(c.choices[0].delta.content)
        assert got == ["par", "tial"]
        assert isinstance(caught.value.__cause__, httpx.ReadError)
        (record,) = sink.records
        assert record.status == "error" and record.error_type == "truncated"


async def test_stall_after_first_token_surfaces_as_sdk_timeout() -> None:
    pieces = sse(chunk("a", role="assistant"), chunk("b"), chunk(finish="stop"), gap_s=2.5)
    async with ScriptedServer(Script(pieces=pieces)) as a:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0, stall_timeout_s=0.5),
            telemetry=sink,
        )
        async with sdk(transport) as client:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            with pytest.raises(openai.APITimeoutError):
                async for _ in stream:
                    pass
        (record,) = sink.records
        assert record.status == "stalled"


async def test_bad_chat_body_is_answered_400_without_contacting_upstreams() -> None:
    async with ScriptedServer(completion_script("x")) as a:
        transport = HedgingTransport([Upstream("a", a.base_url)], route="chat", policy=HedgePolicy())
        async with httpx.AsyncClient(transport=transport) as http:
            not_json = await http.post("http://gw.invalid/v1/chat/completions", content=b"{nope")
            no_model = await http.post("http://gw.invalid/v1/chat/completions", json={"messages": []})
        assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
        assert no_model.status_code == 400 and "'model'" in no_model.json()["error"]["message"]
        assert "x-hedgerow-request-id" in no_model.headers
        assert a.requests == []


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="upstreams"):
        HedgingTransport([], route="chat", policy=HedgePolicy())
    with pytest.raises(ValueError, match="base_path"):
        HedgingTransport(
            [Upstream("a", "http://127.0.0.1:1/v1")], route="chat", policy=HedgePolicy(), base_path="openai"
        )
    not_a_policy: Any = 2.0
    with pytest.raises(TypeError, match="policy"):
        HedgingTransport([Upstream("a", "http://127.0.0.1:1/v1")], route="chat", policy=not_a_policy)


@pytest.mark.parametrize("stream", [True, False])
async def test_defaults_match_hedging_client(stream: bool) -> None:
    # HedgingTransport(upstreams) alone, like HedgingClient(upstreams): route "default", HedgePolicy().
    script = answer_script(["hi"]) if stream else completion_script("hi")
    async with ScriptedServer(script) as a:
        sink = Sink()
        transport = HedgingTransport([Upstream("a", a.base_url)], telemetry=sink)
        assert transport.route == "default" and transport.policy == HedgePolicy()
        assert transport.unary_route == "default.unary" and transport.client.policy == HedgePolicy()
        async with sdk(transport) as client:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, stream=stream)
            assert raw.headers["x-hedgerow-winner"] == "a" and raw.headers["x-hedgerow-hedged"] == "false"
            parsed = raw.parse()
            text: str | None
            if stream:
                assert isinstance(parsed, openai.AsyncStream)
                async with parsed:
                    text = "".join([c.choices[0].delta.content or "" async for c in parsed if c.choices])
            else:
                assert isinstance(parsed, ChatCompletion)
                text = parsed.choices[0].message.content
    assert text == "hi"
    (record,) = sink.records
    assert record.route == ("default" if stream else "default.unary") and record.status == "ok"


@pytest.mark.parametrize("stream", [True, False])
async def test_app_cancelling_before_the_answer_closes_every_attempt(stream: bool) -> None:
    script = answer_script(["late"], first_delay_s=3.0) if stream else completion_script("late", header_delay_s=3.0)
    async with ScriptedServer(script) as a:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url)], route="chat", policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink
        )
        async with sdk(transport) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await client.chat.completions.create(model="m", messages=MESSAGES, stream=stream)
            assert await a.wait_disconnect(0, timeout_s=2.0) is not None
            assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("hedgerow-") and not t.done()]
        (record,) = sink.records
        assert record.status == "cancelled" and record.attempts[0].outcome == "cancelled"


async def test_bare_break_cancels_once_the_stream_is_collected(long_replica: ReplicaThread) -> None:
    """An app that breaks out of the loop and drops the stream without closing it: the SDK's
    stream sits in a reference cycle, so the call runs on until the garbage collector finalizes
    the SDK's generator, whose ``finally`` closes the response, which cancels the call."""
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("long", long_replica.base_url)], route="chat", policy=HedgePolicy(hedge_after_s=5.0), telemetry=sink
    )
    async with sdk(transport) as client:

        async def first_chunks() -> int:
            got = 0
            async for _ in await client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, max_tokens=3000
            ):
                got += 1
                if got == 3:
                    break
            return got

        assert await first_chunks() == 3
        for _ in range(100):  # the loop's own generator is closed by a task first, then the cycle goes
            gc.collect()
            await asyncio.sleep(0.05)
            if sink.records:
                break
        assert await aborted_upstream_requests(long_replica) == 1
    (record,) = sink.records
    assert record.status == "cancelled"


class FixedThresholds:
    """A threshold source (the ``ThresholdSource`` protocol) with a fixed table."""

    def __init__(self, table: dict[tuple[str, str], tuple[float, int | None, bool]]) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []

    def lookup(self, route: str, model: str) -> tuple[float, int | None, bool] | None:
        self.asked.append((route, model))
        return self.table.get((route, model))


async def test_non_streaming_calls_use_the_unary_routes_threshold() -> None:
    async with (
        ScriptedServer(completion_script("slow", header_delay_s=3.0)) as a,
        ScriptedServer(completion_script("fast")) as b,
    ):
        sink = Sink()
        thresholds = FixedThresholds({("chat.unary", "m"): (0.3, 7, True), ("chat", "m"): (9.0, 3, True)})
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=5.0),
            thresholds=thresholds,
            telemetry=sink,
        )
        async with sdk(transport) as client:
            done = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert done.choices[0].message.content == "fast"
        assert thresholds.asked == [("chat.unary", "m")]
        (record,) = sink.records
        assert record.route == "chat.unary" and record.hedge_after_s == 0.3 and record.threshold_version == 7
        assert record.hedge_reason == "ttft_timeout" and 0.3 <= record.attempts[1].start_s < 2.0


async def test_concurrent_calls_share_one_transport(replicas: Replicas) -> None:
    slow, fast = replicas
    sink = Sink()
    transport = HedgingTransport(
        [Upstream("fast", fast.base_url), Upstream("slow", slow.base_url)],
        route="chat",
        policy=HedgePolicy(hedge_after_s=3.0),
        telemetry=sink,
    )
    async with sdk(transport) as client:

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=3 + i)
            async with stream:
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        texts = await asyncio.gather(*(one(i) for i in range(6)))
    assert texts == ["tok " * (3 + i) for i in range(6)]
    assert len(sink.records) == 6 and len({r.request_id for r in sink.records}) == 6
    assert all(r.status == "ok" and r.winner == "primary" for r in sink.records)


# -- connections: none left stuck in the pool by a cancelled app task ------------------------------


def pool_active(transport: HedgingTransport) -> int:
    """Connections of the transport's httpcore pool that are neither idle nor closed."""
    inner = transport._pool._inner
    assert isinstance(inner, httpx.AsyncHTTPTransport)
    pool = inner._pool  # httpx keeps httpcore's pool there
    return sum(1 for c in pool.connections if not c.is_idle() and not c.is_closed())


@pytest.mark.parametrize("kind", ["non_streaming", "pass_through"])
async def test_cancelling_the_app_at_any_moment_leaves_no_connection_active(kind: str) -> None:
    # The app's task is cancelled after 0, 1, 2, ... event-loop turns, so the cancellation lands
    # at every stage of the request (connect, send, body, httpx's close at the body's end). The
    # upstream answers at once, in one write, on a keep-alive connection. With a pool of 2, a
    # request after all that must still complete.
    if kind == "non_streaming":
        body = json.dumps(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            }
        )
        path, method, payload = "/v1/chat/completions", "POST", {"model": "m", "messages": MESSAGES}
    else:
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
        path, method, payload = "/v1/models", "GET", None
    script = Script(pieces=[(0.0, body.encode())], content_type="application/json", keep_alive=True)
    async with ScriptedServer(script) as a:
        transport = HedgingTransport(
            [Upstream("a", a.base_url)], route="chat", max_connections=2, policy=HedgePolicy(hedge_after_s=30.0)
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://hedgerow.invalid") as http:

            async def request() -> httpx.Response:
                return await http.request(method, path, json=payload)

            for turns in range(80):
                task = asyncio.create_task(request())
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                assert pool_active(transport) == 0, f"a connection left active (cancelled after {turns} turns)"
            response = await asyncio.wait_for(request(), 10.0)
            assert response.status_code == 200 and response.json() == json.loads(body)


# -- a break right at the first chunk of a hedged call: the loser is closed all the same ----------


def held_silent_script() -> Script:
    """Headers and a role-only chunk at once, then no token for 30 s; the connection stays open."""
    return Script(pieces=sse(chunk(role="assistant"), chunk("late"), done=False, gap_s=30.0), close=False)


def winner_script(first_delay_s: float) -> Script:
    return answer_script([f"w{i} " for i in range(40)], first_delay_s=first_delay_s, gap_s=0.05)


async def sdk_break_at_first_chunk(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    async with stream:
        async for _ in stream:
            break  # no await between the first chunk and leaving the block


@pytest.mark.parametrize("loser", ["primary", "backup"])
async def test_sdk_break_at_the_first_chunk_closes_the_loser_at_once(loser: AttemptRole) -> None:
    scripts = (
        (held_silent_script(), winner_script(0.4)) if loser == "primary" else (winner_script(1.0), held_silent_script())
    )
    async with ScriptedServer(scripts[0]) as a, ScriptedServer(scripts[1]) as b:
        sink = Sink()
        transport = HedgingTransport(
            [Upstream("a", a.base_url), Upstream("b", b.base_url)],
            route="chat",
            policy=HedgePolicy(hedge_after_s=0.3, budget=1.0),
            telemetry=sink,
        )
        async with sdk(transport) as client:
            await sdk_break_at_first_chunk(client)
            left_at = time.monotonic()
            closed_at = await (a if loser == "primary" else b).wait_disconnect(0, timeout_s=3.0)
            assert closed_at is not None, f"the {loser}'s connection is still open"
            assert closed_at - left_at < 1.0
            assert pool_active(transport) == 0
    (record,) = sink.records
    assert record.status == "cancelled" and record.hedged
    assert {x.role: x.outcome for x in record.attempts}[loser] == "cancelled"


async def test_sdk_twenty_breaks_at_the_first_chunk_leave_no_connection_open() -> None:
    async with ScriptedServer(held_silent_script()) as slow, ScriptedServer(winner_script(0.3)) as fast:
        transport = HedgingTransport(
            [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)],
            route="chat",
            max_connections=10,
            policy=HedgePolicy(hedge_after_s=0.1, budget=1.0, budget_burst=100.0),
        )
        async with sdk(transport) as client:
            for _ in range(20):  # with the leak, the 11th hedge waits for a pool slot for ever
                await asyncio.wait_for(sdk_break_at_first_chunk(client), 10.0)
            for index in range(20):
                assert await slow.wait_disconnect(index, timeout_s=2.0) is not None, f"call {index} leaked"
            assert pool_active(transport) == 0
