"""A hedged *non-streaming* chat completion: the race is on the arrival of the whole response.

``HedgingTransport`` uses this for requests whose body has ``"stream": false`` (or no ``stream``).
The rules are those of the streaming client (``hedgerow.client.hedging``) with "first token"
replaced by "complete response", decided by the same race core (``hedgerow.client._race``; the
whole response is its ``completed`` input):

1. The primary is sent to the first upstream; the hedge timer runs from its send.
2. If no complete response has arrived ``hedge_after_s`` after that send, the call asks the
   budget and, if granted, sends one backup to the next upstream (``hedge_reason =
   "ttft_timeout"``); a refused hedge is recorded as ``hedge_denied``.
3. The first complete HTTP 200 response whose body is a JSON object wins; every other attempt is
   cancelled at that moment (its request task cancelled, its connection closed).
4. An attempt that fails (connection error, HTTP 408/409/429/5xx or any other status that is
   not 200 and not listed below, a 200 whose body is not a JSON object) fails over at once
   when no other attempt is running (``hedge_reason = "primary_error"``, no budget spent,
   capped by ``max_backups``).
5. HTTP 400/401/403/404/422 (``NON_RETRYABLE_STATUSES``) are the caller's fault: when no other
   attempt is running, that response is the call's answer, returned as the upstream sent it.
6. Every attempt failing otherwise raises ``AllAttemptsFailed``; the call exceeding
   ``total_timeout_s`` raises ``TotalTimeout``.

The call's ``CallRecord`` has ``ttft_s = ttfo_s = e2e_s`` = the time to the winner's complete
response (there is no earlier token to see), ``tpot_s`` and ``max_itl_s`` null, token counts from
the response's ``usage``; a cancelled loser is censored at its cancellation. Exactly one record
per call, however it ends, goes to the telemetry sink.

Headers and connections are those of the streaming client: each attempt carries a UUID
``X-Request-ID`` (``attempt_request_id``), ``Idempotency-Key: {request_id}`` and
``X-Hedgerow-Attempt: <role>``; each response is read whole through the ``OwnedTransport``, which
closes it with ``close_shielded`` (a cancelled attempt cannot leave its connection counted as active
in the pool) and fails it with ``body_too_large`` past ``HedgePolicy.max_event_bytes`` (the whole
body counts as one event), so a broken upstream cannot exhaust the client's memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import httpx

from hedgerow.client._attempt_io import (
    ATTEMPT_HEADER,
    NON_RETRYABLE_STATUSES,
    attempt_request_id,
    not_found_hint,
    open_response,
    send_streaming,
)
from hedgerow.client._call_end import end_call
from hedgerow.client._race import Action, AttemptState, Cancel, Done, Race, Raise, Start
from hedgerow.client._responses import chat_usage
from hedgerow.client._transport import BODY_LIMIT_EXTENSION
from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.errors import HedgeError
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import CallApi, CallRecord

if TYPE_CHECKING:
    from hedgerow.client.hedging import RecordSink

__all__ = ["UnaryAttemptFailure", "UnaryResult", "unary_call"]

log = logging.getLogger("hedgerow.client")


class UnaryAttemptFailure(Exception):
    """One non-streaming attempt failed.

    Attributes:
        error_type: short machine name stored in the record (``http_503``, ``ConnectError``,
            ``malformed_body``).
        status_code: the HTTP status when a response arrived, else None.
        headers: that response's headers, else None.
        content: that response's body (complete), else ``b""``.
    """

    def __init__(
        self,
        error_type: str,
        message: str,
        *,
        status_code: int | None = None,
        headers: httpx.Headers | None = None,
        content: bytes = b"",
    ) -> None:
        self.error_type = error_type
        self.status_code = status_code
        self.headers = headers
        self.content = content
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class UnaryResult:
    """The answer of a hedged non-streaming call.

    Attributes:
        status_code: 200 for a winner; a non-retryable 4xx returned as the upstream sent it.
        headers: the answering upstream's response headers.
        content: the complete response body (decoded from any Content-Encoding).
        upstream: the answering upstream's name.
        hedged: True when a backup attempt was started.
        record: the call's ``CallRecord``.
    """

    status_code: int
    headers: httpx.Headers
    content: bytes
    upstream: str
    hedged: bool
    record: CallRecord


@dataclass(eq=False, slots=True)
class _Attempt:
    """The I/O side of one attempt; ``state`` is the race's view of it."""

    upstream: Upstream
    state: AttemptState
    task: asyncio.Task[httpx.Response] | None = None
    usage: dict[str, Any] | None = None


async def unary_call(
    http: httpx.AsyncClient,
    upstreams: Sequence[Upstream],
    content: bytes,
    *,
    route: str,
    model: str,
    policy: HedgePolicy,
    budget: HedgeBudget,
    hedge_after_s: float,
    threshold_version: int | None = None,
    hedging_enabled: bool = True,
    telemetry: RecordSink | None = None,
    client_tag: str | None = None,
    headers: Mapping[str, str] | None = None,
    params: Any = None,
    request_id: str | None = None,
    failover_budget: FailoverBudget | None = None,
    api: CallApi = "chat",
) -> UnaryResult:
    """Send one non-streaming chat completion, hedged on the arrival of the whole response.

    Args:
        http: an open ``httpx.AsyncClient`` used for every attempt.
        upstreams: the endpoints in order (first = primary); the request goes to each one's
            ``chat_url``.
        content: the request body, sent as is (``Content-Type: application/json``).
        route: the route written into the record (and used by the caller for thresholds).
        model: the request's model, for the record.
        policy: the ``HedgePolicy`` (``max_backups``, ``total_timeout_s``; ``hedge_after_s`` is
            passed separately because a polled threshold may override it).
        budget: the hedge budget shared with the caller's other calls; one deposit per call.
        hedge_after_s: seconds after the primary's send before a hedge is considered.
        threshold_version: version of the polled threshold, None for the policy default.
        hedging_enabled: False disables the hedge timer (failover still happens).
        telemetry: optional sink receiving the one ``CallRecord``.
        client_tag: the record's ``client`` field.
        headers: extra request headers sent to every upstream under hedgerow's own
            (``X-Request-ID``, ``Idempotency-Key``, ``X-Hedgerow-Attempt``, ``Authorization``, the
            upstream's headers).
        params: query parameters for every attempt (anything httpx accepts), or None.
        request_id: the call's id (default: a random UUID hex).
        failover_budget: the failover retry budget shared with the caller's other calls
            (default: a new one from the policy, i.e. none shared).
        api: ``chat`` (``POST {base_url}/chat/completions``) or ``responses`` (``POST
            {base_url}/responses``; the usage's ``input_tokens``/``output_tokens`` are counted).

    Returns:
        A ``UnaryResult`` (a winner's 200, or a non-retryable 4xx when nothing else was left).

    Raises:
        AllAttemptsFailed: every attempt failed; ``errors`` holds ``UnaryAttemptFailure`` or the
            transport exceptions, in start order. Its ``record`` is set.
        TotalTimeout: no answer within ``policy.total_timeout_s``. Its ``record`` is set.
    """
    call = _UnaryCall(
        http,
        list(upstreams),
        content,
        route=route,
        model=model,
        policy=policy,
        budget=budget,
        hedge_after_s=hedge_after_s,
        threshold_version=threshold_version,
        hedging_enabled=hedging_enabled,
        telemetry=telemetry,
        client_tag=client_tag,
        headers=headers,
        params=params,
        request_id=request_id or uuid.uuid4().hex,
        failover_budget=failover_budget or FailoverBudget(policy.failover_budget_tokens, policy.failover_token_ratio),
        api=api,
    )
    return await call.run()


class _UnaryCall:
    """One non-streaming hedged call: the I/O around the call's ``Race`` (``hedgerow.client._race``)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        order: list[Upstream],
        content: bytes,
        *,
        route: str,
        model: str,
        policy: HedgePolicy,
        budget: HedgeBudget,
        hedge_after_s: float,
        threshold_version: int | None,
        hedging_enabled: bool,
        telemetry: RecordSink | None,
        client_tag: str | None,
        headers: Mapping[str, str] | None,
        params: Any,
        request_id: str,
        failover_budget: FailoverBudget,
        api: CallApi = "chat",
    ) -> None:
        self._api: CallApi = api
        self._http = http
        self._order = order
        self._content = content
        self._telemetry = telemetry
        self._extra_headers = dict(headers or {})
        self._params = params
        self._max_body_bytes = policy.max_event_bytes
        self.request_id = request_id
        self._race = Race(
            [u.name for u in order],
            hedge_after_s=hedge_after_s,
            hedging_enabled=hedging_enabled,
            max_backups=policy.max_backups,
            total_timeout_s=policy.total_timeout_s,
            stall_timeout_s=None,
            budget=budget,
            failover_budget=failover_budget,
            request_id=request_id,
            route=route,
            model=model,
            started_at=datetime.now(UTC),
            client=client_tag,
            threshold_version=threshold_version,
            streaming=False,
            api=api,
        )
        self._attempts: list[_Attempt] = []
        self._t0 = 0.0
        self._record: CallRecord | None = None

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _headers(self, attempt: _Attempt) -> httpx.Headers:
        role = attempt.state.header_role
        headers = httpx.Headers(self._extra_headers)
        headers["X-Request-ID"] = attempt_request_id(self.request_id, role)
        headers["Idempotency-Key"] = self.request_id
        headers[ATTEMPT_HEADER] = role
        headers["Content-Type"] = "application/json"
        if attempt.upstream.api_key:
            headers["Authorization"] = f"Bearer {attempt.upstream.api_key}"
        if attempt.upstream.headers:
            headers.update(dict(attempt.upstream.headers))
        return headers

    def _execute(self, actions: tuple[Action, ...]) -> bool:
        """Carry out the race's actions; True when one was ``Done``. ``Raise`` raises."""
        done = False
        for action in actions:
            if isinstance(action, Start):
                state = action.attempt
                attempt = _Attempt(self._order[state.index], state)
                self._attempts.append(attempt)
                attempt.task = asyncio.create_task(self._send(attempt), name=f"hedgerow-unary-{state.header_role}")
            elif isinstance(action, Cancel):
                task = self._attempts[action.attempt.index].task
                if task is not None and not task.done():
                    task.cancel()
            elif isinstance(action, Done):
                done = True
            elif isinstance(action, Raise):
                raise action.error
        return done

    async def _send(self, attempt: _Attempt) -> httpx.Response:
        """One attempt: the whole response, or ``UnaryAttemptFailure``/a transport error."""
        self._race.sent(attempt.state, self._now())
        request = self._http.build_request(
            "POST",
            attempt.upstream.chat_url if self._api == "chat" else attempt.upstream.responses_url,
            content=attempt.upstream.attempt_body(self._content),
            headers=self._headers(attempt),
            params=self._params,
            extensions={BODY_LIMIT_EXTENSION: self._max_body_bytes},
        )
        async with open_response(partial(send_streaming, self._http), request) as response:
            await response.aread()  # over max_body_bytes: BodyTooLarge (a failure that fails over)
        self._race.response(attempt.state, response.status_code)
        if response.status_code != 200:
            raise UnaryAttemptFailure(
                f"http_{response.status_code}",
                f"HTTP {response.status_code}: {response.text[:300]}",
                status_code=response.status_code,
                headers=response.headers,
                content=response.content,
            )
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise UnaryAttemptFailure(
                "malformed_body",
                f"HTTP 200 body is not a JSON object: {response.text[:120]!r}",
                status_code=200,
                headers=response.headers,
                content=response.content,
            )
        if body.get("error") is not None:
            raise UnaryAttemptFailure(
                "error_payload",
                f"HTTP 200 with an error payload: {response.text[:200]}",
                status_code=200,
                headers=response.headers,
                content=response.content,
            )
        usage = body.get("usage")
        if self._api == "responses":
            attempt.usage = chat_usage(usage)
        else:
            attempt.usage = usage if isinstance(usage, dict) else None
        return response

    async def run(self) -> UnaryResult:
        self._t0 = time.monotonic()
        self._race.started_at = datetime.now(UTC)
        try:
            self._execute(self._race.begin(0.0))
            response, attempt = await self._run_race()
        except HedgeError as exc:
            await self._finish()
            exc.record = self._record
            raise
        except BaseException as exc:
            why = "caller_cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
            self._race.abandon(self._now(), why)
            await self._finish()
            raise
        await self._finish()
        assert self._record is not None, "the record is written before the winner is returned"
        return UnaryResult(
            status_code=response.status_code,
            headers=response.headers,
            content=response.content,
            upstream=attempt.upstream.name,
            hedged=self._race.hedged,
            record=self._record,
        )

    async def _run_race(self) -> tuple[httpx.Response, _Attempt]:
        race = self._race
        while True:
            alive = {a.task: a for a in self._attempts if a.state.alive and a.task is not None}
            remaining = race.deadline - self._now()
            done: set[asyncio.Task[httpx.Response]] = set()
            if remaining > 0 and alive:
                timeout = None if math.isinf(remaining) else remaining
                done, _ = await asyncio.wait(alive, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                primary = self._attempts[0]
                if not primary.state.sent and primary.task is not None and not primary.task.done():
                    await asyncio.sleep(0)  # let the primary's task run and stamp its send
                    continue
                self._execute(race.tick(self._now()))
                continue
            # Several may finish in the same instant: the earliest started goes first.
            for task in sorted(done, key=lambda t: alive[t].state.index):
                attempt = alive[task]
                at = self._now()
                exc = task.exception()
                if exc is None:
                    if self._execute(race.completed(attempt.state, at, attempt.usage)):
                        return task.result(), attempt
                    continue
                caller_fault = isinstance(exc, UnaryAttemptFailure) and exc.status_code in NON_RETRYABLE_STATUSES
                actions = race.failed(attempt.state, exc, at, caller_fault=caller_fault)
                if caller_fault and any(isinstance(a, Raise) and a.error is exc for a in actions):
                    # The caller's fault: answer with the upstream's own response, no failover.
                    assert isinstance(exc, UnaryAttemptFailure) and exc.status_code is not None
                    hint = not_found_hint(attempt.upstream) if exc.status_code == 404 else None
                    if hint:  # the response is the upstream's own: the hint can only be logged
                        log.warning("upstream %r answered HTTP 404: %s", attempt.upstream.name, hint)
                    return httpx.Response(exc.status_code, headers=exc.headers, content=exc.content), attempt
                self._execute(actions)

    async def _finish(self) -> None:
        """Cancel every attempt still running, wait for it, build and submit the record."""
        self._race.abandon(self._now())
        tasks = []
        for attempt in self._attempts:
            if attempt.task is not None:
                if not attempt.task.done():
                    attempt.task.cancel()
                tasks.append(attempt.task)
        await end_call(tasks, self._race, self._telemetry, self._keep_record)

    def _keep_record(self, record: CallRecord) -> None:
        self._record = record
