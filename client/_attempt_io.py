"""The I/O of one attempt: its request ids and headers, sending it, and reading its body safely.

Behind :mod:`hedgerow.client.hedging` (the streamed call), :mod:`hedgerow.client.unary` (whole
responses) and :mod:`hedgerow.client.transport`: the per-attempt ``X-Request-ID``, the request
template of an upstream (``AttemptSender``), a streamed send safe to cancel, the checks that a
200 body is SSE and that no event grows without bound, the JSON of one chunk, the short excerpt
of an error body, and draining a finished body so its connection is reused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, suppress
from typing import Any, Self, cast

import httpx
import orjson

from hedgerow.client._transport import CancelGate, OwnedTransport
from hedgerow.client.errors import (
    AttemptError,
    EventTooLarge,
)
from hedgerow.client.policy import Upstream

__all__ = [
    "ATTEMPT_HEADER",
    "ATTEMPT_ID_NAMESPACE",
    "DRAIN_LIMIT_BYTES",
    "DRAIN_TIMEOUT_S",
    "NON_RETRYABLE_STATUSES",
    "AttemptSender",
    "EventSizeCap",
    "SniffSse",
    "attempt_request_id",
    "body_excerpt",
    "check_sse",
    "drain_body",
    "encode_body",
    "not_found_hint",
    "open_response",
    "parse_chunk",
    "random_uuid_hex",
    "send_streaming",
    "text_excerpt",
    "wait_tasks_shielded",
]

log = logging.getLogger("hedgerow.client")

#: HTTP statuses that are the caller's fault: no failover. Every other non-200 status (408, 409,
#: 429, 5xx, ...) counts as a failure of that upstream and fails over.
NON_RETRYABLE_STATUSES = frozenset({400, 401, 403, 404, 422})

#: Namespace of the per-attempt ``X-Request-ID`` UUIDs: ``uuid5(NAMESPACE_URL, "urn:hedgerow:attempt")``.
ATTEMPT_ID_NAMESPACE = uuid.UUID("f7d48826-16ed-57b7-b49b-b1852ac7e596")
_NAMESPACE_BYTES = ATTEMPT_ID_NAMESPACE.bytes

#: Header naming the attempt's role (``primary``, ``backup``, ``backup2``) on every attempt.
ATTEMPT_HEADER = "X-Hedgerow-Attempt"

#: The request body's JSON encoder (as ``json.dumps(body, ensure_ascii=False, separators=(",", ":"),
#: allow_nan=False)``, made once: ``json.dumps`` with options builds an encoder per call).
encode_body = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

#: After ``[DONE]``, how long (s) and how much SSE data (bytes) the client reads to reach the end
#: of the HTTP body, so that the connection can be reused; normally the end comes at once.
DRAIN_TIMEOUT_S = 0.05
DRAIN_LIMIT_BYTES = 16384


def attempt_request_id(request_id: str, role: str) -> str:
    """The ``X-Request-ID`` of one attempt: a UUID string in canonical 8-4-4-4-12 form.

    Args:
        request_id: the call's id (any string; also the ``Idempotency-Key``).
        role: the attempt's header role (``primary``, ``backup``, ``backup2``).

    Returns:
        ``str(uuid.uuid5(ATTEMPT_ID_NAMESPACE, f"{request_id}-{role}"))``: the same inputs always
        give the same id, so upstream logs can be matched to a call's record. Computed as RFC 9562
        section 5.5 defines a version-5 UUID (SHA-1 of namespace and name, version and variant
        bits set), without building a ``uuid.UUID`` (a third of the cost; the string is the same).
    """
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + f"{request_id}-{role}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 9562 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def random_uuid_hex() -> str:
    """A random (version 4) UUID as 32 hex digits, as ``uuid.uuid4().hex`` gives it, from
    ``os.urandom`` as ``uuid4`` takes it, without building a ``uuid.UUID`` (a third of the cost)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 9562 variant
    return raw.hex()


async def wait_tasks_shielded(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until every task in ``tasks`` has ended, without ever cancelling any of them.

    ``asyncio.gather`` cancels its children when the waiting task is cancelled: a second
    ``Task.cancel()`` on an attempt task that is already closing its response after a first one
    interrupts httpcore's own close of the connection, which anyio's shielding cannot stop (a
    native ``Task.cancel`` is not an anyio cancel scope). The connection then stays counted as
    active in the pool, its socket open, for good. This waits instead; a cancellation of the
    caller is re-raised once every task has ended. Exceptions of the tasks are retrieved and
    dropped.

    Args:
        tasks: the tasks (or futures) to wait for; may be empty.

    Raises:
        asyncio.CancelledError: when the caller was cancelled meanwhile (after the wait).
    """
    cancelled: asyncio.CancelledError | None = None
    pending = [t for t in tasks if not t.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError as exc:
            cancelled = exc
        pending = [t for t in pending if not t.done()]
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so that asyncio does not log it as never retrieved
    if cancelled is not None:
        raise cancelled


class EventSizeCap(httpx.AsyncByteStream):
    """A response body that fails with ``EventTooLarge`` once ``limit`` bytes pass without an SSE
    event boundary (a blank line), before the SSE decoder buffers them.

    The decoder (``SseDecoder``) keeps an incomplete line, and the lines of an unfinished event, in
    memory with no bound; this counts the bytes since the last blank line (two line breaks in a row other than
    one CRLF: ``\n\n``, ``\r\r``, ``\n\r``, across piece boundaries too), which bounds a line and
    an event alike. Per piece it costs three ``bytes.rfind`` calls; it adds no generator (it is
    its own iterator) and closing it closes the inner body.
    """

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit
        self._pieces: AsyncIterator[bytes] | None = None
        self._since = 0  # bytes since the last event boundary
        self._last = 0  # last byte of the previous piece (0: none)

    def __aiter__(self) -> Self:
        self._pieces = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._pieces is not None
        piece = await self._pieces.__anext__()
        if not piece:
            return piece
        cut = max(piece.rfind(b"\n\n"), piece.rfind(b"\r\r"), piece.rfind(b"\n\r"))
        if cut >= 0:
            self._since = len(piece) - cut - 2
        elif self._last in (10, 13) and piece[0] in (10, 13) and not (self._last == 13 and piece[0] == 10):
            self._since = len(piece) - 1
        else:
            self._since += len(piece)
        self._last = piece[-1]
        if self._since > self._limit:
            raise EventTooLarge(self._limit)
        return piece

    async def aclose(self) -> None:
        """Close the inner body."""
        await self._inner.aclose()


#: How an SSE body may begin (after a UTF-8 BOM and blank lines): a field name and a colon, or a
#: comment. A body labelled otherwise is read as SSE only when it begins so (``SniffSse``).
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


class SniffSse(httpx.AsyncByteStream):
    """A response body labelled other than ``text/event-stream`` (or not labelled) that is let
    through only when it begins like SSE; otherwise reading it fails with ``AttemptError``
    (``malformed_stream``), so a JSON or HTML body still fails over.

    The openai SDK parses such bodies as SSE whatever their ``Content-Type``; this does the same
    for those that are SSE. It holds back at most the first few bytes until it can tell.
    """

    def __init__(self, inner: httpx.AsyncByteStream, content_type: str) -> None:
        self._inner = inner
        self._content_type = content_type
        self._pieces: AsyncIterator[bytes] | None = None
        self._decided = False

    def __aiter__(self) -> Self:
        self._pieces = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._pieces is not None
        if self._decided:
            return await self._pieces.__anext__()
        head = b""
        while True:
            try:
                head += await self._pieces.__anext__()
            except StopAsyncIteration:
                self._decided = True
                if head:
                    self._check(head, final=True)
                    return head
                raise
            if self._check(head, final=False):
                self._decided = True
                return head

    def _check(self, head: bytes, final: bool) -> bool:
        """True when ``head`` shows SSE (or the body is empty); False when it cannot tell yet (a
        prefix of an SSE start such as ``b"da"``, or only blank lines); raises when it is not SSE."""
        start = head.removeprefix(b"\xef\xbb\xbf").lstrip(b"\r\n")
        if start.startswith(_SSE_STARTS) or (final and not start):
            return True
        if not final and any(prefix.startswith(start) for prefix in _SSE_STARTS):
            return False
        label = self._content_type or "none"
        raise AttemptError("malformed_stream", f"body is not SSE (Content-Type: {label}): {start[:120]!r}")

    async def aclose(self) -> None:
        """Close the inner body."""
        await self._inner.aclose()


def check_sse(response: httpx.Response) -> None:
    """Let a body labelled other than ``text/event-stream`` (or not labelled) through only when it
    begins like SSE (``SniffSse`` wraps it); a body labelled SSE is read as it is."""
    content_type = response.headers.get("content-type", "")
    if "text/event-stream" in content_type.partition(";")[0]:
        return
    if isinstance(response.stream, httpx.AsyncByteStream):
        response.stream = SniffSse(response.stream, content_type)


def text_excerpt(data: bytes, limit: int) -> str:
    """The first ``limit`` characters of UTF-8 ``data``, for an error message."""
    return data[: limit * 4].decode("utf-8", "replace")[:limit]


def parse_chunk(data: bytes) -> dict[str, Any]:
    """The JSON object of one SSE ``data`` field (UTF-8 bytes).

    ``orjson`` parses the common case (about 3x faster than ``json`` per chunk here, which is a
    large share of the client's CPU per chunk); what it refuses and ``json`` accepts (``NaN``,
    integers beyond 64 bits, invalid UTF-8, read with replacement characters as httpx's text
    decoding did) is parsed by ``json``, so the answer does not depend on the parser.

    Raises:
        AttemptError: ``malformed_stream`` when the data is not JSON or not a JSON object.
    """
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            chunk = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            raise AttemptError("malformed_stream", f"chunk is not JSON: {text_excerpt(data, 120)!r}") from None
    if not isinstance(chunk, dict):
        raise AttemptError("malformed_stream", f"chunk is not a JSON object: {text_excerpt(data, 120)!r}")
    return chunk


async def send_streaming(http: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """``http.send(request, stream=True)``; safe to cancel when ``http``'s transport is an
    ``OwnedTransport`` (every client of this package makes it so)."""
    return await http.send(request, stream=True)


@asynccontextmanager
async def open_response(
    send: Callable[[httpx.Request], Awaitable[httpx.Response]], request: httpx.Request
) -> AsyncIterator[httpx.Response]:
    """Send ``request`` with ``send`` (a streaming send: ``send_streaming`` bound to a client, or
    ``AttemptSender.send``), yield its response, close it on exit.

    Over an ``OwnedTransport`` neither the send nor the close leaks a connection when the task
    is cancelled meanwhile. Raises what ``send`` raises.
    """
    response = await send(request)
    try:
        yield response
    finally:
        await response.aclose()  # runs to its end: OwnedTransport's body closes through the gate or close_shielded


#: Most sets of caller headers whose request header template ``AttemptSender`` keeps.
MAX_HEADER_SETS = 256

#: httpx's logger: ``AttemptSender.send`` logs each request there as ``httpx.AsyncClient.send`` does.
_httpx_log = logging.getLogger("httpx")


class AttemptSender:
    """Sends the attempts' requests of one ``HedgingClient``: what ``http.send(request,
    stream=True)`` does for that client, with less work per request.

    ``HedgingClient``'s ``httpx.AsyncClient`` has no auth, no event hooks, no mounts and no
    proxies (its transport is given, so httpx reads no proxy from the environment), and follows
    no redirects; for such a client ``send`` comes down to: refuse when closed, the request's
    timeout, the cookie jar's ``Cookie`` header, the transport's answer (a ``RequestError``
    carrying the request), the response's ``request``, the cookie jar fed with the response's
    ``Set-Cookie``, an INFO line on the ``httpx`` logger. ``send`` does exactly that, and it
    feeds the cookie jar only when the response has a ``Set-Cookie`` (httpx builds a
    ``urllib.request.Request`` to look, on every response: about 30 us of the 45 us ``send``
    adds to the transport's own work here, measured with a no-op transport, CPython 3.11,
    httpx 0.28.1). The request headers that do not change between calls (httpx's defaults,
    ``Accept``, ``Content-Type``, ``Authorization``, the upstream's ``headers``) are merged once
    per upstream (``template``) instead of on every request. A URL with credentials in it (which
    httpx turns into Basic auth) goes through ``http.send`` itself.
    """

    def __init__(self, http: httpx.AsyncClient, transport: OwnedTransport) -> None:
        self._http = http
        self._transport = transport
        self._timeout = http.timeout.as_dict()
        self._templates: dict[str, tuple[httpx.Headers, frozenset[str]]] = {}
        # with the caller's headers, per (upstream, those headers): a proxy's callers send the same
        # few sets of headers again and again (an SDK's); bounded, emptied when full
        self._with_extra: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[httpx.Headers, frozenset[str]]] = {}
        self._hosts: dict[str, str] = {}

    def template(self, upstream: Upstream, extra: Mapping[str, str] | None) -> tuple[httpx.Headers, frozenset[str]]:
        """The headers of every request to ``upstream`` but the attempt's own ids, and the
        lower-cased names that the upstream's ``headers`` set (those win over the ids too).

        Later ones replace same-named earlier ones (case-insensitively): ``Host`` (the
        upstream's host and port, as httpx sets it), httpx's default headers, ``extra`` (the
        caller's), ``Accept: text/event-stream``, ``Content-Type: application/json``,
        ``Authorization: Bearer <api_key>`` (when the upstream has a key), the upstream's
        ``headers``. Made once per upstream, and once per set of ``extra`` headers (the last
        ``MAX_HEADER_SETS`` sets kept). The caller copies the headers before changing them.
        """
        if extra is None:
            found = self._templates.get(upstream.name)
            if found is not None:
                return found
        else:
            key = (upstream.name, tuple(extra.items()))
            found = self._with_extra.get(key)
            if found is not None:
                return found
        host = self._hosts.get(upstream.name)
        if host is None:
            host = self._hosts[upstream.name] = httpx.URL(upstream.base_url).netloc.decode("ascii")
        headers = httpx.Headers({"Host": host})
        headers.update(self._http.headers)
        if extra:
            headers.update(extra)
        own = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if upstream.api_key:
            own["Authorization"] = f"Bearer {upstream.api_key}"
        headers.update(own)
        upstream_set: frozenset[str] = frozenset()
        if upstream.headers:
            headers.update(upstream.headers)
            upstream_set = frozenset(name.lower() for name in upstream.headers)
        made = (headers, upstream_set)
        if extra is None:
            self._templates[upstream.name] = made
        else:
            if len(self._with_extra) >= MAX_HEADER_SETS:
                self._with_extra.clear()
            self._with_extra[key] = made
        return made

    def request(
        self,
        url: httpx.URL,
        headers: httpx.Headers,
        content: bytes,
        params: httpx.QueryParams | None,
        extensions: dict[str, Any],
    ) -> httpx.Request:
        """A POST of ``content`` (JSON bytes) with ``headers`` (a ``template`` copy, which gets
        the ``Content-Length``) and the client's timeout; ``extensions`` are the request's own.

        The request is what ``httpx.Request(..., content=content)`` makes with these headers,
        built from a stream so that httpx does not normalize every header a second time to add
        ``Host`` (the template has it) and ``Content-Length`` (set here): half the cost.
        """
        headers["Content-Length"] = str(len(content))
        request = httpx.Request(
            "POST",
            url,
            params=params,
            headers=headers,
            stream=httpx.ByteStream(content),
            extensions={**extensions, "timeout": self._timeout},
        )
        request.read()  # ``request.content``, as with ``content=``: the body is in memory already
        return request

    async def send(self, request: httpx.Request) -> httpx.Response:
        """``http.send(request, stream=True)``, as described in the class docstring.

        Returns the streaming response (the caller closes it). Raises RuntimeError when the
        client is closed, and what the transport raises (``httpx.RequestError`` with its
        ``request`` set). Safe to cancel (``OwnedTransport``).
        """
        http = self._http
        if http.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        url = request.url
        if url.username or url.password:
            return await http.send(request, stream=True)
        cookies = http.cookies
        if cookies:
            cookies.set_cookie_header(request)
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        response.request = request
        if "set-cookie" in response.headers or "set-cookie2" in response.headers:
            cookies.extract_cookies(response)
        if _httpx_log.isEnabledFor(logging.INFO):
            _httpx_log.info(
                'HTTP Request: %s %s "%s %d %s"',
                request.method,
                url,
                response.http_version,
                response.status_code,
                response.reason_phrase,
            )
        return response


async def drain_body(pieces: AsyncIterator[bytes], gate: CancelGate) -> None:
    """Read what follows ``[DONE]`` up to the body's end, briefly, so the connection is reusable.

    Bounded by ``DRAIN_TIMEOUT_S`` (through ``gate``, the attempt task's ``CancelGate``: httpx
    closes the response at the body's end, inside the timeout) and ``DRAIN_LIMIT_BYTES`` of body;
    an error or the bound just ends it (the connection is then closed rather than reused).
    """
    received = 0
    with suppress(TimeoutError, httpx.HTTPError, AttemptError):
        async with gate.timeout(DRAIN_TIMEOUT_S):
            async for piece in pieces:
                received += len(piece)
                if received > DRAIN_LIMIT_BYTES:
                    break


async def body_excerpt(response: httpx.Response, gate: CancelGate, limit: int = 300, wait_s: float = 0.5) -> str:
    """Up to ``limit`` characters of an error response's body, waiting at most ``wait_s`` for it.

    A failing upstream may send its status line and then nothing: the failover must not wait
    for a body that never comes. The wait is timed through ``gate`` (the attempt task's
    ``CancelGate``): httpx closes the response at the body's end, inside the timeout.
    """
    received = b""
    try:
        # aiter_bytes is an async generator function (annotated as an iterator): close it on exit.
        chunks = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
        async with gate.timeout(wait_s), aclosing(chunks) as pieces:
            async for piece in pieces:
                received += piece
                if len(received) >= limit:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass
    return received[:limit].decode("utf-8", "replace")


def not_found_hint(upstream: Upstream) -> str | None:
    """The hint for an HTTP 404 from ``upstream``: None when its ``base_url`` path ends in ``/v1``,
    else a sentence saying that it does not (the usual cause of a 404 on every call)."""
    path = httpx.URL(upstream.base_url).path.rstrip("/")
    if path.endswith("/v1"):
        return None
    return (
        f"base_url {upstream.base_url!r} does not end in '/v1'; OpenAI-compatible servers usually "
        f"serve {path}/v1/chat/completions, and this client posts to {upstream.chat_url!r}"
    )
