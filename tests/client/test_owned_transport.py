"""``OwnedTransport`` and the httpx/httpcore behaviour it relies on (``hedgerow.client._transport``).

The first tests pin that behaviour down and fail loudly if an httpx/httpcore release changes it:
the ``trace`` events and their order, the stream handed to the ``connect_tcp.complete`` hook,
and httpcore dropping a connection whose connect fails from that hook. The rest check the
transport itself on a real loopback server: a cancellation at every event-loop turn of a request
leaves no connection stuck in a pool of one, the caller's cancellation always propagates, a
response that arrives while the cancellation is handled is closed, and the body cap holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
from packaging.requirements import Requirement

from hedgerow.client import _transport
from hedgerow.client._transport import (
    BODY_LIMIT_EXTENSION,
    GATE_EXTENSION,
    BodyTooLarge,
    CancelGate,
    OwnedTransport,
)
from hedgerow.client.background import cancel_and_wait
from tests.client.scripted_server import Script, ScriptedServer, sse
from tests.helpers import BODY, answer

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


async def send_and_read(http: httpx.AsyncClient, request: httpx.Request) -> None:
    """Send ``request`` streamed, read its whole body, and close the response in any case."""
    response = await http.send(request, stream=True)
    try:
        async for _ in response.aiter_bytes():
            pass
    finally:
        await response.aclose()


def pinned(name: str) -> Requirement:
    """The requirement on ``name`` in pyproject.toml's dependencies."""
    for line in PYPROJECT.read_text().splitlines():
        text = line.strip().strip(",").strip('"')
        if text.startswith(f"{name}>") or text.startswith(f"{name}<"):
            return Requirement(text)
    raise AssertionError(f"{name} is not pinned in pyproject.toml")


@pytest.mark.parametrize("name", ["httpx", "httpcore", "httpx-sse"])
def test_the_installed_http_stack_is_within_the_tested_pins(name: str) -> None:
    requirement = pinned(name)
    assert requirement.specifier.contains(version(name)), (name, version(name), str(requirement.specifier))
    assert "<" in str(requirement.specifier), f"{name}: no upper bound"


async def test_httpcore_traces_a_new_connection_then_the_request_and_no_connect_on_reuse() -> None:
    # OwnedTransport's gate keys on these event names and this order.
    events: list[str] = []
    returned: list[Any] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        events.append(event)
        if event == "connection.connect_tcp.complete":
            returned.append(info.get("return_value"))

    script = Script(pieces=sse({"choices": []}), keep_alive=True)
    async with ScriptedServer(script) as server, httpx.AsyncClient() as http:
        for _ in range(2):
            response = await http.post(f"{server.base_url}/chat/completions", json=BODY, extensions={"trace": trace})
            assert response.status_code == 200
            events.append("--")
    first, second = "|".join(events).split("|--|")[:2]
    assert first.split("|")[:3] == [
        "connection.connect_tcp.started",
        "connection.connect_tcp.complete",
        "http11.send_request_headers.started",
    ]
    assert "connect_tcp" not in second and second.startswith("http11.send_request_headers.started")
    assert len(returned) == 1 and hasattr(returned[0], "aclose")  # the network stream the gate closes


async def test_httpcore_drops_a_connection_whose_connect_fails_from_the_trace_hook() -> None:
    # The gate's repair for a connect that completes after a cancellation: close the stream and
    # raise from the hook. httpcore must then mark the connection closed and free its slot.
    async def refuse(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            await info["return_value"].aclose()
            raise asyncio.CancelledError

    async with ScriptedServer(answer()) as server:
        transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
        async with httpx.AsyncClient(transport=transport) as http:
            url = f"{server.base_url}/chat/completions"
            task = asyncio.create_task(http.post(url, json=BODY, extensions={"trace": refuse}))
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
            # With the slot leaked, this request would wait for a connection forever.
            response = await asyncio.wait_for(http.post(url, json=BODY), 5.0)
            assert response.status_code == 200
        assert server.requests and len(server.requests) == 1


async def test_a_cancellation_at_any_turn_leaves_no_connection_stuck_in_a_pool_of_one() -> None:
    # Cancelled after 0, 1, 2, ... event-loop turns: connect, the connect-to-request window,
    # headers, body. Each following request must still get the pool's only connection.
    one = OwnedTransport(limits=httpx.Limits(max_connections=1))
    async with ScriptedServer(answer()) as server, httpx.AsyncClient(transport=one) as http:
        url = f"{server.base_url}/chat/completions"

        async def call() -> None:
            async with http.stream("POST", url, json=BODY) as response:
                async for _ in response.aiter_bytes():
                    pass

        for turns in range(40):
            task = asyncio.create_task(call())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.wait_for(call(), 5.0)  # the pool's one slot is free


async def test_a_gated_cancellation_at_any_turn_leaves_no_connection_stuck_in_a_pool_of_one() -> None:
    # The hedging client's way: the send runs in the caller's own task (no task of the
    # transport's), which is cancelled only through its CancelGate, after 0, 1, 2, ... turns.
    one = OwnedTransport(limits=httpx.Limits(max_connections=1))
    async with ScriptedServer(answer()) as server, httpx.AsyncClient(transport=one) as http:
        url = f"{server.base_url}/chat/completions"
        gates: dict[asyncio.Task[None], CancelGate] = {}

        async def call() -> None:
            task = asyncio.current_task()
            assert task is not None
            request = http.build_request("POST", url, json=BODY, extensions={GATE_EXTENSION: gates[task]})
            await send_and_read(http, request)

        cancelled = 0
        for turns in range(40):
            task = asyncio.create_task(call())
            gates[task] = CancelGate(task)
            for _ in range(turns):
                await asyncio.sleep(0)
            gates[task].cancel()
            await asyncio.gather(task, return_exceptions=True)
            cancelled += task.cancelled()
            fresh = asyncio.create_task(call())
            gates[fresh] = CancelGate(fresh)
            await asyncio.wait_for(fresh, 5.0)  # the pool's one slot is free
        assert cancelled >= 5  # the early turns, the connect and the window among them, were cancelled


@pytest.mark.parametrize("partial", [False, True], ids=["whole-body", "partial-body"])
async def test_a_gated_cancellation_during_the_tasks_own_close_waits_for_the_close(partial: bool) -> None:
    # The gated task closes its response in itself (CancelGate.close): a cancellation asked for
    # while that close is suspended inside httpcore must wait until the close has ended, then
    # still reach the task. Delivered at once, it would leave the pool's only connection active.
    one = OwnedTransport(limits=httpx.Limits(max_connections=1))
    async with ScriptedServer(answer()) as server, httpx.AsyncClient(transport=one) as http:
        url = f"{server.base_url}/chat/completions"
        gates: dict[asyncio.Task[None], CancelGate] = {}

        async def call(closing: asyncio.Event | None = None) -> None:
            task = asyncio.current_task()
            assert task is not None
            request = http.build_request("POST", url, json=BODY, extensions={GATE_EXTENSION: gates[task]})
            response = await http.send(request, stream=True)
            assert isinstance(response.stream, httpx.AsyncByteStream)  # an AsyncClient's response
            async for _ in response.stream:  # the body itself: httpx's iterators close it at the end
                if partial:
                    break
            if closing is not None:
                closing.set()
            await response.aclose()

        cancelled_in_close = 0
        for turns in range(6):
            closing = asyncio.Event()
            task = asyncio.create_task(call(closing))
            gates[task] = CancelGate(task)
            await closing.wait()  # the task is in its close now, or past it
            for _ in range(turns):
                await asyncio.sleep(0)
            in_close = not task.done()
            gates[task].cancel()
            await asyncio.gather(task, return_exceptions=True)
            if in_close:
                assert task.cancelled(), f"turn {turns}: the cancellation was swallowed"
                cancelled_in_close += 1
            fresh = asyncio.create_task(call())
            gates[fresh] = CancelGate(fresh)
            await asyncio.wait_for(fresh, 5.0)  # the pool's one slot is free
        assert cancelled_in_close >= 1  # at least one cancellation landed inside a close


class _RecordingGate(CancelGate):
    """A CancelGate that records the trace events httpcore hands it."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        super().__init__(task)
        self.events: list[str] = []

    async def trace(self, event: str, info: Any) -> None:
        self.events.append(event)
        await super().trace(event, info)


@pytest.mark.parametrize("caller_traces", [False, True], ids=["gate-only", "caller-trace"])
async def test_a_gated_request_is_traced_until_it_starts_unless_the_caller_traces_it(caller_traces: bool) -> None:
    # After send_request_headers.started no connect window can open: the gate takes its trace
    # out of the request and httpcore stops tracing. A caller's own trace still sees every event.
    seen: list[str] = []

    async def own(event: str, info: Any) -> None:
        seen.append(event)

    async with ScriptedServer(answer()) as server, httpx.AsyncClient(transport=OwnedTransport()) as http:
        url = f"{server.base_url}/chat/completions"

        async def call() -> _RecordingGate:
            task = asyncio.current_task()
            assert task is not None
            gate = _RecordingGate(task)
            extensions: dict[str, Any] = {GATE_EXTENSION: gate}
            if caller_traces:
                extensions["trace"] = own
            request = http.build_request("POST", url, json=BODY, extensions=extensions)
            await send_and_read(http, request)
            return gate

        for _ in range(2):  # a new connection, then a reused one
            seen.clear()
            events = (await asyncio.wait_for(call(), 5.0)).events
            if caller_traces:
                assert events == seen and events[-1] == "http11.response_closed.complete", events
            else:
                # The step under way when the trace was taken out still reports its end.
                assert events[-2:] == ["http11.send_request_headers.started", "http11.send_request_headers.complete"]


async def test_the_callers_cancellation_propagates_and_the_upstream_sees_the_close() -> None:
    # Headers come after 5 s: the caller is cancelled while waiting for them.
    async with ScriptedServer(Script(header_delay_s=5.0, pieces=sse({"choices": []}))) as server:
        async with httpx.AsyncClient(transport=OwnedTransport()) as http:
            task = asyncio.create_task(http.post(f"{server.base_url}/chat/completions", json=BODY))
            async with asyncio.timeout(10):  # polled: a loaded machine may take a while to send it
                while not server.requests:
                    await asyncio.sleep(0.01)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()
        assert await server.wait_disconnect(0, timeout_s=2.0) is not None


async def test_a_response_that_arrives_while_the_cancellation_is_handled_is_closed() -> None:
    # An inner transport that answers only after its own cancellation was requested (it ignores
    # the first cancel): OwnedTransport must close that response, then still raise CancelledError.
    closed: list[bool] = []

    class _Body(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b"x"

        async def aclose(self) -> None:
            closed.append(True)

    class Stubborn(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)
            return httpx.Response(200, stream=_Body())

    transport = OwnedTransport(Stubborn())
    request = httpx.Request("GET", "http://example.invalid/")
    task = asyncio.create_task(transport.handle_async_request(request))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and closed == [True]


async def test_the_body_limit_fails_a_larger_body_and_passes_a_smaller_one() -> None:
    payload = b"x" * 5000
    script = Script(content_type="application/json", pieces=[(0.0, payload[:3000]), (0.01, payload[3000:])])
    async with ScriptedServer(script) as server, httpx.AsyncClient(transport=OwnedTransport()) as http:
        url = f"{server.base_url}/x"
        with pytest.raises(BodyTooLarge) as info:
            await http.get(url, extensions={BODY_LIMIT_EXTENSION: 4096})
        assert info.value.error_type == "body_too_large" and info.value.limit == 4096
        response = await http.get(url, extensions={BODY_LIMIT_EXTENSION: 5000})
        assert response.content == payload


async def test_cancel_and_wait_does_not_swallow_the_callers_cancellation() -> None:
    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(1.0)  # a close that takes a while
            raise

    worker = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cancel_and_wait(worker))
    await asyncio.sleep(0.05)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled()  # propagated, not absorbed with the worker's own CancelledError
    await asyncio.gather(worker, return_exceptions=True)
    assert worker.cancelled()


async def test_a_gated_request_that_never_leaves_the_window_is_cancelled_after_safe_wait_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An inner transport that reports a completed connect and then never starts the request: the
    # gate holds a cancellation asked for in the window back, for SAFE_WAIT_S (0.3 s here) and no
    # longer; asked for a second time meanwhile, it is still delivered once.
    monkeypatch.setattr(_transport, "SAFE_WAIT_S", 0.3)
    connected = asyncio.Event()

    class NeverStarts(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await request.extensions["trace"]("connection.connect_tcp.complete", {"return_value": None})
            connected.set()
            await asyncio.sleep(30)
            raise AssertionError("not reached")

    transport = OwnedTransport(NeverStarts())
    gates: dict[asyncio.Task[httpx.Response], CancelGate] = {}

    async def send() -> httpx.Response:
        task = asyncio.current_task()
        assert task is not None
        request = httpx.Request("GET", "http://example.invalid/", extensions={GATE_EXTENSION: gates[task]})
        return await transport.handle_async_request(request)

    task = asyncio.create_task(send())
    gates[task] = CancelGate(task)
    await asyncio.wait_for(connected.wait(), 5.0)
    asked_at = asyncio.get_running_loop().time()
    gates[task].cancel()
    await asyncio.sleep(0.1)
    assert not task.done()  # held back: the request is in the window
    gates[task].cancel()
    await asyncio.gather(task, return_exceptions=True)
    waited_s = asyncio.get_running_loop().time() - asked_at
    assert task.cancelled() and 0.3 - 0.01 <= waited_s < 10.0
