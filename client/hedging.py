"""The hedging client: stream a chat completion, hedge on a late first token, keep the winner.

One call (docs/DESIGN.md "client"):

1. The primary attempt is sent to the first upstream (or the one named by ``primary=``).
2. If no first token has arrived ``hedge_after_s`` after the primary was *sent* (not after its
   headers), the call asks the budget (``HedgeBudget``) and, if granted, sends one backup to the
   next upstream that is not the primary (``hedge_reason = "ttft_timeout"``). A refused hedge
   is recorded as ``hedge_denied``.
3. If an attempt *fails* before its first token and no other attempt is still running, a backup
   is sent at once (failover, ``hedge_reason = "primary_error"``); failovers spend no budget but
   count against ``max_backups``.
4. The first attempt to produce a token wins; every other attempt is cancelled at that moment
   (its task cancelled, its response and connection closed). Only the winner's chunks reach the
   caller, including its non-token chunks from before the first token (a role-only chunk).
5. After the first token, a failure of the winner fails the call: tokens already went out.

Failure modes, one outcome each (issue 3; each row has a test of the same name in
``tests/client/test_failure_modes.py``, the stream-shape rows of issue 12 recorded cases and tests in
``tests/client/test_conformance.py``; the rules of what a token is are in ``hedgerow.client.chunks``):

============================================================  ========================================
what happens                                                  outcome
============================================================  ========================================
connection refused                                            failover at once (``ConnectError``)
connect timeout (``connect_timeout_s``)                       failover at once (``ConnectTimeout``)
no response headers by ``hedge_after_s``                      hedge (``ttft_timeout``), budget allowing
no response headers by ``total_timeout_s``                    ``TotalTimeout`` (status ``timeout``)
HTTP 408, 409, 429, 5xx                                       failover at once (``http_<status>``)
HTTP 400, 401, 403, 404, 422                                  ``UpstreamError``, no failover
HTTP 200 with a body that does not begin like SSE (HTML,      failover (``malformed_stream``)
  JSON), whatever its Content-Type
an SSE body labelled other than ``text/event-stream``         read as SSE, as the openai SDK does
  (``application/json``) or not labelled
SSE error payload (``data: {"error"}``, ``event: error``)
  before the first token                                      failover (``sse_error``)
  after the first token                                       ``StreamError``, status ``error``
stream ends before any token (empty body, or ``[DONE]``
  after a role-only chunk with no ``finish_reason``)          failover (``empty_stream``)
connection cut after tokens without a ``finish_reason``       ``StreamError``, status ``error``,
                                                              ``error_type`` ``truncated``
``finish_reason: ""`` on a chunk                              not a finish: as null (truncation and
                                                              stalls are still detected)
``n > 1``: one choice finished, the stream cut or stalled     not complete until all ``n`` choices
  before the others                                           finished: ``truncated``/``stalled``
``delta.content`` as a list of typed parts (Mistral)          ``text`` parts are answer tokens,
                                                              ``thinking`` parts reasoning tokens
usage inside ``choices[i].usage``                             token counts read from there
a whitespace-only first content (``" "``)                     a token (the model generated it)
``data: null`` (a frame that carries no object)               skipped, not an event: the stream
                                                              goes on (another non-object JSON
                                                              value is ``malformed_stream``)
``tool_calls`` holding only ``null`` or empty items           not a token (the hedge timer runs on)
gap after the first token longer than ``stall_timeout_s``     ``StallTimeout``, status ``stalled``
                                                              (winner's ``error_type``
                                                              ``stall_timeout``; ``max_itl_s``
                                                              includes the gap)
an SSE event or line over ``max_event_bytes``                 before the first token: failover;
                                                              after: ``StreamError``
                                                              (``event_too_large``)
the caller abandons the stream (break, exception, cancel)     status ``cancelled``, every attempt closed
every attempt failed (both, with ``max_backups=1``)           ``AllAttemptsFailed`` with each
                                                              attempt's error, status ``error``
============================================================  ========================================

Details: "failover" applies before the first token and only when no other attempt is still
running (a failure of one of two running attempts just ends that attempt). A 4xx of the table's
second group raises ``UpstreamError`` only when no other attempt is running (the backup of a hedge
answering 401 does not fail a call that the primary completes). Any other non-200 status fails
over like a 5xx. After the first token nothing fails over: tokens already reached the caller.
Every error raised by a call carries its ``CallRecord`` as ``.record``.

Request headers of every attempt:

* ``X-Request-ID``: a UUID per attempt, in canonical 8-4-4-4-12 form, derived deterministically
  from the call's id and the attempt's role (``attempt_request_id``: ``uuid5`` of
  ``"{request_id}-{role}"`` in ``ATTEMPT_ID_NAMESPACE``). Servers such as llama-cpp-python's reject
  a non-UUID ``X-Request-ID`` with HTTP 400, so the id itself is not sent there.
* ``Idempotency-Key: {request_id}``: the same for every attempt of a call.
* ``X-Hedgerow-Attempt: <role>``: ``primary``, ``backup``, or ``backup2`` for a third attempt.

Connections: a finished stream is read to the end of its HTTP body (at most ``DRAIN_TIMEOUT_S``
and ``DRAIN_LIMIT_BYTES`` after ``[DONE]``) so that its connection goes back to the pool and the
next call to that upstream skips the TCP and TLS handshakes. Every request goes through an
``OwnedTransport`` (``hedgerow.client._transport``): it closes response bodies so that a
cancellation cannot cut the close short (a task cancelled while httpx closes a response would
otherwise leave the connection counted as active in the pool for good, encode/httpcore#1115) and
delays the cancellation of a send that is between a new connection's connect and its request
until it is past that window (a cancellation there orphans the connection, encode/httpcore#1093).
An attempt's task sends its request itself (no task of the transport's per request) and is
cancelled only through its ``CancelGate``, which keeps the cancellation out of that window and
out of the task's own close of its response (``CancelGate.close``: the close runs in the task,
a cancellation asked for meanwhile is raised when it has ended); the task's own timeouts (the
drain, the error excerpt) are ``CancelGate.timeout``, so that their expiry neither cuts that close
short nor is a second cancellation. An
attempt's task is cancelled at most once (``_cancel_task``) and the call waits for its tasks
without ``gather`` (``wait_tasks_shielded``): a second cancellation reaching a loser that is
already unwinding from the first aborts httpcore's own close of its connection half-way (anyio's
shield does not stop a native ``Task.cancel``), which left the loser's socket open and the
upstream generating when the caller broke out right at the first token.

Stream size: an SSE event (or line) longer than ``HedgePolicy.max_event_bytes`` (default 8 MiB)
fails its attempt with ``error_type`` ``event_too_large`` before the SSE decoder buffers more of
it (before the first token: failover; after it: ``StreamError``).

Reading: each attempt parses the SSE events of every read of its body one after the other
(``hedgerow.client._sse``; an answer that came in one read is not parsed whole before its first
token goes to the caller) and each event's JSON with ``orjson``. Up to the first token every chunk
goes to the race on its own; after it, the chunks of one read go to the reader as one list, in one
queue hand-off, timed when handed over.

A 404 from an upstream whose ``base_url`` does not end in ``/v1`` raises an ``UpstreamError``
whose message says so (``not_found_hint``): such base URLs are accepted, since some servers
mount the API elsewhere.

Who runs what: entering the ``async with`` block sends the primary (in a task of its own, as
every attempt) and arms a timer at the race's deadline. Up to the first token each attempt's
task hands its events to the call's race as it reads them, and the timer ticks it (the hedge,
the total timeout before a token): failovers, the hedge and the loser's cancellation at the win
happen whether or not the caller is reading yet, with no task in between, so the winner's first
token is one task switch from the caller. The outcome waits for the reader: the winner's first
chunks, or the error (``UpstreamError``, ``AllAttemptsFailed``, ``TotalTimeout``) raised at the
first read. After the
first token the winner's chunks are buffered in memory until read, and the stall timeout and
the total timeout are checked while the caller reads. A caller that leaves the block without
reading gets no exception; the record says what happened.

Exactly one ``CallRecord`` is built per call, however it ends, and handed to the telemetry sink.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self, cast

import httpx
import orjson

from hedgerow.client._race import Action, AttemptState, Cancel, Race, Raise, Start, Won
from hedgerow.client._responses import ResponsesAssembler, attempt_failure, classify_event
from hedgerow.client._sse import SseDecoder
from hedgerow.client._transport import GATE_EXTENSION, CancelGate, OwnedTransport, close_shielded
from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.chunks import AnswerAssembler, classify_chunk
from hedgerow.client.errors import (
    AttemptError,
    EventTooLarge,
    HedgeError,
    UpstreamError,
)
from hedgerow.client.names import check_route_name
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import CallApi, CallRecord

__all__ = [
    "ATTEMPT_ID_NAMESPACE",
    "CallStream",
    "ChatResult",
    "HedgingClient",
    "RecordSink",
    "ResponsesResult",
    "ThresholdSource",
    "attempt_request_id",
    "close_shielded",
    "not_found_hint",
    "open_response",
    "send_streaming",
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
_encode_body = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode

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


def _random_uuid_hex() -> str:
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


class _EventSizeCap(httpx.AsyncByteStream):
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
#: comment. A body labelled otherwise is read as SSE only when it begins so (``_SniffSse``).
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


class _SniffSse(httpx.AsyncByteStream):
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


def _check_sse(response: httpx.Response) -> None:
    """Let a body labelled other than ``text/event-stream`` (or not labelled) through only when it
    begins like SSE (``_SniffSse`` wraps it); a body labelled SSE is read as it is."""
    content_type = response.headers.get("content-type", "")
    if "text/event-stream" in content_type.partition(";")[0]:
        return
    if isinstance(response.stream, httpx.AsyncByteStream):
        response.stream = _SniffSse(response.stream, content_type)


def _text(data: bytes, limit: int) -> str:
    """The first ``limit`` characters of UTF-8 ``data``, for an error message."""
    return data[: limit * 4].decode("utf-8", "replace")[:limit]


def _parse_chunk(data: bytes) -> dict[str, Any]:
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
            raise AttemptError("malformed_stream", f"chunk is not JSON: {_text(data, 120)!r}") from None
    if not isinstance(chunk, dict):
        raise AttemptError("malformed_stream", f"chunk is not a JSON object: {_text(data, 120)!r}")
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
    ``_AttemptSender.send``), yield its response, close it on exit.

    Over an ``OwnedTransport`` neither the send nor the close leaks a connection when the task
    is cancelled meanwhile. Raises what ``send`` raises.
    """
    response = await send(request)
    try:
        yield response
    finally:
        await response.aclose()  # runs to its end: OwnedTransport's body closes through the gate or close_shielded


#: httpx's logger: ``_AttemptSender.send`` logs each request there as ``httpx.AsyncClient.send`` does.
_httpx_log = logging.getLogger("httpx")


class _AttemptSender:
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

    def template(self, upstream: Upstream, extra: Mapping[str, str] | None) -> tuple[httpx.Headers, frozenset[str]]:
        """The headers of every request to ``upstream`` but the attempt's own ids, and the
        lower-cased names that the upstream's ``headers`` set (those win over the ids too).

        Later ones replace same-named earlier ones (case-insensitively): ``Host`` (the
        upstream's host and port, as httpx sets it), httpx's default headers, ``extra`` (the
        caller's), ``Accept: text/event-stream``, ``Content-Type: application/json``,
        ``Authorization: Bearer <api_key>`` (when the upstream has a key), the upstream's
        ``headers``. Made once per upstream when ``extra`` is None, else per call.
        """
        if extra is None:
            found = self._templates.get(upstream.name)
            if found is not None:
                return found
        headers = httpx.Headers({"Host": httpx.URL(upstream.base_url).netloc.decode("ascii")})
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


async def _drain(pieces: AsyncIterator[bytes], gate: CancelGate) -> None:
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


class ThresholdSource(Protocol):
    """Anything that can tell the threshold for a (route, model); ``ThresholdPoller`` is one."""

    def lookup(self, route: str, model: str) -> tuple[float, int | None, bool] | None:
        """Return ``(hedge_after_s, version, enabled)`` or None to use the policy's own value."""


class RecordSink(Protocol):
    """Anything that accepts finished call records; ``TelemetryExporter`` is one."""

    def submit(self, record: CallRecord) -> None:
        """Take one record without blocking."""


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The assembled answer of ``HedgingClient.chat``.

    Attributes:
        text: the answer text; reasoning_text: the reasoning text (may be empty);
        tool_calls: complete tool calls; finish_reason: the winner's finish reason;
        usage: the usage object of the final chunk, if any; record: the ``CallRecord``.
    """

    text: str
    reasoning_text: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    usage: dict[str, Any] | None
    record: CallRecord


@dataclass(frozen=True, slots=True)
class ResponsesResult:
    """The assembled answer of ``HedgingClient.responses``.

    Attributes:
        text: the output text; reasoning_text: reasoning and reasoning-summary text;
        arguments: function-call arguments by output item id; response: the final ``response``
        object (of ``response.completed``/``response.incomplete``), if any; record: the ``CallRecord``.
    """

    text: str
    reasoning_text: str
    arguments: dict[str, str]
    response: dict[str, Any] | None
    record: CallRecord


@dataclass(eq=False, slots=True)
class _Attempt:
    """The I/O side of one attempt: its upstream, task, held-back chunks and response headers.

    ``state`` is the race's view of it (``AttemptState``: times, outcome, tokens).
    """

    upstream: Upstream
    state: AttemptState
    task: asyncio.Task[None] | None = None
    gate: CancelGate | None = None  # cancels ``task``, never inside a connect-to-request window
    cancel_sent: bool = False  # the task was cancelled: never cancel it twice (``_cancel_task``)
    pending: list[dict[str, Any]] = field(default_factory=list)
    response_headers: httpx.Headers | None = None


class HedgingClient:
    """An async OpenAI-compatible chat client that hedges on a late first token.

    Args:
        upstreams: the endpoints in preference order; the first is the primary, backups go to
            the next upstream that is not the primary. At least one; names must be unique.
        route: the app's logical name for these calls (thresholds are per (route, model)); a
            valid route name (:mod:`hedgerow.client.names`: 1 to 200 characters, no control or
            format characters, no whitespace at either end, not ending in ``/history``).
        policy: the ``HedgePolicy``.
        thresholds: optional ``ThresholdSource`` (e.g. a ``ThresholdPoller``) giving a measured
            ``hedge_after_s`` per (route, model); without it the policy's value is used.
        telemetry: optional ``RecordSink`` (e.g. a ``TelemetryExporter``) receiving every record.
        client_tag: the ``client`` field of records (default: the host name).
        max_connections: connection pool size of the underlying ``httpx.AsyncClient``.
        transport: an optional httpx transport (for tests or custom networking).

    Use as ``async with HedgingClient(...) as client:``. Raises ValueError for bad arguments.
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        route: str = "default",
        policy: HedgePolicy | None = None,
        thresholds: ThresholdSource | None = None,
        telemetry: RecordSink | None = None,
        client_tag: str | None = None,
        max_connections: int = 1000,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        upstreams = list(upstreams)
        if not upstreams:
            raise ValueError("upstreams: at least one Upstream is required")
        if not all(isinstance(u, Upstream) for u in upstreams):
            raise ValueError("upstreams: every item must be an Upstream")
        names = [u.name for u in upstreams]
        if len(set(names)) != len(names):
            raise ValueError(f"upstreams: names must be unique, got {names}")
        check_route_name(route)  # the one name rule (hedgerow.client.names): ValueError naming route
        self.upstreams = upstreams
        self.route = route
        self.policy = policy or HedgePolicy()
        self.thresholds = thresholds
        self.telemetry = telemetry
        self.client_tag = client_tag or socket.gethostname()
        self.budget = HedgeBudget(self.policy.budget, self.policy.budget_burst)
        self.failover_budget = FailoverBudget(self.policy.failover_budget_tokens, self.policy.failover_token_ratio)
        self._max_connections = max_connections
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._sender: _AttemptSender | None = None
        # Parsed once per (upstream, API): httpx parses a URL given as a string on every request.
        self._urls: dict[tuple[str, CallApi], httpx.URL] = {}

    async def __aenter__(self) -> Self:
        timeout = httpx.Timeout(None, connect=self.policy.connect_timeout_s)
        limits = httpx.Limits(max_connections=self._max_connections, max_keepalive_connections=100)
        transport = self._transport
        if not isinstance(transport, OwnedTransport):
            transport = OwnedTransport(transport, limits=limits)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)
        self._sender = _AttemptSender(self._http, transport)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
            self._sender = None

    def stream_chat(
        self,
        body: dict[str, Any],
        *,
        primary: str | int | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        params: httpx.QueryParams | None = None,
    ) -> CallStream:
        """Start one hedged streaming call; use as ``async with client.stream_chat(body) as s``.

        Args:
            body: the chat-completions JSON (``model`` and ``messages`` at least). The client sets
                ``stream: true`` and ``stream_options.include_usage: true`` unless the caller set
                ``stream_options``.
            primary: name or index of the upstream to use as primary (default: the first).
            request_id: the call's id (default: a random UUID hex).
            headers: extra request headers for every attempt, sent under the client's own
                (``X-Request-ID``, ``Idempotency-Key``, ``X-Hedgerow-Attempt``, ``Accept``, ``Content-Type``,
                ``Authorization``, the upstream's headers), which replace same-named ones
                (``HedgingTransport`` uses it).
            params: query parameters for every attempt, or None.

        Returns:
            A ``CallStream``: ``async for chunk in stream`` gives the winner's chunks as dicts;
            ``stream.record`` is the ``CallRecord`` once the block has ended. Entering the block
            sends the primary and starts the race (hedge, failover, loser cancellation), which
            advances in the attempts' tasks and a timer even before the caller starts reading; a
            failure before the first token is raised by the first read.

        Raises:
            ValueError: before any request is sent, for a body that is not a dict or has no
                string ``model`` (the message names the field), or an unknown ``primary``. It is
                a programming error, not a ``HedgeError``, and carries no record.
            RuntimeError: when the client is not open (use ``async with``).
        """
        wire = dict(body) if isinstance(body, dict) else body
        if isinstance(wire, dict):
            wire["stream"] = True
            if "stream_options" not in wire:
                wire["stream_options"] = {"include_usage": True}
        return self._call(wire, "chat", primary=primary, request_id=request_id, headers=headers, params=params)

    def stream_responses(
        self,
        body: dict[str, Any],
        *,
        primary: str | int | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        params: httpx.QueryParams | None = None,
    ) -> CallStream:
        """Start one hedged streaming Responses API call (``POST {base_url}/responses``).

        The same race as ``stream_chat`` (same route, thresholds, budgets; the record's ``api`` is
        ``responses``); iterating gives the winner's stream events as dicts (``type`` ...). What
        counts as a token, a finish and a failure is in ``hedgerow.client._responses``. The client
        sets ``stream: true``. Arguments, return value and errors as for ``stream_chat``.
        """
        wire = dict(body) if isinstance(body, dict) else body
        if isinstance(wire, dict):
            wire["stream"] = True
        return self._call(wire, "responses", primary=primary, request_id=request_id, headers=headers, params=params)

    def _call(
        self,
        wire: dict[str, Any],
        api: CallApi,
        *,
        primary: str | int | None,
        request_id: str | None,
        headers: Mapping[str, str] | None,
        params: httpx.QueryParams | None,
    ) -> CallStream:
        if self._http is None:
            raise RuntimeError("HedgingClient is not open: use 'async with HedgingClient(...)'")
        _check_body(wire)
        order = self._order(primary)
        body = wire
        model = body["model"]
        hedge_after_s = self.policy.hedge_after_s
        version: int | None = None
        hedging_enabled = True
        if self.thresholds is not None:
            found = self.thresholds.lookup(self.route, model)
            if found is not None:
                hedge_after_s, version, hedging_enabled = found
        return CallStream(
            self,
            order,
            wire,
            model=model,
            request_id=request_id or _random_uuid_hex(),
            hedge_after_s=hedge_after_s,
            threshold_version=version,
            hedging_enabled=hedging_enabled,
            extra_headers=headers,
            params=params,
            api=api,
        )

    async def responses(
        self, body: dict[str, Any], *, primary: str | int | None = None, request_id: str | None = None
    ) -> ResponsesResult:
        """Run one hedged streaming Responses API call to completion; return the ``ResponsesResult``.

        Raises the same errors as ``chat``.
        """
        answer = ResponsesAssembler()
        async with self.stream_responses(body, primary=primary, request_id=request_id) as stream:
            async for event in stream:
                answer.add(event)
        assert stream.record is not None
        return ResponsesResult(
            text=answer.text,
            reasoning_text=answer.reasoning_text,
            arguments=dict(answer.arguments),
            response=answer.response,
            record=stream.record,
        )

    async def chat(
        self, body: dict[str, Any], *, primary: str | int | None = None, request_id: str | None = None
    ) -> ChatResult:
        """Run one hedged call to completion and return the assembled ``ChatResult``.

        Raises the same errors as iterating ``stream_chat``: ``UpstreamError``,
        ``AllAttemptsFailed``, ``StreamError``, ``StallTimeout``, ``TotalTimeout``.
        """
        answer = AnswerAssembler()
        async with self.stream_chat(body, primary=primary, request_id=request_id) as stream:
            async for chunk in stream:
                answer.add(chunk)
        assert stream.record is not None
        return ChatResult(
            text=answer.text,
            reasoning_text=answer.reasoning_text,
            tool_calls=answer.tool_calls,
            finish_reason=answer.finish_reason,
            usage=answer.usage,
            record=stream.record,
        )

    def _order(self, primary: str | int | None) -> list[Upstream]:
        if primary is None:
            return list(self.upstreams)
        if isinstance(primary, int):
            if not 0 <= primary < len(self.upstreams):
                raise ValueError(f"primary: index {primary} out of range")
            index = primary
        else:
            names = [u.name for u in self.upstreams]
            if primary not in names:
                raise ValueError(f"primary: unknown upstream {primary!r}")
            index = names.index(primary)
        return self.upstreams[index:] + self.upstreams[:index]


class CallStream:
    """One hedged call in progress (made by ``HedgingClient.stream_chat``).

    Iterate it (once) for the winner's chunks; after the ``async with`` block ``record`` holds
    the ``CallRecord``. Leaving the block early closes every attempt and records ``cancelled``.
    Up to the first token the call is run by its attempts' tasks and a timer (see the module
    docstring), independently of the reader. Every decision is the call's ``Race``
    (``hedgerow.client._race``); this class does the I/O and executes the race's actions.
    """

    def __init__(
        self,
        client: HedgingClient,
        order: list[Upstream],
        body: dict[str, Any],
        *,
        model: str,
        request_id: str,
        hedge_after_s: float,
        threshold_version: int | None,
        hedging_enabled: bool,
        extra_headers: Mapping[str, str] | None = None,
        params: httpx.QueryParams | None = None,
        api: CallApi = "chat",
    ) -> None:
        self._client = client
        self.api: CallApi = api
        self._classify = classify_chunk if api == "chat" else classify_event
        self._extra_headers = extra_headers
        self._params = params
        self._http = client._http
        self._sender = client._sender
        self._policy = client.policy
        self._order = order
        self._body = body
        self.model = model
        self.request_id = request_id
        self.hedge_after_s = hedge_after_s
        self.threshold_version = threshold_version
        self.record: CallRecord | None = None
        self._race = Race(
            [u.name for u in order],
            hedge_after_s=hedge_after_s,
            hedging_enabled=hedging_enabled,
            max_backups=self._policy.max_backups,
            total_timeout_s=self._policy.total_timeout_s,
            stall_timeout_s=self._policy.stall_timeout_s,
            budget=client.budget,
            failover_budget=client.failover_budget,
            request_id=request_id,
            route=client.route,
            model=model,
            started_at=datetime.now(UTC),
            client=client.client_tag,
            threshold_version=threshold_version,
            choices=_choice_count(body) if api == "chat" else 1,
            api=api,
        )
        self._attempts: list[_Attempt] = []
        # Phase 2 attempt events: ("chunks", attempt, [chunk, ...], at), ("end", attempt, None, at),
        # ("error", attempt, exception, at).
        self._events: asyncio.Queue[tuple[str, _Attempt, Any, float]] = asyncio.Queue()
        self._winner: _Attempt | None = None
        self._iterated = False
        self._generator: Any = None
        # Phase 1 (up to the first token): attempt events go to the race at once, in the attempt's
        # own task; the outcome (the winner's first chunks, or the error) resolves ``_head``.
        self._encoded: bytes | None = None
        self._racing = True
        self._head: asyncio.Future[list[dict[str, Any]]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._t0 = 0.0

    # -- context manager ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._t0 = time.monotonic()
        self._race.started_at = datetime.now(UTC)
        self._head = asyncio.get_running_loop().create_future()
        # The primary's task has the timer armed once its request is under way (the hedge timer
        # counts from its send), a loop turn or two from now: no timer to arm and re-arm here.
        self._execute(self._race.begin(0.0))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        # The caller may have left before the stream ended (break, an exception of its own, cancel).
        self._execute(self._race.abandon(self._now(), "caller_cancelled" if exc_type is None else exc_type.__name__))
        if self._generator is not None:
            await self._generator.aclose()
        await self._finish()
        if isinstance(exc, HedgeError) and exc.record is None:
            exc.record = self.record

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        if self._iterated:
            raise RuntimeError("a CallStream can be iterated only once")
        self._iterated = True
        generator = self._run()
        self._generator = generator
        return generator

    # -- attempts ----------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _execute(self, actions: tuple[Action, ...]) -> None:
        """Carry out the race's actions; ``Raise`` raises (after the actions before it)."""
        for action in actions:
            if isinstance(action, Start):
                state = action.attempt
                attempt = _Attempt(self._order[state.index], state)
                self._attempts.append(attempt)
                attempt.task = asyncio.create_task(self._run_attempt(attempt), name=f"hedgerow-{state.header_role}")
                attempt.gate = CancelGate(attempt.task)
            elif isinstance(action, Cancel):
                self._cancel_task(self._attempts[action.attempt.index])
            elif isinstance(action, Won):
                self._winner = self._attempts[action.attempt.index]
            elif isinstance(action, Raise):
                raise action.error

    def _url(self, upstream: Upstream) -> httpx.URL:
        urls = self._client._urls
        url = urls.get((upstream.name, self.api))
        if url is None:
            url = httpx.URL(upstream.chat_url if self.api == "chat" else upstream.responses_url)
            urls[(upstream.name, self.api)] = url
        return url

    def _content(self, upstream: Upstream) -> bytes:
        """The request body as JSON bytes, encoded once per call (as httpx's ``json=`` encodes it;
        a value JSON cannot hold, such as NaN, raises ``ValueError`` in the attempt as before),
        with ``upstream``'s own model name applied (``Upstream.attempt_body``)."""
        if self._encoded is None:
            self._encoded = _encode_body(self._body).encode()
        if upstream.model is None:
            return self._encoded
        return upstream.attempt_body(self._encoded)

    def _request(self, attempt: _Attempt, gate: CancelGate) -> httpx.Request:
        """The attempt's request: ``_AttemptSender.template``'s headers for its upstream (made
        once per client, or once per call with the caller's ``headers``) plus the attempt's own
        ``X-Request-ID``, ``Idempotency-Key`` and ``X-Hedgerow-Attempt`` (unless the upstream's
        ``headers`` set them), the body encoded once per call."""
        assert self._sender is not None
        role = attempt.state.header_role
        headers, upstream_set = self._sender.template(attempt.upstream, self._extra_headers)
        headers = httpx.Headers(headers)  # a copy of the list, without re-normalizing
        for name, value in (
            ("X-Request-ID", attempt_request_id(self.request_id, role)),
            ("Idempotency-Key", self.request_id),
            (ATTEMPT_HEADER, role),
        ):
            if name.lower() not in upstream_set:
                headers[name] = value
        return self._sender.request(
            self._url(attempt.upstream), headers, self._content(attempt.upstream), self._params, {GATE_EXTENSION: gate}
        )

    # -- read-only state for HedgingTransport ---------------------------------------------------

    @property
    def hedged(self) -> bool:
        """True once a backup attempt (hedge or failover) has been started."""
        return self._race.hedged

    @property
    def winner_upstream(self) -> str | None:
        """The winning attempt's upstream name, or None before the first token (or without one)."""
        return None if self._winner is None else self._winner.upstream.name

    @property
    def winner_response_headers(self) -> httpx.Headers | None:
        """The winning attempt's HTTP response headers, or None."""
        return None if self._winner is None else self._winner.response_headers

    async def _run_attempt(self, attempt: _Attempt) -> None:
        """Send one attempt and forward its events to the call's queue until it ends."""
        put = self._events.put_nowait
        assert self._http is not None
        gate = attempt.gate
        assert gate is not None, "_execute gives the task its gate before the task runs"
        # The send: stamped when the attempt actually starts, which is later than its creation
        # when the event loop is busy; TTFT and the hedge deadline are measured from here.
        self._race.sent(attempt.state, self._now())
        # The timer is armed one loop turn later, while the request is in flight, rather than
        # before it is sent: it fires at the same time (its delay counts from the deadline, fixed by
        # the send above), and arming it is idempotent (an event meanwhile arms it first, a win
        # or the call's end turns it off).
        asyncio.get_running_loop().call_soon(self._arm_timer)
        done_at: float | None = None
        responses = self.api == "responses"
        delta_seen = False
        try:
            assert self._sender is not None
            async with open_response(self._sender.send, self._request(attempt, gate)) as response:
                self._race.response(attempt.state, response.status_code)
                attempt.response_headers = response.headers
                if response.status_code != 200:
                    # The status decides; the body is only an excerpt for the error, read briefly.
                    excerpt = await _body_excerpt(response, gate)
                    if response.status_code in NON_RETRYABLE_STATUSES:
                        hint = not_found_hint(attempt.upstream) if response.status_code == 404 else None
                        raise UpstreamError(attempt.upstream.name, response.status_code, excerpt, hint=hint)
                    failure = AttemptError(f"http_{response.status_code}", f"HTTP {response.status_code}: {excerpt}")
                    # The error response itself, for HedgingTransport to hand back when all fail.
                    failure.status_code, failure.headers, failure.body_excerpt = (  # type: ignore[attr-defined]
                        response.status_code,
                        response.headers,
                        excerpt,
                    )
                    raise failure
                if isinstance(response.stream, httpx.AsyncByteStream):
                    response.stream = _EventSizeCap(response.stream, self._policy.max_event_bytes)
                _check_sse(response)
                events = SseDecoder().events  # lazy: a won first token goes out before the rest of its read is parsed
                # After the first token, the chunks of one read go to the reader as one list, timed
                # when handed over (before it, each chunk is timed and raced on its own).
                batch: list[dict[str, Any]] = []
                # aiter_bytes is an async generator function (annotated as an iterator): aclosing
                # closes it here when the loop is left early ([DONE], an error), not in a finalizer.
                pieces = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
                async with aclosing(pieces):
                    try:
                        async for piece in pieces:
                            for name, data in events(piece):
                                if name == "error":
                                    raise AttemptError("sse_error", f"SSE error event: {_text(data, 200)}")
                                if not data.startswith(b"{"):  # only non-JSON needs a strip: [DONE], blank
                                    stripped = data.strip()
                                    if stripped == b"[DONE]":
                                        done_at = self._now()
                                        break
                                    if not stripped or stripped == b"null":  # a frame without an object
                                        continue
                                chunk = _parse_chunk(data)
                                if responses:
                                    stopped = attempt_failure(chunk, delta_seen)
                                    if stopped is not None:
                                        raise stopped
                                    delta_seen = delta_seen or str(chunk.get("type", "")).endswith(".delta")
                                elif chunk.get("error") is not None:
                                    raise AttemptError(
                                        "sse_error", f"SSE error payload: {json.dumps(chunk['error'])[:200]}"
                                    )
                                if not self._racing:
                                    batch.append(chunk)
                                elif self._race_event("chunk", attempt, chunk, self._now()):
                                    # This chunk won: let the reader take it before reading on (the
                                    # rest of a burst would otherwise be parsed first, delaying TTFT).
                                    await asyncio.sleep(0)
                            if batch:
                                put(("chunks", attempt, batch, self._now()))
                                batch = []
                            if done_at is not None:
                                break
                    except BaseException:
                        if batch:  # the chunks before the failure go first
                            put(("chunks", attempt, batch, self._now()))
                        raise
                    if done_at is not None:
                        await _drain(pieces, gate)
            end: tuple[str, _Attempt, Any, float] = ("end", attempt, None, self._now() if done_at is None else done_at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            end = ("error", attempt, exc, self._now())
        if self._racing:
            self._race_event(*end)
        else:
            put(end)

    @staticmethod
    def _cancel_task(attempt: _Attempt) -> None:
        """Cancel the attempt's task, at most once per attempt.

        A second ``cancel()`` reaching a task that is already unwinding from the first one lands
        inside httpcore's close of the response (its ``except BaseException`` path, "shielded"
        with anyio, which a native ``Task.cancel`` goes through) and aborts it half-way: the
        connection stays marked active in the pool and its socket open, the upstream keeps
        generating. That happened when the caller left right after the first token (the win
        cancelled the loser, ``_finish`` cancelled it again before it had run).
        """
        task, gate = attempt.task, attempt.gate
        if task is not None and gate is not None and not task.done() and not attempt.cancel_sent:
            attempt.cancel_sent = True
            gate.cancel()  # the send runs in this task: the gate keeps the cancel out of the connect window

    # -- the call ----------------------------------------------------------------------------

    async def _next_event(self, deadline: float) -> tuple[str, _Attempt, Any, float] | None:
        """The next attempt event, or None when ``deadline`` (call time, s) passes first."""
        if not self._events.empty():
            return self._events.get_nowait()
        remaining = deadline - self._now()
        if remaining <= 0:
            return None
        if math.isinf(remaining):
            return await self._events.get()
        try:
            async with asyncio.timeout(remaining):
                return await self._events.get()
        except TimeoutError:
            # An event may have been queued while the timeout was being delivered: it happened
            # before the deadline was acted on, so it goes first (no hedge for a token in hand).
            if not self._events.empty():
                return self._events.get_nowait()
            return None

    def _on_event(self, kind: str, attempt: _Attempt, payload: Any, at: float) -> tuple[Action, ...]:
        """Hand an attempt's ``end`` or ``error`` event to the race; return its actions."""
        if kind == "end":
            return self._race.ended(attempt.state, at)
        caller_fault = isinstance(payload, UpstreamError)  # the caller's fault: bad request, bad key
        return self._race.failed(
            attempt.state, payload, at, caller_fault=caller_fault, cut=isinstance(payload, httpx.TransportError)
        )

    def _race_event(self, kind: str, attempt: _Attempt, payload: Any, at: float) -> bool:
        """Phase 1: hand one attempt event to the race at once, in the attempt's own task.

        Up to the first token no task stands between an attempt and the race: the attempt that
        reads the first token decides the race itself (cancelling the loser) and resolves
        ``_head`` for the reader, one task switch away from the caller. A chunk without a token
        is held back (``pending``) until its attempt wins. A failure of the call (a ``Raise``
        action) resolves ``_head`` with that error, raised by the reader's first read.

        Args:
            kind: ``chunk``, ``end`` or ``error``; payload: the chunk dict, None, or the error.
            at: call time of the event, s.

        Returns:
            True when this event made ``attempt`` the winner.
        """
        race = self._race
        try:
            if kind == "chunk":
                actions = race.chunk(attempt.state, self._classify(payload), at)
                if attempt.state.outcome is None:  # no token yet: held back until it wins
                    attempt.pending.append(payload)
                    return False
                if not actions:  # a chunk of a loser, sent before its cancellation took effect
                    return False
                self._execute(actions)
                head = [*attempt.pending, payload]
            else:
                self._execute(self._on_event(kind, attempt, payload, at))
                if self._winner is not attempt:  # an attempt ended or failed: maybe a failover
                    self._arm_timer()
                    return False
                head = list(attempt.pending)  # a complete answer without a token
            attempt.pending.clear()
        except Exception as exc:  # a Raise action: the call failed before its first token
            self._settle(exc)
            return False
        self._settle(head)
        return True

    def _settle(self, outcome: list[dict[str, Any]] | BaseException) -> None:
        """End phase 1: stop the timer and resolve ``_head`` with the first chunks or the error."""
        self._stop_racing()
        head = self._head
        if head is not None and not head.done():
            if isinstance(outcome, BaseException):
                head.set_exception(outcome)
            else:
                head.set_result(outcome)

    def _stop_racing(self) -> None:
        """Leave phase 1: attempt events go to the reader's queue, and the timer is off."""
        self._racing = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_timer(self) -> None:
        """Phase 1: have ``_on_timer`` called at the race's deadline (hedge timer, total timeout)."""
        if not self._racing:
            return
        deadline = self._race.deadline
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if not math.isinf(deadline):
            delay_s = max(0.0, deadline - self._now())
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    def _on_timer(self) -> None:
        """The race's deadline passed in phase 1: tick it (a hedge, or ``TotalTimeout``)."""
        self._timer = None
        self._timer_at = None
        if not self._racing:
            return
        try:
            self._execute(self._race.tick(self._now()))
        except Exception as exc:  # TotalTimeout before a first token
            self._settle(exc)
            return
        primary = self._attempts[0]
        if not primary.state.sent and self._race.deadline <= self._now():
            return  # the hedge timer counts from the primary's send: its task re-arms the timer
        self._arm_timer()

    async def _run(self) -> AsyncIterator[dict[str, Any]]:
        race = self._race
        assert self._head is not None
        try:
            # Phase 1 runs in the attempts' tasks and the timer (``_race_event``, ``_on_timer``);
            # a cancellation of the reader here ends the call, as leaving it would.
            head = await self._head
            for early in head:
                yield early
            if race.over:  # an answer without a token: complete already
                return

            # Phase 2: stream the winner. The race's deadline is the stall or total timeout; an
            # event that arrived after it (a slow reader) times out first.
            winner = self._winner
            assert winner is not None, "phase 1 returns with a winner unless the call already ended"
            chunk = race.chunk
            winner_chunk = race.winner_chunk
            winner_state = winner.state
            classify = self._classify
            events = self._events
            while True:
                deadline = race.deadline
                if events.empty():
                    event = await self._next_event(deadline)
                    if event is None:
                        self._execute(race.tick(self._now()))
                        continue
                else:  # the common case while a burst of chunks is read: no coroutine, no timer
                    event = events.get_nowait()
                kind, attempt, payload, at = event
                if at >= deadline:
                    self._execute(race.tick(at))
                if kind == "chunks":  # the chunks of one read
                    if attempt is winner:
                        for item in payload:
                            winner_chunk(winner_state, classify(item), at)
                            yield item
                    else:  # a loser's, read before its cancellation took effect: counted as wasted
                        state = attempt.state
                        for item in payload:
                            chunk(state, classify(item), at)
                    continue
                self._execute(self._on_event(kind, attempt, payload, at))
                if race.over and attempt is winner:
                    return
        finally:
            self._execute(race.abandon(self._now()))

    async def _finish(self) -> None:
        """Close every attempt, build the one record, hand it to telemetry."""
        self._execute(self._race.abandon(self._now()))
        self._stop_racing()
        head = self._head
        if head is not None:
            if not head.done():
                head.cancel()
            elif not head.cancelled():
                head.exception()  # retrieved, so that asyncio does not log an error nobody read
        tasks: list[asyncio.Task[Any]] = []
        for attempt in self._attempts:
            if attempt.task is not None:
                self._cancel_task(attempt)
                tasks.append(attempt.task)
        try:
            # Never gather: a cancellation of the caller would cancel the attempts a second time.
            await wait_tasks_shielded(tasks)
        finally:
            self._build_record()

    def _build_record(self) -> None:
        if self.record is not None:
            return
        self.record = self._race.record()
        if self._client.telemetry is not None:
            try:
                self._client.telemetry.submit(self.record)
            except Exception:  # telemetry must never break a call
                log.exception("telemetry sink refused a record")


async def _body_excerpt(response: httpx.Response, gate: CancelGate, limit: int = 300, wait_s: float = 0.5) -> str:
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


def _check_body(body: object) -> None:
    """Raise ``ValueError`` naming the field when ``body`` cannot be a chat-completions request."""
    if not isinstance(body, dict):
        raise ValueError(f"body: must be a dict (the chat-completions JSON object), got {type(body).__name__}")
    if "model" not in body:
        raise ValueError("body['model']: missing; a string model name is required")
    if not isinstance(body["model"], str):
        raise ValueError(f"body['model']: must be a string, got {type(body['model']).__name__}")


def _choice_count(body: Mapping[str, Any]) -> int:
    """The number of choices a chat request asks for: its ``n`` when a positive int, else 1."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


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
