"""A hedged *non-streaming* chat completion: the race is on the arrival of the whole response.

``HedgingTransport`` uses this for requests whose body has ``"stream": false`` (or no ``stream``).
The rules follow the streaming client (``hedgerow.client.hedging``) with "first token" replaced
by "complete response":

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
``X-Hedgerow-Attempt: <role>``; each response is read whole and closed with ``close_shielded``,
so a cancelled attempt cannot leave its connection counted as active in the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from hedgerow.client.budget import HedgeBudget
from hedgerow.client.chunks import cached_prompt_tokens
from hedgerow.client.errors import AllAttemptsFailed, HedgeError, TotalTimeout
from hedgerow.client.hedging import (
    ATTEMPT_HEADER,
    NON_RETRYABLE_STATUSES,
    RecordSink,
    attempt_request_id,
    not_found_hint,
    open_response,
    wait_tasks_shielded,
)
from hedgerow.client.policy import HedgePolicy, Upstream
from hedgerow.client.records import AttemptRecord, CallRecord, with_prompt_estimates

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


@dataclass(eq=False)
class _Attempt:
    upstream: Upstream
    role: str
    header_role: str
    start: float
    task: asyncio.Task[httpx.Response] | None = None
    status_code: int | None = None
    end_at: float | None = None
    outcome: str | None = None
    error_type: str | None = None
    completion_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


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
    )
    return await call.run()


class _UnaryCall:
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
    ) -> None:
        self._http = http
        self._order = order
        self._content = content
        self._route = route
        self._model = model
        self._policy = policy
        self._budget = budget
        self._hedge_after_s = hedge_after_s
        self._version = threshold_version
        self._enabled = hedging_enabled
        self._telemetry = telemetry
        self._client_tag = client_tag
        self._extra_headers = dict(headers or {})
        self._params = params
        self.request_id = request_id
        self._attempts: list[_Attempt] = []
        self._winner: _Attempt | None = None
        self._hedge_reason: str | None = None
        self._hedge_denied = False
        self._status: str | None = None
        self._error_type: str | None = None
        self._prompt_tokens: int | None = None
        self._t0 = 0.0
        self._started_at = datetime.now(UTC)
        self._record: CallRecord | None = None

    def _now(self) -> float:
        return time.monotonic() - self._t0

    def _headers(self, attempt: _Attempt) -> httpx.Headers:
        headers = httpx.Headers(self._extra_headers)
        headers["X-Request-ID"] = attempt_request_id(self.request_id, attempt.header_role)
        headers["Idempotency-Key"] = self.request_id
        headers[ATTEMPT_HEADER] = attempt.header_role
        headers["Content-Type"] = "application/json"
        if attempt.upstream.api_key:
            headers["Authorization"] = f"Bearer {attempt.upstream.api_key}"
        if attempt.upstream.headers:
            headers.update(dict(attempt.upstream.headers))
        return headers

    def _can_add_backup(self) -> bool:
        return len(self._attempts) - 1 < self._policy.max_backups and len(self._attempts) < len(self._order)

    def _start_attempt(self, role: str) -> None:
        index = len(self._attempts)
        upstream = self._order[index]
        header_role = role if index < 2 else f"{role}{index}"
        attempt = _Attempt(upstream=upstream, role=role, header_role=header_role, start=self._now())
        self._attempts.append(attempt)
        attempt.task = asyncio.create_task(self._send(attempt), name=f"hedgerow-unary-{header_role}")

    async def _send(self, attempt: _Attempt) -> httpx.Response:
        """One attempt: the whole response, or ``UnaryAttemptFailure``/a transport error."""
        request = self._http.build_request(
            "POST",
            attempt.upstream.chat_url,
            content=self._content,
            headers=self._headers(attempt),
            params=self._params,
        )
        async with open_response(self._http, request) as response:
            await response.aread()
        attempt.status_code = response.status_code
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
        if isinstance(usage, dict):
            completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if isinstance(completion, int) and completion >= 0:
                attempt.completion_tokens = completion
            if isinstance(prompt, int) and prompt >= 0:
                attempt.extra["prompt_tokens"] = prompt
            attempt.extra["cached_prompt_tokens"] = cached_prompt_tokens(usage)
        return response

    async def run(self) -> UnaryResult:
        self._t0 = time.monotonic()
        self._started_at = datetime.now(UTC)
        self._budget.deposit()
        self._start_attempt("primary")
        try:
            result = await self._race()
        except HedgeError as exc:
            await self._finish()
            exc.record = self._record
            raise
        except BaseException as exc:
            if self._status is None:
                self._status = "cancelled"
                self._error_type = "caller_cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__
            await self._finish()
            raise
        await self._finish()
        response, attempt = result
        assert self._record is not None, "the record is written before the winner is returned"
        return UnaryResult(
            status_code=response.status_code,
            headers=response.headers,
            content=response.content,
            upstream=attempt.upstream.name,
            hedged=len(self._attempts) > 1,
            record=self._record,
        )

    async def _race(self) -> tuple[httpx.Response, _Attempt]:
        policy = self._policy
        hedge_at = math.inf
        if self._enabled and self._can_add_backup():
            hedge_at = self._attempts[0].start + self._hedge_after_s
        while True:
            alive = {a.task: a for a in self._attempts if a.outcome is None and a.task is not None}
            deadline = min(hedge_at, policy.total_timeout_s)
            remaining = deadline - self._now()
            done: set[asyncio.Task[httpx.Response]] = set()
            if remaining > 0 and alive:
                done, _ = await asyncio.wait(alive, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                if self._now() >= policy.total_timeout_s:
                    self._status, self._error_type = "timeout", "total_timeout"
                    raise TotalTimeout(policy.total_timeout_s)
                hedge_at = math.inf
                if self._can_add_backup():
                    if self._budget.try_withdraw():
                        self._hedge_reason = self._hedge_reason or "ttft_timeout"
                        self._start_attempt("backup")
                    else:
                        self._hedge_denied = True
                continue
            # Several may finish in the same instant: the earliest started wins among successes.
            for task in sorted(done, key=lambda t: self._attempts.index(alive[t])):
                attempt = alive[task]
                at = self._now()
                exc = task.exception()
                if exc is None:
                    attempt.outcome = "won"
                    attempt.end_at = at
                    self._winner = attempt
                    self._prompt_tokens = attempt.extra.get("prompt_tokens")
                    self._status = "ok"
                    return task.result(), attempt
                attempt.outcome = "failed"
                attempt.end_at = at
                attempt.error_type = exc.error_type if isinstance(exc, UnaryAttemptFailure) else type(exc).__name__
                attempt.extra["error"] = exc
            if any(a.outcome is None for a in self._attempts):
                continue
            last = self._attempts[-1]
            last_error = last.extra["error"]
            if isinstance(last_error, UnaryAttemptFailure) and last_error.status_code in NON_RETRYABLE_STATUSES:
                # The caller's fault: answer with the upstream's own response, no failover.
                self._status, self._error_type = "error", last.error_type
                hint = not_found_hint(last.upstream) if last_error.status_code == 404 else None
                if hint:  # the response is the upstream's own: the hint can only be logged
                    log.warning("upstream %r answered HTTP 404: %s", last.upstream.name, hint)
                response = httpx.Response(
                    last_error.status_code, headers=last_error.headers, content=last_error.content
                )
                return response, last
            if self._can_add_backup():
                self._hedge_reason = self._hedge_reason or "primary_error"
                self._start_attempt("backup")
                continue
            self._status, self._error_type = "error", "all_attempts_failed"
            raise AllAttemptsFailed([(a.upstream.name, a.extra["error"]) for a in self._attempts])

    async def _finish(self) -> None:
        """Cancel every attempt still running, wait for it, build and submit the record."""
        end = self._now()
        tasks = []
        for attempt in self._attempts:
            if attempt.outcome is None:
                attempt.outcome = "cancelled"
                attempt.end_at = max(end, attempt.start)
            if attempt.task is not None:
                if not attempt.task.done():
                    attempt.task.cancel()
                tasks.append(attempt.task)
        try:
            # Not gather: a cancellation of the caller would cancel the attempts a second time,
            # which can abort httpcore's close of a connection half-way (see wait_tasks_shielded).
            await wait_tasks_shielded(tasks)
        finally:
            self._build_record()

    def _build_record(self) -> None:
        if self._record is not None:
            return
        winner = self._winner
        attempts = tuple(
            AttemptRecord(
                upstream=a.upstream.name,
                role=a.role,  # type: ignore[arg-type]
                start_s=round(a.start, 6),
                first_token_s=round(a.end_at, 6) if a is winner and a.end_at is not None else None,
                end_s=round(a.end_at if a.end_at is not None else a.start, 6),
                outcome=a.outcome or "cancelled",  # type: ignore[arg-type]
                status_code=a.status_code,
                error_type=a.error_type,
                completion_tokens=a.completion_tokens,
                prompt_tokens=a.extra.get("prompt_tokens"),
                cached_prompt_tokens=a.extra.get("cached_prompt_tokens"),
            )
            for a in self._attempts
        )
        done_s = None if winner is None or winner.end_at is None else round(winner.end_at, 6)
        self._record = CallRecord(
            request_id=self.request_id,
            route=self._route,
            model=self._model,
            started_at=self._started_at,
            client=self._client_tag,
            hedge_after_s=self._hedge_after_s,
            threshold_version=self._version,
            hedged=len(self._attempts) > 1,
            hedge_reason=self._hedge_reason,  # type: ignore[arg-type]
            hedge_denied=self._hedge_denied,
            winner=None if winner is None else winner.role,  # type: ignore[arg-type]
            status=self._status or "cancelled",  # type: ignore[arg-type]
            error_type=self._error_type,
            ttft_s=done_s,
            ttfo_s=done_s,
            e2e_s=done_s,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=None if winner is None else winner.completion_tokens,
            wasted_completion_tokens=0,
            attempts=attempts,
        )
        self._record = with_prompt_estimates(self._record)
        if self._telemetry is not None:
            try:
                self._telemetry.submit(self._record)
            except Exception:  # telemetry must never break a call
                log.exception("telemetry sink refused a record")
