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

This module is the facade: ``HedgingClient``, its results and the protocols of its threshold
source and record sink. Behind it, ``_call_stream`` runs one call (``CallStream``: the attempts'
tasks and the race's actions), ``_attempt_io`` holds the I/O of one attempt (request ids and
headers, the send, the SSE and event-size checks, error excerpts, draining), and ``_race`` is the
sans-IO race core that decides.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

import httpx

from hedgerow.client._attempt_io import (
    ATTEMPT_ID_NAMESPACE,
    NON_RETRYABLE_STATUSES,
    AttemptSender,
    attempt_request_id,
    random_uuid_hex,
)
from hedgerow.client._call_stream import CallStream, check_body
from hedgerow.client._responses import ResponsesAssembler
from hedgerow.client._transport import OwnedTransport
from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.chunks import AnswerAssembler
from hedgerow.client.names import check_route_name
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import CallApi, CallRecord

__all__ = [
    "ATTEMPT_ID_NAMESPACE",
    "NON_RETRYABLE_STATUSES",
    "CallStream",
    "ChatResult",
    "HedgingClient",
    "RecordSink",
    "ResponsesResult",
    "ThresholdSource",
    "attempt_request_id",
]


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
        self._sender: AttemptSender | None = None
        # Parsed once per (upstream, API): httpx parses a URL given as a string on every request.
        self._urls: dict[tuple[str, CallApi], httpx.URL] = {}

    async def __aenter__(self) -> Self:
        timeout = httpx.Timeout(None, connect=self.policy.connect_timeout_s)
        limits = httpx.Limits(max_connections=self._max_connections, max_keepalive_connections=100)
        transport = self._transport
        if not isinstance(transport, OwnedTransport):
            transport = OwnedTransport(transport, limits=limits)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)
        self._sender = AttemptSender(self._http, transport)
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
        check_body(wire)
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
            request_id=request_id or random_uuid_hex(),
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
