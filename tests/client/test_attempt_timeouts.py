"""An attempt task's own timeouts (the drain after ``[DONE]``, the error excerpt) and its gate.

The attempt task is meant to be cancelled only through its ``CancelGate``, which holds a
cancellation back while the task closes its response in itself and never cancels it twice. Two
``asyncio.timeout`` blocks inside the task cancel it directly all the same: ``drain_body``
(``DRAIN_TIMEOUT_S`` after ``[DONE]``) and ``body_excerpt`` (0.5 s for an error body). httpx
closes a response inside them (at the end of its body), and httpcore closes the connection inside
them when a read is cancelled; a cancellation landing in either close leaves the connection
counted as active in the pool for good (encode/httpcore#1115).

httpcore's closes take one or two event-loop turns, so the inner transport here makes them take a
while (``_SlowClose``: each close, and the clean-up after a failed read, waits before doing the
real one), as a loaded loop does; the check is httpcore's own pool: no connection left active.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from hedgerow.client import AllAttemptsFailed, HedgingClient, Upstream
from hedgerow.client._attempt_io import DRAIN_TIMEOUT_S
from hedgerow.client._transport import CancelGate
from tests.client.scripted_server import Script, ScriptedServer, chunk, sse, usage_chunk
from tests.helpers import BODY


class _SlowBody(httpx.AsyncByteStream):
    """A response body whose close, and whose clean-up after a failed read, wait ``delay_s``
    before the real close (httpcore's ``except BaseException`` path closes the connection too)."""

    def __init__(self, inner: httpx.AsyncByteStream, delay_s: float) -> None:
        self._inner = inner
        self._delay_s = delay_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._inner:
                yield piece
        except BaseException:
            await asyncio.sleep(self._delay_s)
            await self._inner.aclose()
            raise

    async def aclose(self) -> None:
        await asyncio.sleep(self._delay_s)
        await self._inner.aclose()


class _SlowClose(httpx.AsyncBaseTransport):
    """httpx's own transport (``real``) whose response bodies are ``_SlowBody``."""

    def __init__(self, delay_s: float) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self._delay_s = delay_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.real.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _SlowBody(response.stream, self._delay_s)
        return response

    async def aclose(self) -> None:
        await self.real.aclose()


def active_connections(transport: _SlowClose) -> int:
    """Connections of httpcore's pool that are neither idle nor closed (in use, or leaked)."""
    connections = transport.real._pool.connections
    return sum(1 for c in connections if not c.is_idle() and not c.is_closed())


def whole_answer(*, keep_alive: bool) -> Script:
    """Three words, finish, usage and ``[DONE]`` in one write. ``keep_alive``: the body ends there
    (Content-Length); else the server keeps the body open after ``[DONE]``."""
    chunks = [chunk("w0 ", role="assistant"), chunk("w1 "), chunk("w2 "), chunk(finish="stop"), usage_chunk(5, 3)]
    body = b"".join(data for _, data in sse(*chunks))
    return Script(pieces=[(0.0, body)], keep_alive=keep_alive, close=False)


async def test_a_close_at_the_end_of_the_drain_outlasting_its_timeout_runs_to_its_end() -> None:
    # [DONE] and the body's end in one read: the drain's next read ends the body and httpx closes
    # the response there, inside the drain's timeout, which expires during that close.
    slow = _SlowClose(delay_s=DRAIN_TIMEOUT_S + 0.25)
    async with (
        ScriptedServer(whole_answer(keep_alive=True)) as server,
        HedgingClient([Upstream("a", server.base_url)], transport=slow) as client,
    ):
        result = await asyncio.wait_for(client.chat(BODY), 10.0)
        assert result.record.status == "ok" and result.text == "w0 w1 w2 "
        assert active_connections(slow) == 0


async def test_a_close_at_the_end_of_an_error_body_outlasting_the_excerpt_timeout_runs_to_its_end() -> None:
    # A 503 whose short body ends at once: httpx closes the response inside the excerpt's 0.5 s
    # timeout, which expires during that close.
    slow = _SlowClose(delay_s=0.8)
    script = Script(status=503, content_type="text/plain", pieces=[(0.0, b"down")], keep_alive=True)
    async with (
        ScriptedServer(script) as server,
        HedgingClient([Upstream("a", server.base_url)], transport=slow) as client,
    ):
        with pytest.raises(AllAttemptsFailed):
            await asyncio.wait_for(client.chat(BODY), 10.0)
        assert active_connections(slow) == 0


async def test_a_caller_leaving_during_the_drain_leaves_nothing_active() -> None:
    # The caller leaves at the usage chunk, while the winner's task waits in the drain for a body
    # end that never comes: the gate cancels the task, whose clean-up outlasts the drain's timeout.
    slow = _SlowClose(delay_s=DRAIN_TIMEOUT_S + 0.5)
    async with (
        ScriptedServer(whole_answer(keep_alive=False)) as server,
        HedgingClient([Upstream("a", server.base_url)], transport=slow) as client,
    ):
        async with client.stream_chat(BODY) as stream:
            async for piece in stream:
                if piece.get("usage"):
                    break
        assert stream.record is not None and stream.record.status == "cancelled"
        assert active_connections(slow) == 0
        assert await server.wait_disconnect(0, timeout_s=3.0) is not None


# -- CancelGate.timeout: one cancellation of the task at a time ------------------------------------


async def _timed_clean_up(gate_of: dict[asyncio.Task[None], CancelGate], timeout_s: float, cut: list[str]) -> None:
    """In a gated task: wait in ``gate.timeout(timeout_s)``; when cancelled, a 0.3 s clean-up (as
    httpcore's close of a connection after a cancelled read) that notes in ``cut`` if it is cut."""
    task = asyncio.current_task()
    assert task is not None
    async with gate_of[task].timeout(timeout_s):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            try:
                await asyncio.sleep(0.3)
            except asyncio.CancelledError:
                cut.append("clean-up cut short by a second cancellation")
                raise
            raise


async def test_a_gate_cancel_while_the_tasks_own_timeout_unwinds_it_comes_after_the_unwinding() -> None:
    cut: list[str] = []
    gates: dict[asyncio.Task[None], CancelGate] = {}
    task = asyncio.create_task(_timed_clean_up(gates, 0.02, cut))
    gates[task] = CancelGate(task)
    await asyncio.sleep(0.15)  # the timeout expired; the clean-up runs until about 0.32 s
    assert not task.done()
    gates[task].cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert cut == [] and task.cancelled()  # cancelled, not a TimeoutError: the gate's cancel won


async def test_a_gate_cancel_turns_the_tasks_own_timeout_off() -> None:
    cut: list[str] = []
    gates: dict[asyncio.Task[None], CancelGate] = {}
    task = asyncio.create_task(_timed_clean_up(gates, 0.15, cut))
    gates[task] = CancelGate(task)
    await asyncio.sleep(0.02)
    gates[task].cancel()  # the clean-up then runs until about 0.32 s, past the timeout's 0.15 s
    await asyncio.gather(task, return_exceptions=True)
    assert cut == [] and task.cancelled()


async def test_the_gates_timeout_is_a_timeout() -> None:
    gates: dict[asyncio.Task[None], CancelGate] = {}

    async def wait() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with gates[task].timeout(0.02):
            await asyncio.sleep(10)

    task = asyncio.create_task(wait())
    gates[task] = CancelGate(task)
    with pytest.raises(TimeoutError):
        await task


@pytest.mark.parametrize("cancelled", [False, True], ids=["timeout-only", "gate-cancel-too"])
async def test_a_close_in_the_task_outlasting_its_own_timeout_ends_before_the_timeout_or_cancel(
    cancelled: bool,
) -> None:
    # The close runs in the task (CancelGate.close) inside gate.timeout(0.05) and takes 0.25 s:
    # the timeout expires after the close (TimeoutError), and a gate cancel at 0.1 s is raised
    # after it (CancelledError, the timeout not turned back on).
    closed: list[str] = []
    gates: dict[asyncio.Task[None], CancelGate] = {}

    async def slow_close() -> None:
        await asyncio.sleep(0.25)
        closed.append("closed")

    async def close_in_timeout() -> None:
        task = asyncio.current_task()
        assert task is not None
        async with gates[task].timeout(0.05):
            await gates[task].close(slow_close)
            await asyncio.sleep(10)

    task = asyncio.create_task(close_in_timeout())
    gates[task] = CancelGate(task)
    if cancelled:
        await asyncio.sleep(0.1)
        gates[task].cancel()
    outcome = (await asyncio.gather(task, return_exceptions=True))[0]
    assert closed == ["closed"]
    assert task.cancelled() if cancelled else isinstance(outcome, TimeoutError)
