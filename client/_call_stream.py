"""One hedged call in progress: ``CallStream``, the I/O side of the race.

``HedgingClient.stream_chat`` / ``stream_responses`` make one; it starts the attempts' tasks,
feeds their events (first tokens, failures, ends) to the sans-IO race core
(:class:`hedgerow.client._race.Race`) and carries out its actions (start a backup, cancel a
loser, hand the winner's chunks to the reader, raise). The rules are the race's and the
failure-mode table is :mod:`hedgerow.client.hedging`'s docstring.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self, cast

import httpx

from hedgerow.client._attempt_io import (
    ATTEMPT_HEADER,
    NON_RETRYABLE_STATUSES,
    EventSizeCap,
    attempt_request_id,
    body_excerpt,
    check_sse,
    drain_body,
    encode_body,
    not_found_hint,
    open_response,
    parse_chunk,
    text_excerpt,
)
from hedgerow.client._call_end import end_call
from hedgerow.client._race import Action, AttemptState, Cancel, Race, Raise, Start, Won
from hedgerow.client._responses import attempt_failure, classify_event
from hedgerow.client._sse import SseDecoder
from hedgerow.client._transport import GATE_EXTENSION, CancelGate
from hedgerow.client.chunks import classify_chunk
from hedgerow.client.errors import (
    AttemptError,
    HedgeError,
    UpstreamError,
)
from hedgerow.client.policy import Upstream
from hedgerow.client.records import CallApi, CallRecord

if TYPE_CHECKING:
    from hedgerow.client.hedging import HedgingClient

__all__ = ["CallStream", "RawChunk", "check_body", "choice_count"]

log = logging.getLogger("hedgerow.client")

#: One chunk of a pass-through call (``CallStream.raw_batches``): the parsed JSON object, the SSE
#: ``event`` name the upstream gave it (``""`` when none) and its ``data`` bytes as received.
RawChunk = tuple[dict[str, Any], str, bytes]


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
    pending: list[Any] = field(default_factory=list)  # chunk dicts, or ``RawChunk`` tuples
    response_headers: httpx.Headers | None = None


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
        self._classify: Callable[[Any], Any] = classify_chunk if api == "chat" else classify_event
        self._raw = False  # pass-through (``keep_raw``): chunks are ``RawChunk`` tuples
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
            choices=choice_count(body) if api == "chat" else 1,
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
        self._head: asyncio.Future[list[Any]] | None = None
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
        if self._raw:
            raise RuntimeError("a CallStream made with keep_raw() is read with raw_batches()")
        return self._start_reading(batched=False)

    def keep_raw(self) -> Self:
        """Have this call keep each chunk's SSE bytes, for ``raw_batches`` (a pass-through proxy).

        Must be called before the ``async with`` block is entered. Returns the call.

        Raises:
            RuntimeError: when the call has started already.
        """
        if self._head is not None:
            raise RuntimeError("keep_raw() must be called before the call starts")
        self._raw = True
        base = self._classify
        self._classify = lambda item: base(item[0])
        return self

    def raw_batches(self) -> AsyncIterator[list[RawChunk]]:
        """The winner's chunks as they were read: one list of ``RawChunk`` per read of its body
        (the first list holds the chunks up to and including the first token).

        The same call as iterating (the race, the record, the errors raised are the same); only
        the shape differs, so that a proxy can send each read on as one write of the upstream's
        own bytes. Iterate once, instead of iterating the call itself.

        Raises:
            RuntimeError: without ``keep_raw()``, or when read twice.
        """
        if not self._raw:
            raise RuntimeError("raw_batches() needs keep_raw() before the call starts")
        return self._start_reading(batched=True)

    def _start_reading(self, *, batched: bool) -> AsyncIterator[Any]:
        if self._iterated:
            raise RuntimeError("a CallStream can be iterated only once")
        self._iterated = True
        generator = self._run(batched)
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
            self._encoded = encode_body(self._body).encode()
        if upstream.model is None:
            return self._encoded
        return upstream.attempt_body(self._encoded)

    def _request(self, attempt: _Attempt, gate: CancelGate) -> httpx.Request:
        """The attempt's request: ``AttemptSender.template``'s headers for its upstream (made
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
        raw = self._raw
        delta_seen = False
        try:
            assert self._sender is not None
            async with open_response(self._sender.send, self._request(attempt, gate)) as response:
                self._race.response(attempt.state, response.status_code)
                attempt.response_headers = response.headers
                if response.status_code != 200:
                    # The status decides; the body is only an excerpt for the error, read briefly.
                    excerpt = await body_excerpt(response, gate)
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
                    response.stream = EventSizeCap(response.stream, self._policy.max_event_bytes)
                check_sse(response)
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
                                    raise AttemptError("sse_error", f"SSE error event: {text_excerpt(data, 200)}")
                                if not data.startswith(b"{"):  # only non-JSON needs a strip: [DONE], blank
                                    stripped = data.strip()
                                    if stripped == b"[DONE]":
                                        done_at = self._now()
                                        break
                                    if not stripped or stripped == b"null":  # a frame without an object
                                        continue
                                chunk = parse_chunk(data)
                                if responses:
                                    stopped = attempt_failure(chunk, delta_seen)
                                    if stopped is not None:
                                        raise stopped
                                    delta_seen = delta_seen or str(chunk.get("type", "")).endswith(".delta")
                                elif chunk.get("error") is not None:
                                    raise AttemptError(
                                        "sse_error", f"SSE error payload: {json.dumps(chunk['error'])[:200]}"
                                    )
                                item: Any = (chunk, name, data) if raw else chunk
                                if not self._racing:
                                    batch.append(item)
                                elif self._race_event("chunk", attempt, item, self._now()):
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
                        await drain_body(pieces, gate)
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

    def _settle(self, outcome: list[Any] | BaseException) -> None:
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

    async def _run(self, batched: bool) -> AsyncIterator[Any]:
        """The winner's chunks, one at a time, or (``batched``) one list per read."""
        race = self._race
        assert self._head is not None
        try:
            # Phase 1 runs in the attempts' tasks and the timer (``_race_event``, ``_on_timer``);
            # a cancellation of the reader here ends the call, as leaving it would.
            head = await self._head
            if batched:
                if head:
                    yield head
            else:
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
                        if batched:  # the race counts the read's chunks, then the reader gets them
                            for item in payload:
                                winner_chunk(winner_state, classify(item), at)
                            yield payload
                            continue
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
        await end_call(tasks, self._race, self._client.telemetry, self._keep_record)

    def _keep_record(self, record: CallRecord) -> None:
        self.record = record


def check_body(body: object) -> None:
    """Raise ``ValueError`` naming the field when ``body`` cannot be a chat-completions request."""
    if not isinstance(body, dict):
        raise ValueError(f"body: must be a dict (the chat-completions JSON object), got {type(body).__name__}")
    if "model" not in body:
        raise ValueError("body['model']: missing; a string model name is required")
    if not isinstance(body["model"], str):
        raise ValueError(f"body['model']: must be a string, got {type(body['model']).__name__}")


def choice_count(body: Mapping[str, Any]) -> int:
    """The number of choices a chat request asks for: its ``n`` when a positive int, else 1."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
