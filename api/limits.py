"""Request limits enforced while the request streams: body size, body read time, header read time.

- :class:`BodyLimitMiddleware` (ASGI): a body whose declared ``Content-Length`` exceeds the
  limit of its endpoint is refused with 413 before a byte of it is read; a chunked (or
  under-declared) body is read chunk by chunk and refused with 413 the moment the bytes received
  would pass the limit, so the server never holds more than the limit of one request. A body
  not received whole within ``body_read_timeout_s`` is answered 408, and one still arriving
  when a shutdown cancels the request 503. These answers close the connection (the rest of the
  body is never read). The endpoint then reads the buffered body
  as usual (``await request.body()`` is bounded by the limit). These answers are the api's JSON
  error shape, except for the console's pages (``/ui/...``), which get the console's HTML error
  page (:func:`hedgerow.api._page_kit.refusal_page`) with the same status and sentence.
- :func:`too_large_response`: the 413 of an endpoint whose own limit is below the one the
  middleware enforced for it, in the same shape and words as the middleware's.
- :class:`HeaderTimeoutH11Protocol`: uvicorn's h11 protocol with a deadline on the request
  head: a connection whose request line and headers are not complete ``header_read_timeout_s``
  after the first byte of them (or after the connection opened) is closed. uvicorn bounds the
  size of a head (``h11_max_incomplete_event_size``) and the idle time between requests
  (``timeout_keep_alive``) but not the time a head may take; this is the one addition.
- :class:`HeaderTimeoutHttpToolsProtocol`: the same deadline on uvicorn's httptools protocol
  (the C parser, several times faster than h11), which :func:`header_timeout_protocol` picks
  whenever ``httptools`` is installed (a dependency of hedgerow on CPython).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import h11
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is a dependency on CPython
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

__all__ = [
    "DEFAULT_BODY_LIMIT_BYTES",
    "BodyLimitMiddleware",
    "HeaderTimeoutH11Protocol",
    "HeaderTimeoutHttpToolsProtocol",
    "error_detail",
    "header_timeout_protocol",
    "send_refusal",
    "too_large_message",
    "too_large_response",
]

#: Body limit of every endpoint without a larger one of its own (route and price changes are
#: ~300 bytes; a GET has no body).
DEFAULT_BODY_LIMIT_BYTES = 65_536

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]


class BodyLimitMiddleware:
    """Refuse request bodies over their endpoint's limit (413) or slower than a deadline (408).

    Args:
        app: the ASGI app to protect.
        limit_for: ``(method, path) -> limit in bytes`` of the request's body.
        body_read_timeout_s: seconds within which the whole body must arrive (from the request
            head), > 0.

    Answers are JSON ``{"detail": {"field": "body", "message": "..."}}`` naming the limit (for a
    path under ``/ui/``, the console's HTML error page with that message), with ``Connection:
    close``.
    """

    def __init__(self, app: Any, limit_for: Callable[[str, str], int], body_read_timeout_s: float) -> None:
        if not (math.isfinite(body_read_timeout_s) and body_read_timeout_s > 0):
            raise ValueError(f"body_read_timeout_s: must be a positive number of seconds, got {body_read_timeout_s!r}")
        self.app = app
        self.limit_for = limit_for
        self.body_read_timeout_s = body_read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer the body of an HTTP request within its limits, then run the app on it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not _has_header(scope, b"content-length") and not _has_header(scope, b"transfer-encoding"):
            # neither Content-Length nor Transfer-Encoding: the request has no body (RFC 9112
            # 6.3), nothing to bound or time (the polls of GET /v1/thresholds take this path)
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        limit_bytes = self.limit_for(scope["method"], scope["path"])
        if declared is not None and declared > limit_bytes:
            await _refuse(scope, send, 413, too_large_message(limit_bytes, declared))
            return
        chunks: list[bytes] = []
        size_bytes = 0
        more = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_read_timeout_s
        while more:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                await _refuse(scope, send, 408, f"request body not received within {self.body_read_timeout_s:g} s")
                return
            except asyncio.CancelledError:
                # uvicorn cancels requests still running when its graceful-shutdown timeout
                # ends; one still waiting for its body is answered 503 and ends quietly.
                await _refuse(scope, send, 503, "server shutting down before the request body arrived")
                return
            if message["type"] == "http.disconnect":
                return  # the client left: nothing to answer
            body = message.get("body", b"")
            size_bytes += len(body)
            if size_bytes > limit_bytes:
                await _refuse(scope, send, 413, too_large_message(limit_bytes))
                return
            if body:
                chunks.append(body)
            more = bool(message.get("more_body", False))
        whole = b"".join(chunks)
        chunks.clear()
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return dict(await receive())  # after the body: waits for the disconnect

        await self.app(scope, replay, send)


def _has_header(scope: Scope, name: bytes) -> bool:
    """True when the request carries header ``name`` (lower-case bytes)."""
    return any(key == name for key, _value in scope.get("headers", ()))


def _content_length(scope: Scope) -> int | None:
    """The declared ``Content-Length`` of the request, or None (absent or not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def too_large_message(limit_bytes: int, size_bytes: int | None = None) -> str:
    """The sentence of a 413: ``body of N bytes exceeds the limit of L bytes`` (or ``body exceeds
    the limit of L bytes`` when the size is not known, as for a chunked body cut at the limit).

    Args:
        limit_bytes: the endpoint's body limit, bytes.
        size_bytes: the body's size (declared or read), bytes; None when unknown.
    """
    if size_bytes is None:
        return f"body exceeds the limit of {limit_bytes} bytes"
    return f"body of {size_bytes} bytes exceeds the limit of {limit_bytes} bytes"


def error_detail(field: str, message: str) -> dict[str, dict[str, str]]:
    """The api's error body ``{"detail": {"field": field, "message": message}}``.

    Args:
        field: what was wrong (``body``, ``host``, ``model``, ...).
        message: the explanation, one sentence.
    """
    return {"detail": {"field": field, "message": message}}


def too_large_response(limit_bytes: int, size_bytes: int | None = None) -> JSONResponse:
    """A 413 ``{"detail": {"field": "body", "message": ...}}`` for an endpoint that read a body
    over its own limit (below the middleware's): the middleware's shape and words.

    Args:
        limit_bytes: the endpoint's body limit, bytes.
        size_bytes: the body's size, bytes (None when unknown).
    """
    return JSONResponse(error_detail("body", too_large_message(limit_bytes, size_bytes)), status_code=413)


def _console_path(scope: Scope) -> bool:
    """True for a request to the console's pages (``/ui`` and below), answered in HTML."""
    path: str = scope.get("path", "")
    return path == "/ui" or path.startswith("/ui/")


async def _refuse(scope: Scope, send: Send, status_code: int, message: str) -> None:
    """Refuse the request's body with ``status_code`` and close: the console's HTML error page for
    a console path, else ``{"detail": {"field": "body", "message": message}}``."""
    if not _console_path(scope):
        await send_refusal(send, status_code, "body", message)
        return
    from hedgerow.api._page_kit import refusal_page  # Jinja2 and the templates, loaded on first use

    page = refusal_page(scope, status_code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status_code,
            "headers": [*page.raw_headers, (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": page.body})


async def send_refusal(
    send: Send, status_code: int, field: str, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Answer ``{"detail": {"field": field, "message": message}}`` (the api's error shape) with
    ``status_code`` and ``Connection: close`` (a request body left unread is never read).

    Args:
        send: the ASGI ``send`` of the request.
        status_code: the HTTP status.
        field: what was wrong (``body``, ``host``, ``authorization``, ...).
        message: the explanation.
        headers: extra response headers (lower-case names), e.g. ``www-authenticate``.
    """
    body = json.dumps(error_detail(field, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections whose request head is not complete in time.

    The deadline (``header_read_timeout_s``, a class attribute set by :func:`header_timeout_protocol`)
    starts when the connection opens, and again when the first bytes of a following request on a
    kept-alive connection arrive; it ends when h11 has parsed the whole head.
    """

    header_read_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Open the connection and start the head deadline."""
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        """Feed h11; start the deadline on a new head's first bytes, stop it once the head is parsed."""
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_timer is None:
                self._arm_head_timer()
        elif self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline and close as uvicorn does."""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_read_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        """Close the connection if its request head is still incomplete."""
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


if HttpToolsProtocol is not None:

    class HeaderTimeoutHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, closing connections whose request head is not complete in time.

        The same deadline as :class:`HeaderTimeoutH11Protocol`: armed when the connection opens and
        when the parser sees the first byte of a following request (``on_message_begin``),
        stopped when the head is parsed (``on_headers_complete``).
        """

        header_read_timeout_s: float = 10.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            """Open the connection and start the head deadline."""
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._arm_head_timer()

        def on_message_begin(self) -> None:
            """A new request's first bytes: start the deadline (if not running)."""
            super().on_message_begin()
            if self._head_timer is None:
                self._arm_head_timer()

        def on_headers_complete(self) -> None:
            """The head is parsed: stop the deadline, then run the request as uvicorn does."""
            self._stop_head_timer()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            """Stop the deadline and close as uvicorn does."""
            self._stop_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(self.header_read_timeout_s, self._head_timeout)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            """Close the connection: its request head did not complete in time."""
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

else:  # pragma: no cover - httptools is a dependency on CPython
    HeaderTimeoutHttpToolsProtocol = None  # type: ignore[assignment, misc]


def header_timeout_protocol(
    header_read_timeout_s: float, *, prefer_httptools: bool = True
) -> type[HeaderTimeoutH11Protocol] | type[Any]:
    """A protocol class with the given head deadline, for ``uvicorn.Config(http=...)``.

    :class:`HeaderTimeoutHttpToolsProtocol` when ``httptools`` is installed and
    ``prefer_httptools``, else :class:`HeaderTimeoutH11Protocol`.

    Args:
        header_read_timeout_s: seconds a request head may take, > 0.
        prefer_httptools: use the httptools parser where it is installed.

    Raises:
        ValueError: a deadline that is not a positive finite number.
    """
    if not (math.isfinite(header_read_timeout_s) and header_read_timeout_s > 0):
        raise ValueError(f"header_read_timeout_s: must be a positive number of seconds, got {header_read_timeout_s!r}")
    attributes = {"header_read_timeout_s": header_read_timeout_s}
    if prefer_httptools and HeaderTimeoutHttpToolsProtocol is not None:
        return type("HeaderTimeoutHttpToolsProtocol", (HeaderTimeoutHttpToolsProtocol,), attributes)
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), attributes)
