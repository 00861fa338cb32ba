"""hedgerow's own httpx transport: httpx's, made safe to cancel, with bodies closed and capped.

A hedged call cancels attempts all the time (every loser, every abandoned stream), so the
client relies on what httpx/httpcore do when a task is cancelled in the middle of a request.
Two of those behaviours leak connections, and this transport wraps httpx's to avoid both,
through public interfaces only (the ``trace`` request extension of httpcore, documented at
https://www.encode.io/httpcore/extensions/#trace, and ``httpx.AsyncBaseTransport``):

1. **A cancellation between a new connection's connect and its first request** leaves that
   connection in the pool in state NEW, owned by no request: never available, never idle, never
   closed, so it holds a pool slot and a socket for good (encode/httpcore#1093; in httpcore 1.0.9
   the window is the ``_state_lock`` acquisition right after the connect, and a cancellation
   delivered *during* the connect lands there too when the connect completes regardless, as
   anyio defers it). Here the inner send runs in a task of its own, followed through the
   ``trace`` events (``_Gate``). When the caller is cancelled, a request inside that window
   (``connect_tcp.complete`` seen, ``send_request_headers.started`` not yet) is let through it
   first (bounded by ``SAFE_WAIT_S``) and then cancelled, once; a request still connecting is
   cancelled at once, and should its connect complete anyway the trace hook closes the new stream
   and fails the connect, which httpcore handles (the connection is marked closed and dropped).
   Once the request is under way, httpcore's own ``except BaseException`` path closes the
   connection.
2. **A cancellation while a response is being closed** leaves the connection counted as active
   (encode/httpcore#1115). Every response body is wrapped so that its ``aclose`` runs to its end
   whoever closes it: in a task of its own (``close_shielded``), or, when the gated task that sent
   the request closes it (below), in that task with its gate holding a cancellation back until the
   close has ended (``CancelGate.close``).

The caller's cancellation is never swallowed: after the inner task ended (and a response that
arrived anyway was closed), the ``CancelledError`` is raised again.

A caller that cancels its task only through a ``CancelGate`` (the hedging client's attempt tasks,
which nothing else cancels) passes the gate in the request's ``GATE_EXTENSION``: the inner send
then runs in the caller's own task, with no task, shield and loop turns of its own per request
(two event-loop turns before the first token), and the gate holds a cancellation asked for inside
the window back until the request has started (at most ``SAFE_WAIT_S``), as above. That task's
close of the response runs in the task too (no task, shield and four loop handles per close),
the gate holding a cancellation asked for meanwhile back until the close has ended.

Bodies: a request whose ``extensions`` carry ``BODY_LIMIT_EXTENSION`` (an int, bytes) gets a
response body that fails with ``BodyTooLarge`` once more than that many bytes were read (the
whole-response path uses it; streamed answers bound each SSE event instead).

httpx and httpcore are pinned to the ranges this was tested with (``pyproject.toml``);
``tests/client/test_owned_transport.py`` fails if the trace events or the cancellation behaviour
relied on here change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Self

import httpx

from hedgerow.client._pool import linear_pool_transport
from hedgerow.client.errors import AttemptError

__all__ = [
    "BODY_LIMIT_EXTENSION",
    "GATE_EXTENSION",
    "SAFE_WAIT_S",
    "BodyTooLarge",
    "CancelGate",
    "OwnedTransport",
    "close_shielded",
]

#: Request extension naming the largest response body (bytes) the caller will read.
BODY_LIMIT_EXTENSION = "hedgerow.max_body_bytes"

#: Request extension carrying the calling task's ``CancelGate``: the send runs in that task.
GATE_EXTENSION = "hedgerow.cancel_gate"

#: Trace events (suffixes) after which a new connection is in the connect-to-request window, and
#: those that end the window (the request started, a TLS handshake started, something failed).
_WINDOW_OPENS = ("connect_tcp.complete", "connect_unix_socket.complete", "start_tls.complete")
_WINDOW_CLOSES = ("send_request_headers.started", "start_tls.started", ".failed")

#: Longest wait (s) for a request inside the connect-to-request window before it is cancelled
#: anyway; the window normally lasts one event-loop step (a TLS handshake at most).
SAFE_WAIT_S = 5.0

_Trace = Callable[[str, Mapping[str, Any]], Awaitable[None]]


class BodyTooLarge(AttemptError):
    """A response body passed the limit set by ``BODY_LIMIT_EXTENSION`` (``error_type`` ``body_too_large``)."""

    def __init__(self, limit: int) -> None:
        super().__init__("body_too_large", f"response body larger than {limit} bytes")
        self.limit = limit


async def close_shielded(close: Callable[[], Awaitable[object]]) -> None:
    """Run ``close()`` to its end even if the calling task is cancelled meanwhile.

    httpx/httpcore leave a connection marked active in the pool forever when the task closing
    its response is cancelled inside that close (encode/httpcore#1115). The close runs in its own
    task; a cancellation of the caller waits for that task to end and is then re-raised.

    Args:
        close: a zero-argument coroutine function, e.g. ``response.aclose``.

    Raises:
        asyncio.CancelledError: when the caller was cancelled (after the close finished).
        Exception: whatever the close itself raised.
    """
    closing = asyncio.ensure_future(close())
    cancelled: asyncio.CancelledError | None = None
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not closing.cancelled():
            closing.exception()  # retrieved, so that asyncio does not log it as never retrieved
        raise cancelled
    closing.result()


class _Gate:
    """Follows one request through httpcore's trace events to tell when it may be cancelled.

    A cancellation must not reach the request between a new connection's connect (or TLS
    handshake) and the start of the request: the connection would stay NEW in the pool for good.
    ``cancellable`` is cleared when a connect completes and set again when the request starts
    (or anything fails). A cancellation asked for while a connect is still under way is delivered
    at once, but the connect may complete all the same (the cancel lands later, inside the
    window): so when a connect or handshake completes after a cancellation was asked for, the
    new stream is closed and the connect is failed from the trace hook, which makes httpcore
    mark the connection closed and drop it from the pool.
    """

    __slots__ = ("_inner", "cancel_requested", "cancellable")

    def __init__(self, inner: _Trace | None) -> None:
        self._inner = inner
        self.cancellable = asyncio.Event()
        self.cancellable.set()
        self.cancel_requested = False

    async def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """The ``trace`` extension's callback (chains the caller's own, if any)."""
        if self._inner is not None:
            await self._inner(event, info)
        if event.endswith(_WINDOW_OPENS):
            if self.cancel_requested:
                await _refuse_connection(info)
            self.cancellable.clear()
        elif event.endswith(_WINDOW_CLOSES):
            self.cancellable.set()


async def _refuse_connection(info: Mapping[str, Any]) -> None:
    """From a trace hook: close the stream of a connect that completed after the request was
    cancelled and fail the connect, which makes httpcore mark the connection closed and drop it."""
    stream = info.get("return_value")
    if stream is not None and hasattr(stream, "aclose"):
        await close_shielded(stream.aclose)
    raise asyncio.CancelledError("hedgerow: connect completed after the request was cancelled")


class CancelGate:
    """Cancels one task (``cancel``) except inside a new connection's connect-to-request window.

    For a task that sends its requests through an ``OwnedTransport`` with this gate in the
    request's ``GATE_EXTENSION`` and is never cancelled otherwise (``Task.cancel`` directly
    could land in the window and orphan the connection, encode/httpcore#1093). The transport then
    sends in that task itself. ``cancel`` cancels the task at once, unless a connect (or TLS
    handshake) of its request has completed and the request has not started yet: then the
    cancellation is delivered when the request starts or fails, or after ``SAFE_WAIT_S``. A
    cancellation delivered during a connect that completes anyway is repaired as by the
    transport's own gate (the new stream closed, the connect failed from the trace hook).

    The gate also closes the task's responses (``close``): in the task itself, holding a
    cancellation asked for meanwhile back until the close has ended (encode/httpcore#1115).
    A timeout of the task's own cancels the task directly: the task takes it from ``timeout``,
    which keeps it from cutting a close short or from being a second cancellation.

    Args:
        task: the task to cancel (the one that sends through the transport).
    """

    __slots__ = ("_asked", "_closing", "_deferred", "_extensions", "_inner", "_late", "_task", "_timeout", "_window")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._inner: _Trace | None = None
        self._extensions: dict[str, Any] | None = None  # the request's, to take the trace out of
        self._window = False  # inside the connect-to-request window
        self._closing = False  # the task is closing a response (``close``)
        self._asked = False  # ``cancel`` was called
        self._late: asyncio.TimerHandle | None = None  # a cancellation held back by the window
        self._timeout: asyncio.Timeout | None = None  # the task's own timeout under way (``timeout``)
        self._deferred = False  # ``cancel`` came while that timeout's cancellation was under way

    def cancel(self) -> None:
        """Cancel the task now, when its request leaves the window (at most ``SAFE_WAIT_S``), or
        when the close of a response it is running (``close``) has ended.

        Calls ``Task.cancel`` at most once per gate (a cancellation held back by a close is raised
        by ``close`` in the task instead), and never while the task's own ``timeout`` is cancelling
        it: that timeout is turned off first, or, when it has expired already, the cancellation is
        raised by ``timeout`` once its block has ended.
        """
        if self._asked:
            return
        self._asked = True
        if self._closing:
            return  # ``close`` raises CancelledError in the task once the close has ended
        timeout = self._timeout
        if timeout is not None:
            if timeout.expired():  # its Task.cancel is under way: a second one could cut a close short
                self._deferred = True
                return
            timeout.reschedule(None)  # one cancellation at a time: this one
        if not self._window:
            self._task.cancel()
        else:
            self._late = asyncio.get_running_loop().call_later(SAFE_WAIT_S, self._deliver)

    async def close(self, close: Callable[[], Awaitable[object]]) -> None:
        """Run ``close()`` (a response's close) to its end, whatever cancellation comes meanwhile.

        In the gate's own task, when no cancellation of it was asked for yet, the close runs in
        the task (no task of its own): a ``cancel`` asked for meanwhile is held back and raised
        here as ``asyncio.CancelledError`` once the close has ended, as ``close_shielded`` would
        re-raise it; inside the task's own ``timeout`` the timeout is off during the close (its
        expiry would cut the close short) and back on, at its deadline, after it. Anywhere else
        (another task, or a task already being cancelled) it is ``close_shielded(close)``.

        Raises:
            asyncio.CancelledError: when the task was cancelled meanwhile (after the close).
            Exception: whatever the close itself raised.
        """
        task = self._task
        if self._asked or self._closing or asyncio.current_task() is not task or task.cancelling():
            await close_shielded(close)
            return
        self._closing = True
        timeout = self._timeout  # not expired: the task would be cancelling
        when = None
        if timeout is not None:
            when = timeout.when()
            timeout.reschedule(None)
        try:
            await close()
        finally:
            self._closing = False
            if self._asked:  # asked for during the close: delivered now, in the task itself
                raise asyncio.CancelledError("hedgerow: cancelled while closing a response")
            if timeout is not None:
                timeout.reschedule(when)  # a deadline passed meanwhile expires at once

    @asynccontextmanager
    async def timeout(self, delay_s: float) -> AsyncIterator[None]:
        """``asyncio.timeout(delay_s)`` for a block of the gate's own task (not nested).

        The timeout's expiry cancels the task directly, bypassing the gate; this block tells the
        gate, so that the timeout is off while ``close`` closes a response in the task (the expiry
        would cut the close short; it comes after the close instead) and a ``cancel`` is not a second
        cancellation of a task that the expiry is already unwinding (which would cut httpcore's
        close of the connection short, encode/httpcore#1115): before the expiry ``cancel`` turns
        the timeout off, after it the cancellation is raised here once the block has ended.

        Raises:
            TimeoutError: as ``asyncio.timeout`` does, when the block outlasted ``delay_s``.
            asyncio.CancelledError: when ``cancel`` was called meanwhile.
        """
        try:
            async with asyncio.timeout(delay_s) as timeout:
                self._timeout = timeout
                try:
                    yield
                finally:
                    self._timeout = None
        finally:
            if self._deferred:
                self._deferred = False
                raise asyncio.CancelledError("hedgerow: cancelled while a timeout of the task was under way")

    def _deliver(self) -> None:
        if self._late is not None:
            self._late.cancel()
            self._late = None
            self._task.cancel()

    def chain(self, inner: _Trace | None, extensions: dict[str, Any] | None = None) -> _Trace:
        """The ``trace`` callback for the request, calling the caller's own ``inner`` first.

        Args:
            inner: the caller's own ``trace`` callback, or None.
            extensions: the request's extensions dict, which httpcore reads the ``trace`` of at
                each traced step. Without ``inner``, the callback takes itself out of it once the
                request has started (``send_request_headers.started``): no window can open after
                that, and httpcore then skips its trace work for the rest of the request (the
                step under way reports its end; eight awaited callbacks fewer per request).
        """
        self._inner = inner
        self._extensions = extensions if inner is None else None
        return self.trace

    async def trace(self, event: str, info: Mapping[str, Any]) -> None:
        """The ``trace`` extension's callback (chains the caller's own, if any)."""
        if self._inner is not None:
            await self._inner(event, info)
        if event.endswith(_WINDOW_OPENS):
            if self._asked:  # cancelled during the connect, which completed all the same
                await _refuse_connection(info)
            self._window = True
        elif event.endswith(_WINDOW_CLOSES):
            self._window = False
            self._deliver()
            if self._extensions is not None and event.endswith("send_request_headers.started"):
                self._extensions.pop("trace", None)  # the request is on its connection: no window left
                self._extensions = None


class _ShieldedBody(httpx.AsyncByteStream):
    """A response body whose ``aclose`` runs to its end when the closing task is cancelled, and
    that fails with ``BodyTooLarge`` past ``limit`` bytes (None: no limit). With the sending
    task's ``gate`` the close goes through ``CancelGate.close``, else ``close_shielded``."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int | None, gate: CancelGate | None = None) -> None:
        self._inner = inner
        self._limit = limit
        self._gate = gate
        self._pieces: AsyncIterator[bytes] | None = None
        self._read = 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._limit is None:  # the inner iterator itself: nothing added per piece
            return self._inner.__aiter__()
        self._pieces = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._pieces is not None and self._limit is not None
        piece = await self._pieces.__anext__()
        self._read += len(piece)
        if self._read > self._limit:
            raise BodyTooLarge(self._limit)
        return piece

    async def aclose(self) -> None:
        """Close the inner body with ``CancelGate.close`` (with a gate) or ``close_shielded``."""
        if self._gate is not None:
            await self._gate.close(self._inner.aclose)
        else:
            await close_shielded(self._inner.aclose)


class OwnedTransport(httpx.AsyncBaseTransport):
    """httpx's transport (or any async transport) made safe to cancel (see the module docstring).

    Args:
        inner: the transport to wrap; default ``httpx.AsyncHTTPTransport(limits=limits)`` with a
            ``LinearPool`` (``hedgerow.client._pool``: httpcore's pool, its bookkeeping linear).
        limits: connection limits of the default inner transport (ignored with ``inner``).

    ``aclose`` closes the inner transport.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None, *, limits: httpx.Limits | None = None) -> None:
        self._inner = inner if inner is not None else linear_pool_transport(limits or httpx.Limits())

    async def __aenter__(self) -> Self:
        return self

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the inner transport; see the module docstring for cancellation.

        Raises what the inner transport raises; ``asyncio.CancelledError`` when the caller is
        cancelled (after the inner request ended and any response it produced was closed).
        """
        extensions = dict(request.extensions)
        limit = extensions.pop(BODY_LIMIT_EXTENSION, None)
        own = extensions.pop(GATE_EXTENSION, None)
        gated = own if isinstance(own, CancelGate) else None
        if gated is not None:  # the caller's task cancels itself only through its gate
            extensions["trace"] = gated.chain(extensions.get("trace"), extensions)
            request.extensions = extensions
            response = await self._inner.handle_async_request(request)
        else:
            gate = _Gate(extensions.get("trace"))
            extensions["trace"] = gate.trace
            request.extensions = extensions
            sending = asyncio.ensure_future(self._inner.handle_async_request(request))
            try:
                response = await asyncio.shield(sending)
            except asyncio.CancelledError:
                await _cancel_safely(sending, gate)
                raise
        if isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = _ShieldedBody(response.stream, limit if isinstance(limit, int) else None, gated)
        return response

    async def aclose(self) -> None:
        """Close the inner transport (its connection pool)."""
        await self._inner.aclose()


async def _cancel_safely(sending: asyncio.Future[httpx.Response], gate: _Gate) -> None:
    """Cancel the inner send once it may be cancelled (``_Gate``), wait for it to end without
    letting further cancellations through, and close a response it produced anyway."""
    gate.cancel_requested = True
    await _wait_through(_cancellable_or_done(sending, gate))
    sending.cancel()
    await _wait_through(asyncio.wait({sending}))
    if sending.cancelled():
        return
    if sending.exception() is None:
        await close_shielded(sending.result().aclose)


async def _cancellable_or_done(sending: asyncio.Future[httpx.Response], gate: _Gate) -> None:
    if gate.cancellable.is_set() or sending.done():
        return
    waiter: asyncio.Future[Any] = asyncio.ensure_future(gate.cancellable.wait())
    pending: set[asyncio.Future[Any]] = {waiter, sending}
    try:
        await asyncio.wait(pending, timeout=SAFE_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


async def _wait_through(awaitable: Awaitable[object]) -> None:
    """Await ``awaitable`` to its end in a task of its own; cancellations of the caller meanwhile
    are absorbed (the caller is already being cancelled and re-raises afterwards)."""
    task = asyncio.ensure_future(awaitable)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
