"""The gateway's ASGI app: OpenAI-compatible HTTP in front of ``HedgingTransport``.

Each request is checked here (auth, size, concurrency, the model's route) and then handed, as an
``httpx.Request``, to the route's ``hedgerow.client.HedgingTransport``, which runs the same race
as the library (see its module docstring: hedged chat and Responses calls, pass-through of other
paths, the caller's credentials dropped, each upstream's key applied, the ``X-Hedgerow-*``
headers). The ``httpx.Response`` it returns is streamed back as it comes. This module holds no
hedging rule of its own; what it adds:

* **Auth.** With gateway keys configured, every request needs ``Authorization: Bearer <key>``
  (or ``api-key: <key>``); else 401 ``invalid_api_key``. The caller's key never reaches an
  upstream (the transport drops it, and so does this app).
* **Routing.** ``POST /v1/chat/completions`` and ``/v1/responses`` (and any other ``POST`` with
  a JSON ``model``, passed through to the route's primary) go to the transport of the body's
  public model; an unknown model is 404 ``model_not_found``. ``GET /v1/models`` lists the public
  model names (``GET /v1/models/{name}`` one of them). With ``any_model`` (no model table),
  everything goes to that one route's transport as it is. Other paths are 404.
* **Timing.** Status and headers are sent when the transport returns, which for a streamed call is
  when the winner's first token is known; the body's pieces are passed on as they arrive.
* **Disconnects.** A caller that leaves (``http.disconnect``, watched by a task of its own) cancels
  the request's task, before or after the first token; the transport's response is closed, which
  ends every attempt (the record says ``cancelled``).
* **Errors** (OpenAI-shaped JSON, never a traceback): a call whose attempts all failed with HTTP
  errors -> 502 ``upstream_error``; ``httpx.TimeoutException`` -> 504 ``upstream_timeout``;
  ``httpx.ConnectError`` (no upstream answered) -> 503 ``upstream_unreachable``; other transport
  errors -> 502. A non-retryable upstream 4xx (400/401/403/404/422) and hedgerow's own 400 for a
  bad body pass through unchanged. An error after the first token ends the stream with an SSE
  ``data: {"error": ...}`` event (as OpenAI does) and no ``[DONE]``.
* **Limits.** A body over ``max_body_bytes`` is 413; more than ``max_concurrent`` requests in
  flight is 429 with ``Retry-After: 1``.
* **Secrets.** Every configured key (upstream or gateway) is replaced by ``[redacted]`` in error
  bodies handed back and in log lines.
* **Metrics.** ``GET /metrics`` serves the ``hedgerow_gateway_*`` family
  (:mod:`hedgerow.gateway._metrics`); with gateway keys configured it needs a key too.
* **Bytes.** A streamed answer is the winner's bytes, passed on one piece per read of its body;
  the transport (``rewrite_model``) re-encodes only the chunks whose model name it sets back to
  the public model's, when the winner is an upstream with its own ``model``. Per-request log
  lines are built only when their level is enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from hedgerow.client import CallRecord, HedgingTransport
from hedgerow.client.hedging import NON_RETRYABLE_STATUSES, RecordSink, ThresholdSource
from hedgerow.client.transport import HEDGED_HEADER, REQUEST_ID_HEADER, WINNER_HEADER
from hedgerow.gateway._config import GatewayConfig, RouteSpec
from hedgerow.gateway._metrics import CONTENT_TYPE, GatewayMetrics

__all__ = ["GatewayApp", "RecordLog"]

_log = logging.getLogger("hedgerow.gateway")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Request headers not handed to the transport: framing, hop-by-hop, the caller's credentials
#: (lower-case bytes, as ASGI servers give header names).
_DROP_REQUEST = frozenset(
    {
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"expect",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authorization",
        b"authorization",
        b"api-key",
    }
)
#: The last event of a streamed chat answer, as the transport ends it.
_DONE = b"data: [DONE]\n\n"
#: Most request URLs kept for reuse (one per path; parsing a URL costs more than the lookup).
_MAX_CACHED_URLS = 64
#: Response headers not sent on: hop-by-hop ones, and those the ASGI server sets itself.
_DROP_RESPONSE = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"date", b"server"}
)
_REDACTED = "[redacted]"
#: Largest error body read to redact and re-send, bytes (a larger one is cut there).
_MAX_ERROR_BODY = 64 * 1024


class RecordLog:
    """The gateway's record sink: counts each ``CallRecord`` by status, logs one line for it and
    hands it to ``inner`` (a ``TelemetryExporter``, or anything with ``submit``) when given.

    Args:
        inner: the next sink, or None (records are then only counted and logged).

    Attributes:
        counts: records per status (``ok``, ``failed``, ``cancelled``, ...).
        last: the most recent record, or None.
    """

    def __init__(self, inner: RecordSink | None = None) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()
        self.last: CallRecord | None = None

    def submit(self, record: CallRecord) -> None:
        """Count, log and forward one record (never raises for the record's sake)."""
        self.counts[record.status] += 1
        self.last = record
        if self.inner is not None:
            self.inner.submit(record)
        if not _log.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": record.request_id,
            "route": record.route,
            "model": record.model,
            "status": record.status,
            "winner": record.winner,
            "hedged": record.hedged,
            "ttft_s": None if record.ttft_s is None else round(record.ttft_s, 4),
        }
        _log.info(
            " ".join(["gateway_call", *(f"{k}={v}" for k, v in fields.items())]),
            extra={"event": "gateway_call", "fields": fields},
        )


def openai_error(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    """The body of an OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}``."""
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class GatewayApp:
    """The ASGI app of ``hedgerow gateway`` (see the module docstring for what it does).

    Args:
        config: the resolved ``GatewayConfig`` (routes, keys, limits).
        thresholds: optional ``ThresholdSource`` shared by every route (a ``ThresholdPoller``).
        telemetry: optional ``RecordSink`` for the calls' records (wrapped in a ``RecordLog``,
            which also counts and logs them).
        background: async context managers entered at the ASGI lifespan's start and left at its
            end, in reverse order (the poller, the exporter).
        client_tag: the records' ``client`` field (default: the host name).

    Attributes:
        records: the ``RecordLog`` every record goes through.
        in_flight: requests being proxied now (the ``max_concurrent`` limit counts these).
        metrics: the ``GatewayMetrics`` served at ``GET /metrics``.

    Raises:
        ValueError: from ``HedgingTransport`` for a route it refuses.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        thresholds: ThresholdSource | None = None,
        telemetry: RecordSink | None = None,
        background: Sequence[AbstractAsyncContextManager[Any]] = (),
        client_tag: str | None = None,
    ) -> None:
        self.config = config
        self.records = RecordLog(telemetry)
        self._background = list(background)
        self._stack: contextlib.AsyncExitStack | None = None
        self._transports: dict[int, HedgingTransport] = {}
        self._secrets = config.secrets
        for spec in config.specs:
            self._transports[id(spec)] = HedgingTransport(
                spec.upstreams,
                route=spec.route,
                policy=spec.policy,
                thresholds=thresholds,
                telemetry=self.records,
                client_tag=client_tag,
                rewrite_model=True,
            )
        self.in_flight = 0
        self.metrics = GatewayMetrics()
        self._urls: dict[str, httpx.URL] = {}

    def transport(self, spec: RouteSpec) -> HedgingTransport:
        """The ``HedgingTransport`` of a route spec of this app's configuration."""
        return self._transports[id(spec)]

    def redact(self, text: str) -> str:
        """``text`` with every configured key replaced by ``[redacted]``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return text

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point (``http`` and ``lifespan`` scopes)."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope.get("path") == "/metrics":  # a scrape is not one of the requests it counts
            await self._metrics(scope, send)
            return
        exchange = _Exchange(time.monotonic())

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = int(message["status"])
                exchange.started_at = time.monotonic()
            elif not message.get("more_body", False):
                exchange.complete = True  # before the send: a disconnect from now on is the end
            await send(message)

        metrics = self.metrics
        metrics.in_flight.inc()
        try:
            await self._http(scope, receive, sending, exchange)
        finally:
            metrics.in_flight.dec()
            ended = time.monotonic()
            started_at = exchange.started_at
            metrics.observe(
                exchange.route,
                exchange.model,
                exchange.outcome(),
                exchange.status,
                None if started_at is None else started_at - exchange.arrived_at,
                ended - exchange.arrived_at,
            )
            if _log.isEnabledFor(logging.INFO):
                fields = {
                    "method": scope.get("method"),
                    "path": self.redact(str(scope.get("path"))),
                    "status": exchange.status or None,
                    "duration_s": round(ended - exchange.arrived_at, 4),
                }
                _log.info(
                    " ".join(["gateway_request", *(f"{k}={v}" for k, v in fields.items())]),
                    extra={"event": "gateway_request", "fields": fields},
                )

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": self.redact(str(exc))})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        """Enter the background context managers (done by the ASGI lifespan's startup)."""
        stack = contextlib.AsyncExitStack()
        try:
            for manager in self._background:
                await stack.enter_async_context(manager)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    async def aclose(self) -> None:
        """Close every transport, then leave the background context managers (flushes records)."""
        for transport in self._transports.values():
            await transport.aclose()
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()

    # -- one request ----------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send, exchange: _Exchange) -> None:
        raw_headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if self.config.keys and not self._authorized(raw_headers):
            exchange.refused = True
            await _answer(
                send,
                401,
                openai_error(
                    "hedgerow gateway: missing or unknown API key (send Authorization: Bearer <key>)",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
            return
        if self.in_flight >= self.config.max_concurrent:
            exchange.refused = True
            await _answer(
                send,
                429,
                openai_error(
                    f"hedgerow gateway: {self.config.max_concurrent} requests are in flight already; retry shortly",
                    "rate_limit_error",
                    "gateway_busy",
                ),
                extra=[(b"retry-after", b"1")],
            )
            return
        self.in_flight += 1
        try:
            await self._serve(scope, receive, send, raw_headers, exchange)
        finally:
            self.in_flight -= 1

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """``GET /metrics``: the ``hedgerow_gateway_*`` family (a gateway key needed when keys are set)."""
        if self.config.keys and not self._authorized(scope.get("headers", [])):
            await _answer(
                send,
                401,
                openai_error(
                    "hedgerow gateway: /metrics needs a gateway key (send Authorization: Bearer <key>)",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _answer(
                send, 405, openai_error("hedgerow gateway: /metrics answers GET", "invalid_request_error", None)
            )
            return
        await _answer(send, 200, self.metrics.render(), headers=[(b"content-type", CONTENT_TYPE.encode())])

    def _authorized(self, raw_headers: list[tuple[bytes, bytes]]) -> bool:
        given = api_key = ""
        for name, value in raw_headers:
            if name == b"authorization":
                given = value.decode("latin-1")
            elif name == b"api-key":
                api_key = value.decode("latin-1")
        scheme, _, token = given.partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else api_key
        if not key:
            return False
        matched = False
        for known in self.config.keys:  # compare with every key, in constant time each
            matched |= hmac.compare_digest(key.encode(), known.encode())
        return matched

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, raw_headers: list[tuple[bytes, bytes]], exchange: _Exchange
    ) -> None:
        method = str(scope.get("method", "GET")).upper()
        path = str(scope.get("path", "/"))
        config = self.config
        if not (path == "/v1" or path.startswith("/v1/")):
            exchange.refused = True
            await _answer(send, 404, _not_found(path))
            return
        any_model = config.any_model
        if any_model is None and method == "GET" and path.rstrip("/") == "/v1/models":
            await _answer(send, 200, self._model_list())
            return
        if any_model is None and method == "GET" and path.startswith("/v1/models/"):
            name = path.removeprefix("/v1/models/")
            if name in config.routes:
                await _answer(send, 200, json.dumps(_model_object(name)).encode())
            else:
                exchange.refused = True
                await _answer(send, 404, _model_not_found(name))
            return
        body = await _read_body(receive, raw_headers, config.max_body_bytes)
        if body is None:
            exchange.refused = True
            await _answer(
                send,
                413,
                openai_error(
                    f"hedgerow gateway: request body over {config.max_body_bytes} bytes",
                    "invalid_request_error",
                    "request_too_large",
                ),
            )
            return
        spec = any_model
        if spec is None:
            if method != "POST":
                exchange.refused = True
                await _answer(send, 404, _not_found(path))
                return
            model = _body_model(body)
            if model is None:
                # Not a JSON object with a string model: the transport answers its own 400 for
                # chat and Responses bodies; other paths need a model to be routed at all.
                if path.rstrip("/") not in ("/v1/chat/completions", "/v1/responses"):
                    exchange.refused = True
                    await _answer(send, 404, _not_found(path))
                    return
                spec = next(iter(config.routes.values()))
            elif model not in config.routes:
                exchange.refused = True
                await _answer(send, 404, _model_not_found(model))
                return
            else:
                spec = config.routes[model]
        exchange.route = spec.route
        exchange.model = spec.public_model or "*"
        query: bytes = scope.get("query_string", b"")
        target = self._urls.get(path) if not query else None
        if target is None:
            target = httpx.URL(scheme="http", host="hedgerow-gateway", path=path, query=query or None)
            if not query and len(self._urls) < _MAX_CACHED_URLS:
                self._urls[path] = target
        forwarded = [(k, v) for k, v in raw_headers if k not in _DROP_REQUEST]
        request = httpx.Request(method, target, headers=forwarded, content=body)
        await self._proxy(spec, request, receive, send, exchange)

    def _model_list(self) -> bytes:
        data = [_model_object(name) for name in self.config.routes]
        return json.dumps({"object": "list", "data": data}).encode()

    async def _proxy(
        self, spec: RouteSpec, request: httpx.Request, receive: Receive, send: Send, exchange: _Exchange
    ) -> None:
        """Run the request through the transport in this task, cancelled when the caller
        disconnects (an ``http.disconnect`` from ``receive``, whose body is read already, before
        the answer's end was sent); the transport then closes every attempt."""
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
            await self._forward(spec, request, send, exchange)
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

    async def _forward(self, spec: RouteSpec, request: httpx.Request, send: Send, exchange: _Exchange) -> None:
        transport = self.transport(spec)
        try:
            response = await transport.handle_async_request(request)
        except httpx.TimeoutException as exc:
            await self._failed(send, 504, "upstream_timeout", exc, exchange)
            return
        except httpx.ConnectError as exc:
            await self._failed(send, 503, "upstream_unreachable", exc, exchange)
            return
        except httpx.TransportError as exc:
            await self._failed(send, 502, "upstream_error", exc, exchange)
            return
        try:
            await self._relay(response, send, exchange)
        finally:
            await response.aclose()

    async def _failed(self, send: Send, status: int, code: str, exc: BaseException, exchange: _Exchange) -> None:
        exchange.failed = True
        what = {504: "timed out", 503: "no upstream could be reached", 502: "failed"}[status]
        detail = self.redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        _log.warning(
            "gateway_failed status=%d code=%s detail=%s",
            status,
            code,
            detail,
            extra={"event": "gateway_failed", "fields": {"status": status, "code": code, "detail": detail}},
        )
        message = f"hedgerow gateway: the call {what}: {detail}"
        await _answer(send, status, openai_error(message, "api_error", code))

    async def _relay(self, response: httpx.Response, send: Send, exchange: _Exchange) -> None:
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
            excerpt = _error_message(await _read_capped(response))
            message = f"hedgerow gateway: every attempt failed; the last upstream answered HTTP {status}"
            if excerpt:
                message += f": {self.redact(excerpt)[:300]}"
            _log.warning(
                "gateway_failed status=502 code=upstream_error upstream_status=%d",
                status,
                extra={"event": "gateway_failed", "fields": {"status": 502, "upstream_status": status}},
            )
            await _answer(send, 502, openai_error(message, "api_error", "upstream_error"), extra=hedgerow_headers)
            return
        # httpx keeps the names as received (lower-case over HTTP/1.1 from most servers): the raw
        # pairs are passed on as they are, less the hop-by-hop and framing ones.
        headers = [(k.lower(), v) for k, v in response_headers.raw if k.lower() not in _DROP_RESPONSE]
        if status >= 400:  # an error body is small: read it whole, take any key out, send it
            content = self.redact((await _read_capped(response)).decode("utf-8", "replace")).encode()
            headers = [(k, v) for k, v in headers if k != b"content-length"]
            await _answer(send, status, content, headers=headers)
            return
        if response.is_stream_consumed:  # a whole answer (a non-streamed call): one piece
            await _answer(send, status, response.content, headers=[h for h in headers if h[0] != b"content-length"])
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
            detail = self.redact(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
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


class _Exchange:
    """What one request came to, for the metrics: where it went and how it ended.

    Attributes:
        arrived_at / started_at: monotonic times of the request's arrival and of its status line
            (None until sent), seconds.
        status: the HTTP status sent (0 until sent).
        route / model: the route's name and public model name (``""`` until routed).
        complete: the answer's last piece was sent.
        refused / failed / stream_failed / cancelled: what ended it, when not an answer.
    """

    __slots__ = (
        "arrived_at",
        "cancelled",
        "complete",
        "failed",
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


async def _read_body(receive: Receive, raw_headers: list[tuple[bytes, bytes]], limit: int) -> bytes | None:
    """The whole request body, or None when it is (or declares to be) over ``limit`` bytes."""
    for name, value in raw_headers:
        if name == b"content-length":
            declared = value.strip()
            if declared.isdigit() and int(declared) > limit:
                return None
            break
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError  # the caller left before sending the body
        piece = message.get("body", b"")
        size += len(piece)
        if size > limit:
            return None
        parts.append(piece)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _read_capped(response: httpx.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        parts.append(piece)
        size += len(piece)
        if size >= _MAX_ERROR_BODY:
            break
    return b"".join(parts)[:_MAX_ERROR_BODY]


def _error_message(content: bytes) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else its first line of text."""
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        message = data["error"].get("message")
        if isinstance(message, str):
            return message
    text = content.decode("utf-8", "replace").strip()
    if text.lstrip().startswith("<"):  # an HTML error page says nothing useful here
        return ""
    return (text.splitlines() or [""])[0]


def _body_model(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hedgerow"}


def _model_not_found(name: str) -> bytes:
    return openai_error(
        f"The model {name!r} does not exist on this hedgerow gateway (GET /v1/models lists them)",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def _not_found(path: str) -> bytes:
    return openai_error(f"hedgerow gateway: no route for {path!r}", "invalid_request_error", "unknown_url")


async def _answer(
    send: Send,
    status: int,
    content: bytes,
    *,
    extra: Sequence[tuple[bytes, bytes]] = (),
    headers: Sequence[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole response (JSON unless ``headers`` say otherwise)."""
    out = list(headers) if headers is not None else [(b"content-type", b"application/json")]
    out.append((b"content-length", str(len(content)).encode()))
    out.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": content, "more_body": False})
