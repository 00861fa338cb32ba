"""The openai SDK, unchanged, hedging through ``HedgingTransport`` against two simulated replicas.

Every combination of SDK (``openai.AsyncOpenAI``, ``openai.OpenAI``), API (chat completions, the
Responses API) and mode (streamed, whole response) runs one call against a slow replica (the
primary: 50x slower, its first token more than 2 s away) and a fast one, with ``hedge_after_s``
0.4 s: the hedge fires, the backup wins, the primary's request is aborted on its replica, and each
call leaves exactly one record. Real HTTP on 127.0.0.1 throughout (uvicorn replicas in threads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from hedgerow.client import CallRecord, HedgePolicy, HedgingTransport, Upstream
from hedgerow.sim import ReplicaThread
from tests.helpers import Sink
from tests.sim.conftest import StartReplica

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
#: Five tokens per answer (the replica's extension), so a whole answer is quick on the fast replica.
EXTRA = {"hedgerow_output_tokens": 5}
ANSWER = "tok " * 5
#: (route, api) of the four calls of each test, in order.
EXPECTED = [("sdk", "chat"), ("sdk.unary", "chat"), ("sdk", "responses"), ("sdk.unary", "responses")]


def start_pair(start_replica: Callable[..., ReplicaThread]) -> tuple[ReplicaThread, ReplicaThread]:
    """(slow, fast): prefill of a short prompt about 2.4 s on the slow one, 5 ms on the fast one."""
    slow = start_replica(name="slow", time_scale=1.0, slowdown=50.0)
    fast = start_replica(name="fast", time_scale=0.1)
    return slow, fast


def transport_for(slow: ReplicaThread, fast: ReplicaThread, sink: Sink) -> HedgingTransport:
    """A transport whose primary is the slow replica; hedges after 0.4 s."""
    upstreams = [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)]
    return HedgingTransport(upstreams, route="sdk", policy=HedgePolicy(hedge_after_s=0.4), telemetry=sink)


def check_records(records: list[CallRecord], expected: list[tuple[str, str]]) -> None:
    """One record per call, in order ``expected`` = [(route, api)]: hedged on a late first token
    (or whole response), won by the backup on the fast replica, the slow primary cancelled."""
    assert [(r.route, r.api) for r in records] == expected
    assert len({r.request_id for r in records}) == len(records)
    for record in records:
        assert record.status == "ok" and record.hedged and record.hedge_reason == "ttft_timeout", record
        assert record.winner == "backup" and record.completion_tokens == 5
        primary, backup = record.attempts
        assert (primary.upstream, primary.outcome, primary.first_token_s) == ("slow", "cancelled", None)
        assert (backup.upstream, backup.outcome) == ("fast", "won")
        assert 0.3 <= backup.start_s < 2.0 and record.ttft_s is not None and record.ttft_s < 2.0


def wait_aborted(replica: ReplicaThread, count: int, timeout_s: float = 10.0) -> dict[str, Any]:
    """The replica's stats once ``count`` requests were aborted (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats: dict[str, Any] = httpx.get(f"{replica.url}/stats", timeout=5).json()
        if stats["aborted"] >= count or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


async def test_the_async_sdk_hedges_chat_and_responses_streamed_and_whole(start_replica: StartReplica) -> None:
    slow, fast = start_pair(start_replica)
    sink = Sink()
    http = httpx.AsyncClient(transport=transport_for(slow, fast, sink))
    sdk = openai.AsyncOpenAI(base_url="http://hedgerow.invalid/v1", api_key="unused", max_retries=0, http_client=http)  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
    async with sdk:
        stream = await sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=EXTRA)
        async with stream:
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == ANSWER

        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, extra_body=EXTRA)
        assert raw.headers["x-hedgerow-winner"] == "fast" and raw.headers["x-hedgerow-hedged"] == "true"
        completion = raw.parse()
        assert completion.choices[0].message.content == ANSWER
        assert completion.usage is not None and completion.usage.completion_tokens == 5

        events = await sdk.responses.create(model="m", input="hello", stream=True, extra_body=EXTRA)
        async with events:
            kinds = [event.type async for event in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert kinds.count("response.output_text.delta") == 5

        response = await sdk.responses.create(model="m", input="hello", extra_body=EXTRA)
        assert response.status == "completed" and response.output_text == ANSWER
        assert response.usage is not None and response.usage.output_tokens == 5
    check_records(sink.records, EXPECTED)
    stats = await asyncio.to_thread(wait_aborted, slow, 4)
    assert stats["aborted"] == 4 and stats["finished"] == 0  # every loser stopped on its replica


def test_the_sync_sdk_hedges_chat_and_responses_streamed_and_whole(start_replica: StartReplica) -> None:
    slow, fast = start_pair(start_replica)
    sink = Sink()
    http = httpx.Client(transport=transport_for(slow, fast, sink))
    sdk = openai.OpenAI(base_url="http://hedgerow.invalid/v1", api_key="unused", max_retries=0, http_client=http)  # type: ignore[arg-type]  # openai annotates httpx2; takes httpx too
    with sdk:
        with sdk.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=EXTRA) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == ANSWER

        completion = sdk.chat.completions.create(model="m", messages=MESSAGES, extra_body=EXTRA)
        assert completion.choices[0].message.content == ANSWER

        with sdk.responses.stream(model="m", input="hello", extra_body=EXTRA) as events:
            deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
            final = events.get_final_response()
        assert "".join(deltas) == ANSWER and final.status == "completed" and final.output_text == ANSWER

        raw = sdk.responses.with_raw_response.create(model="m", input="hello", extra_body=EXTRA)
        assert raw.headers["x-hedgerow-winner"] == "fast"
        assert raw.parse().output_text == ANSWER
    check_records(sink.records, EXPECTED)
    stats = wait_aborted(slow, 4)
    assert stats["aborted"] == 4 and stats["finished"] == 0
