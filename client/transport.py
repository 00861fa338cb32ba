"""``HedgingTransport``: hedged chat completions behind any httpx-based client (the openai SDK).

Plug it into the SDK and every chat completion is hedged, with no other change to the app::

    transport = HedgingTransport([Upstream("east", "https://east.example/v1", api_key="k1"),
                                  Upstream("west", "https://west.example/v1", api_key="k2")],
                                 route="summarize", policy=HedgePolicy(hedge_after_s=1.0))
    client = openai.AsyncOpenAI(base_url="http://hedgerow/v1", api_key="unused",
                                http_client=httpx.AsyncClient(transport=transport))
    stream = await client.chat.completions.create(model="m", messages=[...], stream=True)

What the transport does with one request:

* **Path re-basing.** The request path is split into the caller's base path and a remainder; the
  remainder is appended to each upstream's ``base_url`` and the query string is kept. The base
  path is ``base_path`` when given (the request path must start with it, else the answer is a
  404 naming both); by default it is everything up to and including the first path segment
  ``v1`` (``/v1/chat/completions`` and ``/proxy/v1/chat/completions`` both give
  ``/chat/completions``); a path without a ``v1`` segment is all remainder. So the SDK's
  ``base_url`` host and prefix are never contacted: use any placeholder.
* **Credentials.** The caller's ``Authorization`` and ``api-key`` headers are dropped; each
  upstream gets ``Authorization: Bearer <its api_key>`` (when set) and its own ``headers``.
  Other caller headers (``OpenAI-Organization``, the SDK's ``X-Stainless-*``, ``extra_headers``)
  are forwarded, except hop-by-hop ones; hedgerow's ``X-Request-ID`` (a UUID per attempt),
  ``Idempotency-Key`` and ``X-Hedgerow-Attempt`` replace the caller's on chat calls.
* **Model names.** An upstream with a ``model`` gets the body with that model name
  (``Upstream.attempt_body``), in every kind of request below.
* **``POST <base>/chat/completions`` with ``"stream": true``** is one ``HedgingClient`` call
  (hedge on a late first token, see ``hedgerow.client.hedging``). The response is returned when
  the winner's first token has arrived, so the app's TTFT is the winner's; it is a real streaming
  ``httpx.Response`` (status 200, the winner's headers minus framing ones) whose body passes the
  winner's chunks on as it read them: each chunk's ``data`` bytes unchanged, framed as one
  ``data: ...`` event per chunk (then ``data: [DONE]``; SSE comments, ``id:``/``retry:`` fields
  and ``event:`` names are not forwarded, line ends are ``\n``), one body piece per read of the
  winner's body (so a proxy writes a burst of chunks once). A chunk is re-encoded only when
  ``rewrite_model`` asks for its model name to be changed (below). If the caller set no
  ``stream_options``, the client still asks for usage (for the record) and the usage-only chunk
  (``choices: []`` with a ``usage``) is withheld from the app, which did not ask for it.
* **``"stream": false``** (or absent) is hedged on the arrival of the whole response
  (``hedgerow.client.unary``), under route ``unary_route`` (default ``"<route>.unary"``) so
  whole-response times do not mix with first-token times in the controller's estimates, and
  with ``unary_policy`` (default: ``policy``) and its own budget.
* **``POST <base>/responses``** (the Responses API) is hedged the same way, streaming or not
  (``HedgingClient.stream_responses``; non-streaming as whole responses under ``unary_route``):
  same route, thresholds and budgets as chat calls, the record's ``api`` is ``responses``; the
  streamed body passes each event on as ``event: <name>`` (the upstream's, else the event's
  ``type``) + ``data:`` with the upstream's bytes, without ``[DONE]``.
* **``rewrite_model``** (off by default; ``hedgerow gateway`` turns it on): when the winner is an
  upstream with its own ``model`` name, the answer's model name is set back to the one the caller
  sent, so which upstream answered does not show in the body: the ``model`` of each streamed chat
  chunk, the ``response.model`` of Responses events that carry one, the top-level ``model`` of a
  whole (non-streamed) answer. Only those chunks are re-encoded (compact JSON); every other chunk,
  and every answer of an upstream without its own ``model``, passes through byte for byte.
* **Every other request** (``GET /v1/models``, embeddings, files, ...) passes through unhedged
  to the primary (first) upstream (the request body re-sent as read, with the primary's
  ``Upstream.model`` applied to a JSON object body when it has one; the response streamed
  back as it comes), honouring the caller's timeout; it makes no ``CallRecord``. It goes through
  the same ``OwnedTransport`` as the hedged calls, so an app task cancelled while sending it or
  closing its response cannot leave the connection stuck in the pool (encode/httpcore#1115, #1093).
* A chat body that is not a JSON object with a string ``model`` is answered 400 (OpenAI error
  JSON naming the problem) without contacting any upstream.

Every response carries ``X-Hedgerow-Request-Id`` (the call's id, also the upstream
``Idempotency-Key``), ``X-Hedgerow-Winner`` and ``X-Hedgerow-Hedged`` (``true`` when a backup
attempt was started, whatever the outcome: by the hedge delay (a hedge) or because an earlier
attempt failed (a failover), so a call whose upstreams were all unreachable says ``true`` too; the
record's ``hedge_reason`` says which). The other response headers are the answering upstream's own
(its ``x-request-id``, rate-limit headers, ...), minus hop-by-hop, framing and encoding ones; they
name that upstream's hop, while ``X-Hedgerow-Request-Id`` names the call. ``X-Hedgerow-Winner``
names the upstream whose answer this is: the winner of a hedged call, or the primary for a
pass-through request. It is **empty** when no attempt won: a call that failed (an upstream's 4xx
handed back, the last error response of a call whose attempts all failed) and answers of hedgerow
itself (a 400 for a bad body); which upstream sent an error response is in the call's record.

Outcomes, as the SDK sees them:

=============================================  ===============================================
what happened                                  what the transport returns or raises
=============================================  ===============================================
a winner                                       its 200 response (streamed, or whole)
non-retryable 4xx (400/401/403/404/422)        that upstream's status and body (SDK raises its
                                               ``BadRequestError`` etc.); streaming calls carry
                                               the first 300 characters of the body
every attempt failed, some with an HTTP        the last such response's status, headers and
error status (503, 429, ...)                   body (the SDK raises ``APIStatusError``)
every attempt failed without an HTTP error     ``httpx.ConnectError`` whose message names each
response (refused, connect timeout, reset, a   attempt's error; ``__cause__`` is the
200 that was not a stream, an empty stream)    ``AllAttemptsFailed`` (SDK: ``APIConnectionError``)
``TotalTimeout`` before or after the first     ``httpx.ReadTimeout`` (SDK: ``APITimeoutError``)
token; ``StallTimeout``
the winner fails mid-stream (``StreamError``)  ``httpx.ReadError`` from the body stream (SDK:
                                               ``APIConnectionError``)
the app closes the stream early                every attempt closed, record status
(``await stream.close()``, ``async with``)     ``cancelled``; a stream dropped after a bare
                                               ``break`` is closed only when the garbage
                                               collector finalizes the SDK's generator
=============================================  ===============================================

Each hedged call hands exactly one ``CallRecord`` to ``telemetry``. The SDK's own retries
(``max_retries``, 2 by default) wrap the hedged call: each retry is a new call with its own
record. Set ``max_retries=0`` to leave failover to hedgerow alone. The SDK's per-request
``timeout`` applies to pass-through requests only; hedged calls are bounded by the policy's
``total_timeout_s`` and ``connect_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any

import httpx

from hedgerow.client._attempt_io import send_streaming
from hedgerow.client._call_stream import RawChunk
from hedgerow.client._chat_bytes import ChatByteStream, renamed_answer
from hedgerow.client._portal import PORTAL
from hedgerow.client._portal_body import handle_on_portal
from hedgerow.client._transport import OwnedTransport
from hedgerow.client._transport_answers import HEDGED_HEADER as HEDGED_HEADER  # hedgerow's headers, re-exported
from hedgerow.client._transport_answers import HOP_BY_HOP, answer_headers, error_response, failure, mark
from hedgerow.client._transport_answers import RECORD_EXTENSION as RECORD_EXTENSION
from hedgerow.client._transport_answers import REQUEST_ID_HEADER as REQUEST_ID_HEADER
from hedgerow.client._transport_answers import WINNER_HEADER as WINNER_HEADER
from hedgerow.client.budget import HedgeBudget
from hedgerow.client.errors import HedgeError
from hedgerow.client.hedging import (
    HedgingClient,
    RecordSink,
    ThresholdSource,
)
from hedgerow.client.names import check_route_name
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import CallApi
from hedgerow.client.unary import unary_call

__all__ = ["CHAT_COMPLETIONS_PATH", "HedgingTransport", "rebase_path"]

#: The remainder (after the base path) of the requests that are hedged.
CHAT_COMPLETIONS_PATH = "/chat/completions"
RESPONSES_PATH = "/responses"

# Request headers never forwarded: hop-by-hop, and the caller's credentials (upstreams use their own).
_DROP_PASSTHROUGH = HOP_BY_HOP | {"authorization", "api-key"}
# Pass-through bodies are re-sent whole (httpx sets Host and Content-Length again).
_DROP_PASSTHROUGH_REQUEST = _DROP_PASSTHROUGH | {"content-length", "transfer-encoding"}
# For hedged chat calls the body is re-sent and the framing, encoding and ids are hedgerow's.
_DROP_CHAT = _DROP_PASSTHROUGH | {
    "content-length",
    "transfer-encoding",
    "content-type",
    "accept",
    "accept-encoding",
    "x-request-id",
    "idempotency-key",
    "x-hedgerow-attempt",
}


def rebase_path(path: str, base_path: str | None = None) -> str | None:
    """The part of a request path that is appended to an upstream's ``base_url``.

    Args:
        path: the request's path, without the query string (``/v1/chat/completions``).
        base_path: the caller's base path (``/openai/v1``); None = up to and including the first
            ``v1`` segment, or nothing when there is none.

    Returns:
        The remainder starting with ``/`` (``/chat/completions``; ``""`` when the path is the
        base itself), or None when ``base_path`` is given and ``path`` is not under it.
    """
    if base_path is not None:
        base = base_path.rstrip("/")
        if path == base:
            return ""
        if not path.startswith(base + "/"):
            return None
        return path[len(base) :]
    segments = path.split("/")
    if "v1" in segments:
        cut = segments.index("v1") + 1
        rest = "/".join(segments[cut:])
        return "/" + rest if rest else ""
    return path


class HedgingTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that hedges chat completions (see the module docstring), for
    ``httpx.AsyncClient`` (``openai.AsyncOpenAI``) and ``httpx.Client`` (``openai.OpenAI``) alike.

    Synchronous use (``handle_request``) runs the same calls on the process's portal loop
    (``hedgerow.client._portal``) through a twin of this transport that shares its budgets,
    telemetry sink and threshold source, so sync and async calls in one process are recorded,
    budgeted and thresholded together. A task on the portal reads the response body and hands its
    pieces to the calling thread through a thread-safe queue (``hedgerow.client._portal_body``); closing the body
    ends the call as in async code (the loser is cancelled at the winner's first token either
    way). The telemetry sink's ``submit`` is then called from the portal's thread
    (``TelemetryExporter.submit`` is safe to call from any thread).

    Args:
        upstreams: the OpenAI-compatible endpoints in preference order (the first is the primary
            and receives every pass-through request). At least one; names unique.
        route: the app's logical name for the streamed chat calls (thresholds per (route, model)).
            Default ``"default"``, as for ``HedgingClient``. Route names follow
            :mod:`hedgerow.client.names` (so does ``unary_route``, and ``route + ".unary"``).
        policy: the ``HedgePolicy`` of streamed calls. Default ``HedgePolicy()``, as for
            ``HedgingClient``.
        thresholds: optional ``ThresholdSource`` (e.g. a ``ThresholdPoller``).
        telemetry: optional ``RecordSink`` (e.g. a ``TelemetryExporter``): one record per call.
        unary_route: route of non-streaming calls (default ``"<route>.unary"``).
        unary_policy: policy of non-streaming calls (default: ``policy``); it has its own budget.
        base_path: the caller's base path; None applies the ``v1`` rule of ``rebase_path``.
        client_tag: the records' ``client`` field (default: the host name).
        max_connections: size of the connection pool shared by all upstreams.
        rewrite_model: give answers the caller's model name back when the winning upstream has
            its own ``model`` (see the module docstring).

    Raises:
        ValueError: for bad upstreams, route, unary_route or base_path (must start with ``/``,
            no ``?``).
        TypeError: when ``policy`` or ``unary_policy`` is not a ``HedgePolicy``.

    The pool opens on the first request; ``aclose()`` (called by ``httpx.AsyncClient.aclose``)
    closes it, after which requests raise RuntimeError.
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        route: str = "default",
        policy: HedgePolicy | None = None,
        thresholds: ThresholdSource | None = None,
        telemetry: RecordSink | None = None,
        unary_route: str | None = None,
        unary_policy: HedgePolicy | None = None,
        base_path: str | None = None,
        client_tag: str | None = None,
        max_connections: int = 1000,
        rewrite_model: bool = False,
    ) -> None:
        if policy is None:
            policy = HedgePolicy()
        if not isinstance(policy, HedgePolicy):
            raise TypeError("policy: must be a HedgePolicy or None")
        if unary_policy is not None and not isinstance(unary_policy, HedgePolicy):
            raise TypeError("unary_policy: must be a HedgePolicy or None")
        if base_path is not None and (
            not isinstance(base_path, str) or not base_path.startswith("/") or "?" in base_path
        ):
            raise ValueError(f"base_path: must be a path starting with '/' and without a query, got {base_path!r}")
        check_route_name(route)  # the one name rule (hedgerow.client.names)
        if unary_route is None:
            check_route_name(f"{route}.unary", "route (with '.unary', the default unary_route)")
        else:
            check_route_name(unary_route, "unary_route")
        self._pool = OwnedTransport(limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=100))
        self._client = HedgingClient(
            upstreams,
            route=route,
            policy=policy,
            thresholds=thresholds,
            telemetry=telemetry,
            client_tag=client_tag,
            transport=self._pool,
        )
        self.upstreams: list[Upstream] = self._client.upstreams
        self.rewrite_model = rewrite_model
        self._by_name = {u.name: u for u in self.upstreams}
        self.route = route
        self.policy = policy
        self.unary_route = unary_route or f"{route}.unary"
        self.unary_policy = unary_policy or policy
        self.unary_budget = HedgeBudget(self.unary_policy.budget, self.unary_policy.budget_burst)
        self.base_path = base_path.rstrip("/") if base_path is not None else None
        self._http: httpx.AsyncClient | None = None
        self._closed = False
        self._lock = asyncio.Lock()
        self._twin_args: dict[str, Any] = {
            "upstreams": self.upstreams,
            "route": route,
            "policy": policy,
            "thresholds": thresholds,
            "telemetry": telemetry,
            "unary_route": self.unary_route,
            "unary_policy": self.unary_policy,
            "base_path": base_path,
            "client_tag": client_tag,
            "max_connections": max_connections,
            "rewrite_model": rewrite_model,
        }
        self._twin: HedgingTransport | None = None
        self._twin_lock = threading.Lock()

    @property
    def client(self) -> HedgingClient:
        """The ``HedgingClient`` behind the streamed calls (its ``budget``, ``telemetry``...)."""
        return self._client

    async def _open(self) -> httpx.AsyncClient:
        if self._closed:
            raise RuntimeError("HedgingTransport is closed")
        if self._http is None:
            async with self._lock:
                if self._http is None:
                    await self._client.__aenter__()
                    timeout = httpx.Timeout(None, connect=self.unary_policy.connect_timeout_s)
                    self._http = httpx.AsyncClient(transport=self._pool, timeout=timeout)
        return self._http

    async def aclose(self) -> None:
        """Close the connection pool (idempotent)."""
        self._closed = True
        await self._client.aclose()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        await self._pool.aclose()

    def _sync_twin(self) -> HedgingTransport:
        """The twin that serves ``handle_request`` on the portal loop (made on first use)."""
        with self._twin_lock:
            if self._closed:
                raise RuntimeError("HedgingTransport is closed")
            if self._twin is None:
                twin = HedgingTransport(**self._twin_args)
                # One budget of each kind per transport, whichever thread the call comes from.
                twin._client.budget = self._client.budget
                twin._client.failover_budget = self._client.failover_budget
                twin.unary_budget = self.unary_budget
                self._twin = twin
            return self._twin

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """The synchronous ``handle_async_request``: for ``httpx.Client`` and ``openai.OpenAI``.

        The call runs on the portal loop; the returned response's body is a sync stream read
        through the portal. Raises what ``handle_async_request`` raises (httpx transport errors
        for failed calls), and RuntimeError after ``close``.
        """
        twin = self._sync_twin()
        request.read()  # the body, in this thread: the portal then reads the cached bytes
        return PORTAL.run(handle_on_portal(twin, request))

    def close(self) -> None:
        """Close the sync twin's connection pool (``httpx.Client.close`` calls it); idempotent.

        Waits until the pool is closed, except on the portal's own thread, which cannot wait for
        its loop (openai's ``SyncHttpxClientWrapper.__del__`` closes the client in whichever
        thread the garbage collection runs, often the portal's): there the close is started on
        the portal's loop and not waited for. The async side is closed by ``aclose``.
        """
        with self._twin_lock:
            twin, self._twin = self._twin, None
        if twin is None:
            return
        if PORTAL.in_thread():
            PORTAL.start_soon(twin.aclose())
            return
        PORTAL.run(twin.aclose())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Hedge a chat completion, or pass any other request to the primary upstream.

        Returns:
            An ``httpx.Response`` (streaming for ``stream: true``) with the hedgerow headers.

        Raises:
            httpx.ConnectError: every attempt failed without an HTTP response.
            httpx.ReadTimeout: the call exceeded the policy's ``total_timeout_s``.
            httpx.TransportError: a pass-through request failed (as httpx raised it).
            RuntimeError: the transport was closed.
        """
        http = await self._open()
        raw_path = request.url.raw_path.decode("ascii")
        path, _, query = raw_path.partition("?")
        remainder = rebase_path(path, self.base_path)
        if remainder is None:
            return error_response(
                404, f"hedgerow: path {path!r} is not under base_path {self.base_path!r}", "not_found_error"
            )
        if request.method == "POST" and remainder.rstrip("/") == CHAT_COMPLETIONS_PATH:
            return await self._chat(http, request, query, "chat")
        if request.method == "POST" and remainder.rstrip("/") == RESPONSES_PATH:
            return await self._chat(http, request, query, "responses")
        return await self._passthrough(http, request, remainder, query)

    # -- chat completions -----------------------------------------------------------------------

    async def _chat(self, http: httpx.AsyncClient, request: httpx.Request, query: str, api: CallApi) -> httpx.Response:
        raw = await request.aread()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return error_response(400, f"hedgerow: request body is not valid JSON ({exc})", param="body")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return error_response(
                400, "hedgerow: request body must be a JSON object with a string 'model'", param="model"
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_CHAT}
        params = httpx.QueryParams(query) if query else None
        if body.get("stream") is True:
            return await self._stream(request, body, headers, params, api)
        return await self._unary(http, request, raw, body, headers, params, api)

    async def _stream(
        self,
        request: httpx.Request,
        body: dict[str, Any],
        headers: dict[str, str],
        params: httpx.QueryParams | None,
        api: CallApi,
    ) -> httpx.Response:
        start = self._client.stream_chat if api == "chat" else self._client.stream_responses
        call = start(body, headers=headers, params=params).keep_raw()
        await call.__aenter__()
        iterator = call.raw_batches()
        first: list[RawChunk] | None
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException as exc:
            await call.__aexit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, HedgeError):
                return failure(request, exc, call.request_id)
            raise
        response_headers = answer_headers(
            call.winner_response_headers, call.request_id, call.winner_upstream or "", call.hedged
        )
        # The body handed back is SSE framed by hedgerow, whatever the upstream labelled its body
        # (some label SSE as application/json, or not at all).
        response_headers["Content-Type"] = "text/event-stream; charset=utf-8"
        withhold = api == "chat" and "stream_options" not in body
        stream = ChatByteStream(
            call,
            iterator,
            first,
            withhold_usage=withhold,
            request=request,
            model=self._public_model(call.winner_upstream, body["model"]),
        )
        return httpx.Response(200, headers=response_headers, stream=stream, request=request)

    async def _unary(
        self,
        http: httpx.AsyncClient,
        request: httpx.Request,
        raw: bytes,
        body: dict[str, Any],
        headers: dict[str, str],
        params: httpx.QueryParams | None,
        api: CallApi,
    ) -> httpx.Response:
        model = body["model"]
        hedge_after_s, version, enabled = self.unary_policy.hedge_after_s, None, True
        if self._client.thresholds is not None:
            found = self._client.thresholds.lookup(self.unary_route, model)
            if found is not None:
                hedge_after_s, version, enabled = found
        try:
            result = await unary_call(
                http,
                self.upstreams,
                raw,
                route=self.unary_route,
                model=model,
                policy=self.unary_policy,
                budget=self.unary_budget,
                hedge_after_s=hedge_after_s,
                threshold_version=version,
                hedging_enabled=enabled,
                telemetry=self._client.telemetry,
                client_tag=self._client.client_tag,
                headers=headers,
                params=params,
                failover_budget=self._client.failover_budget,
                api=api,
            )
        except HedgeError as exc:
            return failure(request, exc, exc.record.request_id if exc.record else "")
        winner = result.upstream if result.record.winner is not None else ""  # a 4xx handed back: no winner
        response_headers = answer_headers(result.headers, result.record.request_id, winner, result.hedged)
        content = result.content
        public = self._public_model(winner, model)
        if public is not None and result.status_code == 200:
            content = renamed_answer(content, public)
        return httpx.Response(result.status_code, headers=response_headers, content=content, request=request)

    def _public_model(self, winner: str | None, model: str) -> str | None:
        """The model name to give the answer back (``rewrite_model``), or None to leave it."""
        if not self.rewrite_model or not winner:
            return None
        upstream = self._by_name.get(winner)
        if upstream is None or upstream.model is None or upstream.model == model:
            return None
        return model

    # -- everything else ------------------------------------------------------------------------

    async def _passthrough(
        self, http: httpx.AsyncClient, request: httpx.Request, remainder: str, query: str
    ) -> httpx.Response:
        upstream = self.upstreams[0]
        url = upstream.base_url.rstrip("/") + remainder + (f"?{query}" if query else "")
        headers = httpx.Headers(
            [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _DROP_PASSTHROUGH_REQUEST]
        )
        if upstream.api_key:
            headers["Authorization"] = f"Bearer {upstream.api_key}"
        if upstream.headers:
            headers.update(dict(upstream.headers))
        content = upstream.attempt_body(await request.aread())  # its own model name, when it has one
        outgoing = httpx.Request(request.method, url, headers=headers, content=content, extensions=request.extensions)
        response = await send_streaming(http, outgoing)
        kept = [
            (k, v) for k, v in response.headers.multi_items() if k.lower() not in HOP_BY_HOP | {"transfer-encoding"}
        ]
        out = httpx.Headers(kept)
        mark(out, "", upstream.name, False)
        extensions = {k: v for k, v in response.extensions.items() if k in ("http_version", "reason_phrase")}
        # response.stream closes with close_shielded (OwnedTransport), whoever closes it.
        return httpx.Response(
            response.status_code, headers=out, stream=response.stream, request=request, extensions=extensions
        )
