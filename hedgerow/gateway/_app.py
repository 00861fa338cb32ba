"""The gateway's ASGI app: OpenAI-compatible HTTP in front of ``HedgingTransport``.

Each request is checked here (auth, size, concurrency, the model's route) and then handed, as an
``httpx.Request``, to the route's ``hedgerow.client.HedgingTransport``, which runs the same race
as the library (see its module docstring: hedged chat and Responses calls, pass-through of other
paths, the caller's credentials dropped, each upstream's key applied, the ``X-Hedgerow-*``
headers); :mod:`hedgerow.gateway._relay` streams its answer back (timing, disconnects, errors)
and :mod:`hedgerow.gateway._answers` holds the OpenAI-shaped error answers. This module holds no
hedging rule of its own; what it adds:

* **Auth.** With gateway keys configured, every request needs ``Authorization: Bearer <key>``
  (or ``api-key: <key>``); else 401 ``invalid_api_key``. The caller's key never reaches an
  upstream (the transport drops it, and so does this app). The key's *name* is the caller: the
  ``client`` of its calls' records (:mod:`hedgerow.gateway._records`) and the ``key`` label of
  ``hedgerow_gateway_requests_total``.
* **Routing.** ``POST /v1/chat/completions`` and ``/v1/responses`` (and any other ``POST`` with
  a JSON ``model``, passed through to the route's primary) go to the transport of the body's
  public model; an unknown model is 404 ``model_not_found``. ``GET /v1/models`` lists the public
  model names (``GET /v1/models/{name}`` one of them). With ``any_model`` (no model table),
  everything goes to that one route's transport as it is. Other paths are 404; a known path
  with another method (``GET /v1/chat/completions``) is 405 ``method_not_allowed`` with
  ``Allow``.
* **Limits.** A body over ``max_body_bytes`` is 413 ``request_too_large``; more than
  ``max_concurrent`` requests in flight is 429 ``gateway_busy``, more than
  ``max_concurrent_per_key`` with keys of one name 429 ``key_busy``, both with ``Retry-After: 1``;
  a call past its route's ``total_timeout_s`` is 504 ``upstream_timeout``
  (:mod:`hedgerow.gateway._relay`).
* **Secrets.** Every configured key (upstream or gateway) is replaced by ``[redacted]`` in error
  bodies handed back and in log lines.
* **Logs.** One ``gateway_request`` line per request: method, path, ``status`` (499 when the
  caller left before a status was sent), ``outcome`` (the metrics' label: ``ok``,
  ``cancelled``, ...), duration and both request ids.
* **Request ids.** Every answer carries a non-empty ``X-Hedgerow-Request-Id`` (the call's id,
  or a new one where no call was made), also in the ``gateway_request`` log line; a caller's
  valid ``X-Request-ID`` is echoed on every answer and logged beside it
  (:mod:`hedgerow.gateway._request_id`).
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
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx

from hedgerow.client import HedgingTransport
from hedgerow.client.hedging import RecordSink, ThresholdSource
from hedgerow.gateway._answers import (
    REDACTED,
    Message,
    Receive,
    Scope,
    Send,
    answer,
    method_not_allowed,
    model_not_found,
    not_found,
    openai_error,
)
from hedgerow.gateway._config import GatewayConfig, RouteSpec
from hedgerow.gateway._metrics import CONTENT_TYPE, GatewayMetrics
from hedgerow.gateway._records import CALLER, RecordLog
from hedgerow.gateway._relay import Exchange, proxy
from hedgerow.gateway._request_id import CALLER_REQUEST_ID, caller_request_id, echoed, with_hedgerow_id
from hedgerow.logs import event_line

__all__ = ["CLIENT_CLOSED", "GatewayApp", "RecordLog"]

_log = logging.getLogger("hedgerow.gateway")

#: The ``status`` of the ``gateway_request`` log line of a caller that left before an answer's
#: status was sent (nginx's "client closed request"); the line's ``outcome`` says ``cancelled``.
CLIENT_CLOSED = 499

#: The method of each path the gateway knows (another method is 405 with ``Allow``); ``GET
#: /v1/models`` is the gateway's own only with a model table (else passed through as it is).
_METHODS = {"/v1/chat/completions": "POST", "/v1/responses": "POST", "/v1/models": "GET"}

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
#: Most request URLs kept for reuse (one per path; parsing a URL costs more than the lookup).
_MAX_CACHED_URLS = 64


class GatewayApp:
    """The ASGI app of ``hedgerow gateway`` (see the module docstring for what it does).

    Args:
        config: the resolved ``GatewayConfig`` (routes, keys, limits).
        thresholds: optional ``ThresholdSource`` shared by every route (a ``ThresholdPoller``).
        telemetry: optional ``RecordSink`` for the calls' records (wrapped in a ``RecordLog``,
            which also counts and logs them).
        background: async context managers entered at the ASGI lifespan's start and left at its
            end, in reverse order (the poller, the exporter).
        client_tag: the records' ``client`` field when the gateway has no keys (default: the host
            name); with keys it is the calling key's name.
        metrics: the ``GatewayMetrics`` to count into (default: new ones); ``serve --gateway``
            passes those it also serves at the api's ``/metrics``.

    Attributes:
        records: the ``RecordLog`` every record goes through.
        in_flight: requests being proxied now (the ``max_concurrent`` limit counts these).
        in_flight_by_key: the same per key name (the ``max_concurrent_per_key`` limit counts these).
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
        metrics: GatewayMetrics | None = None,
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
        self.in_flight_by_key: dict[str, int] = {}
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self._urls: dict[str, httpx.URL] = {}

    def transport(self, spec: RouteSpec) -> HedgingTransport:
        """The ``HedgingTransport`` of a route spec of this app's configuration."""
        return self._transports[id(spec)]

    def redact(self, text: str) -> str:
        """``text`` with every configured key replaced by ``[redacted]``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
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
        exchange = Exchange(time.monotonic())
        request_id = caller_request_id(scope.get("headers", []))

        hedgerow_id: str | None = None

        async def sending(message: Message) -> None:
            nonlocal hedgerow_id
            if message["type"] == "http.response.start":
                exchange.status = int(message["status"])
                exchange.started_at = time.monotonic()
                headers, hedgerow_id = with_hedgerow_id(message.get("headers", []))
                if request_id is not None:
                    headers = echoed(headers, request_id)
                message = {**message, "headers": headers}
            elif not message.get("more_body", False):
                exchange.complete = True  # before the send: a disconnect from now on is the end
            await send(message)

        metrics = self.metrics
        metrics.in_flight.inc()
        token = CALLER_REQUEST_ID.set(request_id) if request_id is not None else None
        try:
            await self._http(scope, receive, sending, exchange)
        finally:
            if token is not None:
                CALLER_REQUEST_ID.reset(token)
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
                exchange.key,
            )
            if _log.isEnabledFor(logging.INFO):
                fields = {
                    "method": scope.get("method"),
                    "path": self.redact(str(scope.get("path"))),
                    # a caller that left before any status was sent: nginx's 499
                    "status": exchange.status or (CLIENT_CLOSED if exchange.cancelled else None),
                    "outcome": exchange.outcome(),
                    "duration_s": round(ended - exchange.arrived_at, 4),
                    "request_id": hedgerow_id,
                    "caller_request_id": request_id,
                }
                _log.info(event_line("gateway_request", fields), extra={"event": "gateway_request", "fields": fields})

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

    async def _http(self, scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
        raw_headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        config = self.config
        caller: str | None = None
        if config.keys:
            caller = self._caller(raw_headers)
        if config.keys and caller is None:
            exchange.refused = True
            await answer(
                send,
                401,
                openai_error(
                    "hedgerow gateway: missing or unknown API key (send Authorization: Bearer <key>)",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            )
            return
        if caller is not None:
            exchange.key = caller
        if self.in_flight >= config.max_concurrent:
            exchange.refused = True
            message = f"hedgerow gateway: {config.max_concurrent} requests are in flight already; retry shortly"
            await answer(
                send,
                429,
                openai_error(message, "rate_limit_error", "gateway_busy"),
                extra=[(b"retry-after", b"1")],
            )
            return
        per_key = config.max_concurrent_per_key
        by_key = self.in_flight_by_key
        if caller is not None and per_key is not None and by_key.get(caller, 0) >= per_key:
            exchange.refused = True
            message = f"hedgerow gateway: {per_key} requests of the key {caller!r} are in flight already; retry shortly"
            await answer(
                send,
                429,
                openai_error(message, "rate_limit_error", "key_busy"),
                extra=[(b"retry-after", b"1")],
            )
            return
        self.in_flight += 1
        if caller is not None:
            by_key[caller] = by_key.get(caller, 0) + 1
        token = CALLER.set(caller) if caller is not None else None
        try:
            await self._serve(scope, receive, send, raw_headers, exchange)
        finally:
            self.in_flight -= 1
            if token is not None:
                CALLER.reset(token)
            if caller is not None:
                left = by_key[caller] - 1
                if left:
                    by_key[caller] = left
                else:
                    del by_key[caller]

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """``GET /metrics``: the ``hedgerow_gateway_*`` family (a gateway key needed when keys are set)."""
        if self.config.keys and self._caller(scope.get("headers", [])) is None:
            await answer(
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
            await answer(
                send, 405, openai_error("hedgerow gateway: /metrics answers GET", "invalid_request_error", None)
            )
            return
        await answer(send, 200, self.metrics.render(), headers=[(b"content-type", CONTENT_TYPE.encode())])

    def _caller(self, raw_headers: list[tuple[bytes, bytes]]) -> str | None:
        """The name of the gateway key the request carries, or None without a known one."""
        given = api_key = ""
        for header, value in raw_headers:
            if header == b"authorization":
                given = value.decode("latin-1")
            elif header == b"api-key":
                api_key = value.decode("latin-1")
        scheme, _, token = given.partition(" ")
        key = token.strip() if scheme.lower() == "bearer" else api_key
        if not key:
            return None
        given_bytes = key.encode()
        found: str | None = None
        for known, key_name in self.config.keys.items():  # compare with every key, in constant time each
            if hmac.compare_digest(given_bytes, known.encode()):
                found = key_name
        return found

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, raw_headers: list[tuple[bytes, bytes]], exchange: Exchange
    ) -> None:
        method = str(scope.get("method", "GET")).upper()
        path = str(scope.get("path", "/"))
        config = self.config
        if not (path == "/v1" or path.startswith("/v1/")):
            exchange.refused = True
            await answer(send, 404, not_found(path))
            return
        any_model = config.any_model
        allowed = _METHODS.get(path.rstrip("/"))
        if allowed is not None and method != allowed and (allowed == "POST" or any_model is None):
            exchange.refused = True
            await answer(
                send, 405, method_not_allowed(method, path, allowed), extra=[(b"allow", allowed.encode("ascii"))]
            )
            return
        if any_model is None and method == "GET" and path.rstrip("/") == "/v1/models":
            await answer(send, 200, self._model_list())
            return
        if any_model is None and method == "GET" and path.startswith("/v1/models/"):
            name = path.removeprefix("/v1/models/")
            if name in config.routes:
                await answer(send, 200, json.dumps(_model_object(name)).encode())
            else:
                exchange.refused = True
                await answer(send, 404, model_not_found(name))
            return
        try:
            body = await _read_body(receive, raw_headers, config.max_body_bytes)
        except asyncio.CancelledError:
            exchange.cancelled = True
            raise
        if body is None:
            exchange.refused = True
            await answer(
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
                await answer(send, 404, not_found(path))
                return
            model = _body_model(body)
            if model is None:
                # Not a JSON object with a string model: the transport answers its own 400 for
                # chat and Responses bodies; other paths need a model to be routed at all.
                if path.rstrip("/") not in ("/v1/chat/completions", "/v1/responses"):
                    exchange.refused = True
                    await answer(send, 404, not_found(path))
                    return
                spec = next(iter(config.routes.values()))
            elif model not in config.routes:
                exchange.refused = True
                await answer(send, 404, model_not_found(model))
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
        # The body as a stream, not ``content=``: httpx would then set Content-Length and Host and
        # copy the body (a third of the cost of building the request), which the transport drops;
        # it reads the body with ``aread()`` and sets each attempt's framing itself.
        request = httpx.Request(method, target, headers=forwarded, stream=httpx.ByteStream(body))
        await proxy(self.transport(spec), request, receive, send, exchange, self.redact)

    def _model_list(self) -> bytes:
        data = [_model_object(name) for name in self.config.routes]
        return json.dumps({"object": "list", "data": data}).encode()


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


def _body_model(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hedgerow"}
