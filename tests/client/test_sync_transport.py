"""``HedgingTransport`` under the synchronous ``openai.OpenAI`` client (``httpx.Client``).

Against real simulated replicas on 127.0.0.1 (threads of their own, so the sync SDK can block):
a sick primary (``slowdown=100``: first token after ~5 s) and a healthy backup, with
``hedge_after_s=0.5``. Streaming and not, the backup must win, the loser must be closed, one
record per call must reach the sink, and budgets and the sink must be the ones the async side of
the same transport uses.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import httpx
import openai

from hedgerow.client import HedgePolicy, HedgingTransport, Upstream
from hedgerow.client._portal import PORTAL
from tests.client import sdk
from tests.client.conftest import Replicas
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse
from tests.client.sdk import MESSAGES
from tests.helpers import Sink


def make_transport(replicas: Replicas, sink: Sink) -> HedgingTransport:
    slow, fast = replicas
    return HedgingTransport(
        [Upstream("slow", slow.base_url), Upstream("fast", fast.base_url)],
        route="chat",
        policy=HedgePolicy(hedge_after_s=0.5),
        telemetry=sink,
    )


def sync_sdk(transport: HedgingTransport) -> openai.OpenAI:
    return sdk.sync_sdk(transport, api_key="unused")


def test_sync_stream_hedges_and_the_fast_replica_wins(replicas: Replicas) -> None:
    sink = Sink()
    transport = make_transport(replicas, sink)
    with sync_sdk(transport) as client:
        started = time.monotonic()
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=5)
        first_s = time.monotonic() - started
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "tok " * 5
    assert 0.45 <= first_s < 3.0  # after the hedge, long before the sick primary's first token
    (record,) = sink.records
    assert record.route == "chat" and record.status == "ok"
    assert record.hedged and record.hedge_reason == "ttft_timeout" and record.winner == "backup"
    primary, backup = record.attempts
    assert (primary.upstream, primary.outcome) == ("slow", "cancelled")
    assert (backup.upstream, backup.outcome) == ("fast", "won")
    assert transport.client.budget.tokens < transport.client.policy.budget_burst  # the hedge was paid for


def test_sync_non_streaming_call_hedges_on_the_whole_response(replicas: Replicas) -> None:
    sink = Sink()
    transport = make_transport(replicas, sink)
    with sync_sdk(transport) as client:
        completion = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
    assert completion.choices[0].message.content == "tok " * 3
    (record,) = sink.records
    assert record.route == "chat.unary" and record.status == "ok" and record.winner == "backup"
    assert record.attempts[0].outcome == "cancelled"


def test_sync_stream_closed_early_ends_the_call_as_cancelled(replicas: Replicas) -> None:
    sink = Sink()
    transport = make_transport(replicas, sink)
    with sync_sdk(transport) as client:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True, max_tokens=50)
        for _ in stream:
            break
        stream.close()
    (record,) = sink.records
    assert record.status == "cancelled" and record.winner == "backup"
    assert all(a.outcome in ("won", "cancelled") for a in record.attempts)


async def test_sync_and_async_calls_of_one_transport_share_the_sink_and_the_budgets(
    replicas: Replicas,
) -> None:
    # The async SDK on this loop and the sync SDK in a worker thread, on one transport.
    sink = Sink()
    transport = make_transport(replicas, sink)
    async_client = sdk.async_sdk(transport, api_key="unused")
    sync_client = sync_sdk(transport)

    def sync_call() -> str | None:
        return (
            sync_client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2).choices[0].message.content
        )

    burst = transport.unary_policy.budget_burst
    assert transport.unary_budget.tokens == burst  # full: each call's deposit is capped at the burst
    async_answer, sync_answer = await asyncio.gather(
        async_client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2),
        asyncio.to_thread(sync_call),
    )
    await async_client.close()
    sync_client.close()
    assert async_answer.choices[0].message.content == sync_answer == "tok " * 2
    assert len(sink.records) == 2 and {r.route for r in sink.records} == {"chat.unary"}
    assert all(r.hedged and r.winner == "backup" for r in sink.records)
    # Both hedges were taken from the one unary budget: two withdrawals, two deposits (which ones
    # were capped at the burst depends on the interleaving). A budget per side would keep >= burst - 1.
    deposit = transport.unary_policy.budget
    assert burst - 2 - 1e-9 <= transport.unary_budget.tokens <= burst - 2 + 2 * deposit + 1e-9


async def test_sync_stream_cut_mid_answer_gives_the_chunks_before_it_then_the_sdk_error() -> None:
    # The portal task reads the body into a queue: an error after the first chunks must still
    # reach the reading thread after those chunks, as the SDK's connection error.
    pieces = sse(chunk("par", role="assistant"), chunk("tial"), done=False, gap_s=0.05)
    async with ScriptedServer(Script(pieces=pieces)) as a:
        sink = Sink()
        transport = HedgingTransport([Upstream("a", a.base_url)], route="chat", telemetry=sink)

        def read() -> tuple[list[str | None], BaseException | None]:
            got: list[str | None] = []
            with sync_sdk(transport) as client:
                stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                try:
                    for c in stream:
                        got.append(c.choices[0].delta.content)
                except openai.APIConnectionError as exc:
                    return got, exc
            return got, None

        got, error = await asyncio.to_thread(read)
    assert got == ["par", "tial"]
    assert isinstance(error, openai.APIConnectionError) and isinstance(error.__cause__, httpx.ReadError)
    (record,) = sink.records
    assert record.status == "error" and record.error_type == "truncated"


async def test_sync_stream_closed_while_the_upstream_stalls_ends_the_call_at_once() -> None:
    # After the first chunk the upstream sends nothing for 30 s: the portal task is waiting for
    # the next chunk when the app closes the stream. The close must end the call (record
    # cancelled, connection closed) without waiting for the upstream.
    pieces = sse(chunk("a", role="assistant"), chunk("b"), chunk(finish="stop"), gap_s=30.0)
    async with ScriptedServer(Script(pieces=pieces)) as a:
        sink = Sink()
        transport = HedgingTransport([Upstream("a", a.base_url)], route="chat", telemetry=sink)

        def read_one_then_close() -> float:
            with sync_sdk(transport) as client:
                stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
                next(iter(stream))
                started = time.monotonic()
                stream.close()
                return time.monotonic() - started

        close_s = await asyncio.to_thread(read_one_then_close)
    assert close_s < 10.0  # far below the 30 s gap: the waiting portal task was cancelled
    (record,) = sink.records
    assert record.status == "cancelled" and record.error_type == "caller_cancelled"
    assert [a.outcome for a in record.attempts] == ["won"]


async def test_sync_stream_dropped_and_collected_on_the_portal_thread_ends_the_call() -> None:
    # The sync SDK's stream is a generator in a reference cycle: an app that breaks out of it and
    # drops it leaves it to the cyclic garbage collector, which runs in whichever thread allocates,
    # often the portal's own. Its finalizer closes the response there: the close must end the call
    # (as a close from the app's thread does) instead of failing because it cannot wait for the
    # portal from the portal's own thread.
    pieces = sse(chunk("a", role="assistant"), chunk("b"), chunk(finish="stop"), gap_s=30.0)
    async with ScriptedServer(Script(pieces=pieces)) as a:
        sink = Sink()
        transport = HedgingTransport([Upstream("a", a.base_url)], route="chat", telemetry=sink)
        client = sync_sdk(transport)
        unraisable: list[BaseException | None] = []

        def read_one_then_drop() -> None:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            for _ in stream:
                break  # the app breaks out and drops the stream without closing it

        def collect_on_the_portal() -> None:
            async def collect() -> None:
                gc.collect()  # finalizes the dropped stream here, on the portal's thread

            PORTAL.run(collect())

        gc.disable()  # no collection on the test's threads before the portal's own
        hook, sys.unraisablehook = sys.unraisablehook, lambda args: unraisable.append(args.exc_value)
        try:
            await asyncio.to_thread(read_one_then_drop)
            await asyncio.to_thread(collect_on_the_portal)
            deadline = time.monotonic() + 10.0  # far below the upstream's 30 s gap
            while not sink.records and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            sys.unraisablehook = hook
            gc.enable()
            await asyncio.to_thread(client.close)
    assert unraisable == []
    (record,) = sink.records
    assert record.status == "cancelled" and record.error_type == "caller_cancelled"


async def test_sync_transport_closed_on_the_portal_thread_closes_its_pool_without_waiting() -> None:
    # openai's ``SyncHttpxClientWrapper.__del__`` closes its ``httpx.Client``, and so this
    # transport, in whichever thread the garbage collection runs: often the portal's own, which
    # cannot wait for its own loop. The close must not raise nor hang there, and must still close
    # the twin's pool (the kept-alive connection to the upstream ends).
    script = Script(pieces=sse(chunk("a", role="assistant"), chunk(finish="stop")), keep_alive=True)
    async with ScriptedServer(script) as a:
        transport = HedgingTransport([Upstream("a", a.base_url)], route="chat", telemetry=Sink())
        client = sync_sdk(transport)

        def one_call() -> str:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        assert await asyncio.to_thread(one_call) == "a"
        twin = transport._twin
        assert twin is not None and twin._http is not None

        async def close_on_the_portal() -> None:
            transport.close()  # synchronously, on the portal's thread (as a finalizer run there)

        # A deadlock fails the test after 10 s instead of hanging it.
        await asyncio.wait_for(asyncio.to_thread(PORTAL.run, close_on_the_portal()), timeout=10.0)
        assert transport._twin is None
        # The close runs on the portal, not waited for: the kept-alive connection ends, then the
        # twin's client is dropped.
        assert await a.wait_disconnect(0, timeout_s=5.0) is not None
        deadline = time.monotonic() + 5.0
        while twin._http is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert twin._closed and twin._http is None
