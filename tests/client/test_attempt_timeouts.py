"""An attempt task's own timeouts (the drain after ``[DONE]``, the error excerpt) and its gate.

The attempt task is meant to be cancelled only through its ``CancelGate``, which holds a
cancellation back while the task closes its response in itself and never cancels it twice. Two
``asyncio.timeout`` blocks inside the task cancel it directly all the same: ``_drain``
(``DRAIN_TIMEOUT_S`` after ``[DONE]``) and ``_body_excerpt`` (0.5 s for an error body). httpx
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

from hedgerow.client import AllAttemptsFailed, HedgePolicy, HedgingClient, Upstream
from hedgerow.client.hedging import DRAIN_TIMEOUT_S
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


async def test_a_caller_leaving_during_the_drain_is_not_a_second_cancellation_with_the_drains_timeout() -> None:
    # The caller leaves at the usage chunk, while the winner's task waits in the drain for a body
    # end that never comes: the gate cancels the task, whose read's clean-up (the connection's
    # close) then runs past the drain's timeout. That timeout must not cancel the task again.
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


async def test_a_caller_leaving_while_the_drains_timeout_unwinds_the_task_cancels_it_once() -> None:
    # The drain's timeout cancels the read first (the body never ends); its clean-up takes 1 s;
    # the caller's own timeout ends the call 0.3 s after the usage chunk, in that clean-up. The
    # gate's cancellation must wait for it rather than land in it, and still end the task.
    slow = _SlowClose(delay_s=1.0)
    async with (
        ScriptedServer(whole_answer(keep_alive=False)) as server,
        HedgingClient([Upstream("a", server.base_url)], transport=slow) as client,
    ):
        with pytest.raises(TimeoutError):
            async with client.stream_chat(BODY) as stream:
                async for piece in stream:
                    if piece.get("usage"):
                        async with asyncio.timeout(0.3):
                            await asyncio.sleep(10)
        assert stream.record is not None and stream.record.status == "cancelled"
        assert active_connections(slow) == 0
        assert await server.wait_disconnect(0, timeout_s=3.0) is not None
