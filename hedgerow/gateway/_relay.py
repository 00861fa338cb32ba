"""The gateway's relay: one routed request run through its route's ``HedgingTransport`` and the
answer streamed back to the caller over ASGI.

* **Timing.** Status and headers are sent when the transport returns, which for a streamed call is
  when the winner's first token is known; the body's pieces are passed on as they arrive.
* **Disconnects.** A caller that leaves (``http.disconnect``, watched by a task of its own) cancels
  the request's task, before or after the first token; the transport's response is closed, which
  ends every attempt (the record says ``cancelled``).
* **Errors** (OpenAI-shaped JSON, :mod:`hedgerow.gateway._answers`): a call whose attempts all
  failed with HTTP errors -> 502 ``upstream_error``; ``httpx.TimeoutException`` -> 504
  ``upstream_timeout``; ``httpx.ConnectError`` -> 503 ``upstream_unreachable`` when no upstream
  could be connected to, else (an attempt got an answer that was not a stream, say) 502
  ``upstream_error``; other transport errors -> 502. When the budget refused the failover to a
  backup (the record's ``failover_denied``), the message says the backup was not tried. A non-retryable upstream 4xx and
  hedgerow's own 400 for a bad body pass through unchanged (their bodies redacted). An error after
  the first token ends the stream with an SSE ``data: {"error": ...}`` event and no ``[DONE]``.
* **Secrets.** Every header value passed on from an upstream (any answer: an error, a success,
  streamed or not, a pass-through path) goes through ``redact``, as error bodies do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from hedgerow.client import HedgingTransport
from hedgerow.client.hedging import NON_RETRYABLE_STATUSES
from hedgerow.client.transport import HEDGED_HEADER, RECORD_EXTENSION, REQUEST_ID_HEADER, WINNER_HEADER
from hedgerow.gateway._answers import (
    Receive,
    Send,
    answer,
    budget_note,
    error_message,
    failure_headers,
    openai_error,
    reached_upstream,
    read_capped,
    record_of,
)

__all__ = ["Exchange", "proxy"]

_log = logging.getLogger("hedgerow.gateway")

#: The last event of a streamed chat answer, as the transport ends it.
_DONE = b"data: [DONE]\n\n"
#: Response headers not sent on: hop-by-hop ones, and those the ASGI server sets itself.
_DROP_RESPONSE = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"date", b"server"}
)


async def proxy(
    transport: HedgingTransport,
    request: httpx.Request,
    receive: Receive,
    send: Send,
    exchange: Exchange,
    redact: Callable[[str], str],
) -> None:
    """Run the request through the transport in this task, cancelled when the caller
    disconnects (an ``http.disconnect`` from ``receive``, whose body is read already, before
    the answer's end was sent); the transport then closes every attempt.

    Args:
        transport: the route's ``HedgingTransport``.
        request: the caller's request, its body read, its credentials dropped.
        receive / send: the ASGI channel of the caller.
        exchange: what the request came to, filled in here for the metrics.
        redact: takes every configured key out of a text (error bodies, log lines).

    Raises:
        asyncio.CancelledError: when cancelled from outside (the server shutting down); a caller
            that left is not an error.
    """
    task = asyncio.current_task()
    assert task is not None
    left = False

    def caller_left(watch: asyncio.Future[None]) -> None:
        nonlocal left
        if watch.cancelled() or watch.exception() is not None or exchange.complete:
            return  # the answer was sent whole: uvicorn says "disconnect" after every answer
        left = True
        task.cancel()

    watch = asyncio.ensure_future(_wait_disconnect(receive))
    watch.add_done_callback(caller_left)
    try:
        await _forward(transport, request, send, exchange, redact)
    except asyncio.CancelledError:
        exchange.cancelled = True
        if not left or task.uncancel() > 0:
            raise  # cancelled from outside too (the server shutting down)
        _log.info(
            "gateway_disconnect path=%s",
            request.url.path,
            extra={"event": "gateway_disconnect", "fields": {"path": request.url.path}},
        )
    finally:
        watch.remove_done_callback(caller_left)
        watch.cancel()


async def _forward(
    transport: HedgingTransport, request: httpx.Request, send: Send, exchange: Exchange, redact: Callable[[str], str]
) -> None:
    try:
        response = await transport.handle_async_request(request)
    except httpx.TimeoutException as exc:
        await _failed(send, 504, "upstream_timeout", exc, exchange, redact)
        return
    except httpx.ConnectError as exc:
        if reached_upstream(exc):  # an attempt got an answer (an HTTP status, bytes): not a 503
            await _failed(send, 502, "upstream_error", exc, exchange, redact)
        else:
            await _failed(send, 503, "upstream_unreachable", exc, exchange, redact)
        return
    except httpx.TransportError as exc:
        await _failed(send, 502, "upstream_error", exc, exchange, redact)
        return
    try:
        await _relay(response, send, exchange, redact)
    finally:
        await response.aclose()


async def _failed(
    send: Send, status: int, code: str, exc: BaseException, exchange: Exchange, redact: Callable[[str], str]
) -> None:
    exchange.failed = True
    what = {504: "the call timed out", 503: "no upstream could be reached", 502: "the call failed"}[status]
    detail = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    _log.warning(
        "gateway_failed status=%d code=%s detail=%s",
        status,
        code,
        detail,
        extra={"event": "gateway_failed", "fields": {"status": status, "code": code, "detail": detail}},
    )
    message = f"hedgerow gateway: {what}: {detail}{budget_note(record_of(exc))}"
    await answer(send, status, openai_error(message, "api_error", code), extra=failure_headers(exc))


async def _relay(response: httpx.Response, send: Send, exchange: Exchange, redact: Callable[[str], str]) -> None:
    status = response.status_code
    response_headers = response.headers
    hedgerow_headers = [
        (name.lower().encode("latin-1"), response_headers.get(name, "").encode("latin-1"))
        for name in (REQUEST_ID_HEADER, WINNER_HEADER, HEDGED_HEADER)
        if name in response_headers
    ]
    failed_call = (
        status >= 400
        and status not in NON_RETRYABLE_STATUSES
        and response_headers.get(WINNER_HEADER) == ""
        and bool(response_headers.get(REQUEST_ID_HEADER))
    )
    if failed_call:
        # Every attempt failed and the last one had an HTTP error: one OpenAI-shaped 502.
        exchange.failed = True
        excerpt = error_message(await read_capped(response))
        message = f"hedgerow gateway: every attempt failed; the last upstream answered HTTP {status}"
        if excerpt:
            message += f": {redact(excerpt)[:300]}"
        message += budget_note(response.extensions.get(RECORD_EXTENSION))
        _log.warning(
            "gateway_failed status=502 code=upstream_error upstream_status=%d",
            status,
            extra={"event": "gateway_failed", "fields": {"status": 502, "upstream_status": status}},
        )
        await answer(send, 502, openai_error(message, "api_error", "upstream_error"), extra=hedgerow_headers)
        return
    # httpx keeps the names as received (lower-case over HTTP/1.1 from most servers): the raw
    # pairs are passed on, less the hop-by-hop and framing ones, each value redacted (an
    # upstream may echo its key in a header as well as in a body).
    headers = [(k.lower(), _redacted(v, redact)) for k, v in response_headers.raw if k.lower() not in _DROP_RESPONSE]
    if status >= 400:  # an error body is small: read it whole, take any key out, send it
        content = redact((await read_capped(response)).decode("utf-8", "replace")).encode()
        headers = [(k, v) for k, v in headers if k != b"content-length"]
        await answer(send, status, content, headers=headers)
        return
    if response.is_stream_consumed:  # a whole answer (a non-streamed call): one piece
        await answer(send, status, response.content, headers=[h for h in headers if h[0] != b"content-length"])
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    sse = response_headers.get("content-type", "").startswith("text/event-stream")
    tail = b""  # a closing [DONE] goes out with the end of the body: one write less
    try:
        async for piece in response.aiter_raw():
            if tail:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
                tail = b""
            if piece == _DONE:
                tail = piece
                continue
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    except httpx.TransportError as exc:
        # After the first token: the status is sent, so the error goes into the stream.
        exchange.stream_failed = True
        code = "upstream_timeout" if isinstance(exc, httpx.TimeoutException) else "upstream_error"
        detail = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        _log.warning(
            "gateway_stream_failed code=%s detail=%s",
            code,
            detail,
            extra={"event": "gateway_stream_failed", "fields": {"code": code, "detail": detail}},
        )
        if sse:
            error = openai_error(f"hedgerow gateway: the stream failed: {detail}", "api_error", code)
            tail += b"data: " + error + b"\n\n"
    await send({"type": "http.response.body", "body": tail, "more_body": False})


def _redacted(value: bytes, redact: Callable[[str], str]) -> bytes:
    """A response header's ``value`` with every configured key taken out (the same bytes when
    it holds none)."""
    text = value.decode("latin-1")
    clean = redact(text)
    return value if clean == text else clean.encode("latin-1", "replace")


class Exchange:
    """What one request came to, for the metrics: where it went and how it ended.

    Attributes:
        arrived_at / started_at: monotonic times of the request's arrival and of its status line
            (None until sent), seconds.
        status: the HTTP status sent (0 until sent).
        route / model: the route's name and public model name (``""`` until routed).
        key: the name of the caller's gateway key (``""`` without keys, or before the key is known).
        complete: the answer's last piece was sent.
        refused / failed / stream_failed / cancelled: what ended it, when not an answer.
    """

    __slots__ = (
        "arrived_at",
        "cancelled",
        "complete",
        "failed",
        "key",
        "model",
        "refused",
        "route",
        "started_at",
        "status",
        "stream_failed",
    )

    def __init__(self, arrived_at: float) -> None:
        self.arrived_at = arrived_at
        self.started_at: float | None = None
        self.status = 0
        self.route = ""
        self.model = ""
        self.key = ""
        self.refused = False
        self.failed = False
        self.stream_failed = False
        self.cancelled = False
        self.complete = False

    def outcome(self) -> str:
        """The ``outcome`` label (``hedgerow.gateway._metrics.OUTCOMES``)."""
        if self.cancelled:
            return "cancelled"
        if self.stream_failed:
            return "stream_failed"
        if self.failed:
            return "failed"
        if self.refused:
            return "refused"
        if 0 < self.status < 400:
            return "ok"
        return "client_error"


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
