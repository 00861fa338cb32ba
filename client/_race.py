"""The race of one hedged call as a sans-IO state machine: no sockets, no tasks, no clock.

Every front end (chat and Responses streaming in ``hedgerow.client.hedging``, whole responses in
``hedgerow.client.unary``, sync calls through the transport's portal, and the virtual-time
simulation ``hedgerow.sim.virtual``) drives one ``Race`` per call. The front end owns the I/O: it sends
attempts, reads their bodies, keeps the clock and the tasks. It tells the race what happened,
with the time it happened (seconds since the call began, any monotonic origin):

=======================  ============================================================
input                    meaning
=======================  ============================================================
``begin(now)``           the call starts: deposit into the hedge budget, start the primary
``sent(a, now)``         attempt ``a``'s request went out (TTFT and the hedge timer count
                         from the primary's send)
``response(a, status)``  ``a``'s response headers arrived with that HTTP status
``chunk(a, info, now)``  ``a`` delivered one parsed chunk (``ChunkKind`` of it)
``completed(a, ...)``    ``a`` delivered a whole answer at once (non-streaming calls)
``failed(a, exc, now)``  ``a`` failed (``caller_fault``: the caller's fault, e.g. HTTP 401;
                         ``cut``: its connection broke)
``ended(a, now)``        ``a``'s stream ended cleanly (``[DONE]`` or the end of the body)
``tick(now)``            the clock reached ``deadline`` (hedge timer, total timeout, stall)
``abandon(now, why)``    the caller left, or the call is being closed
=======================  ============================================================

Each input returns a tuple of *actions* for the front end, in order: ``Start(a)`` (send attempt
``a``), ``Cancel(a)`` (stop reading ``a`` and close it), ``Won(a)`` (``a`` is the winner: hand its
chunks to the caller), ``Raise(exc)`` (the call failed: raise ``exc``; for ``caller_fault``
failures ``exc`` is the error the front end passed in), ``Done()`` (the answer is complete). The
common input, a chunk of the winner after its first token, returns the empty tuple without
allocating. ``deadline`` is the next time (same clock) at which ``tick`` must be called
(``math.inf``: none).

The race owns the decisions and the bookkeeping of the failure-mode table of
``hedgerow.client.hedging``: the hedge timer and the hedge budget (``HedgeBudget``), failover and
the failover budget (``FailoverBudget``), ``max_backups``, the winner and the loser's cancellation,
truncation, the stall and total timeouts, the status and ``error_type`` of the call, and the one
``CallRecord`` (``record()``). Decisions, in the order they are checked:

1. Before a winner, the first chunk carrying a token (of any kind) makes its attempt the winner;
   every other running attempt is cancelled. Chunks without a token are remembered (their usage
   and finished choices): an attempt whose stream ends with all ``n`` choices finished and no
   token is a winner with an empty answer.
2. A failure before the first token ends that attempt. If it was the caller's fault and nothing
   else runs, the call fails with that error. If another attempt still runs, nothing more
   happens. Otherwise a backup is started (failover, ``hedge_reason`` ``primary_error``) when
   ``max_backups`` and the upstreams allow and the failover budget has tokens; else the call fails
   with ``AllAttemptsFailed`` (every attempt's error). A stream that ends before any token is a
   failure ``empty_stream``.
3. ``hedge_after_s`` after the primary's send, without a winner, one backup is started if
   ``max_backups`` and the upstreams allow and the hedge budget grants a token (``ttft_timeout``);
   a refusal sets ``hedge_denied``.
4. After the first token, the winner's failure fails the call (``StreamError``; a broken
   connection is ``truncated``), except a broken connection once every choice has finished
   (the answer is complete). A clean end before every choice finished is ``truncated`` too.
   A gap since the last token over ``stall_timeout_s`` while unfinished is ``StallTimeout``.
5. ``total_timeout_s`` after the call began: ``TotalTimeout`` (status ``timeout``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from hedgerow.client.budget import FailoverBudget, HedgeBudget
from hedgerow.client.chunks import ChunkKind, cached_prompt_tokens
from hedgerow.client.errors import (
    AllAttemptsFailed,
    AttemptError,
    StallTimeout,
    StreamError,
    TotalTimeout,
    UpstreamError,
)
from hedgerow.client.records import (
    AttemptOutcome,
    AttemptRecord,
    AttemptRole,
    CallApi,
    CallRecord,
    CallStatus,
    HedgeReason,
    with_prompt_estimates,
)

__all__ = ["Action", "AttemptState", "Cancel", "Done", "Race", "Raise", "Start", "Won", "error_type_of"]

NO_ACTIONS: Final[tuple[()]] = ()


@dataclass(eq=False, slots=True)
class AttemptState:
    """What the race knows of one attempt.

    Attributes:
        index: position in the call's upstream order (0 = primary); the front end maps it to
            its upstream. role: ``primary`` or ``backup``; header_role: ``primary``, ``backup``,
            ``backup2``, ... (the ``X-Hedgerow-Attempt`` value). upstream: the upstream's name.
        start: the send time (the creation time until ``sent``); first_token_at, end_at: times
            or None. outcome: None while running, else ``won``/``cancelled``/``failed``.
        error, error_type: the failure, if any. status_code: the HTTP status, if any.
        token_chunks: chunks that carried a token; usage_*: from the attempt's usage object.
        finished: choice indices that finished before the attempt won.
    """

    index: int
    role: AttemptRole
    header_role: str
    upstream: str
    start: float
    sent: bool = False
    status_code: int | None = None
    first_token_at: float | None = None
    end_at: float | None = None
    outcome: AttemptOutcome | None = None
    error: BaseException | None = None
    error_type: str | None = None
    token_chunks: int = 0
    usage_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_cached_prompt_tokens: int | None = None
    finished: frozenset[int] = frozenset()

    @property
    def alive(self) -> bool:
        """True while the attempt runs (no outcome yet)."""
        return self.outcome is None

    def tokens(self) -> int:
        """Completion tokens: the usage object's count when reported, else the token chunks."""
        return self.usage_tokens if self.usage_tokens is not None else self.token_chunks


@dataclass(frozen=True, slots=True)
class Start:
    """Send ``attempt``'s request."""

    attempt: AttemptState


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop ``attempt`` and close its response and connection."""

    attempt: AttemptState


@dataclass(frozen=True, slots=True)
class Won:
    """``attempt`` won: its chunks (those held back before its first token included) go to the caller."""

    attempt: AttemptState


@dataclass(frozen=True, slots=True)
class Raise:
    """The call failed with ``error`` (a ``HedgeError``, or the front end's own caller-fault error)."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Done:
    """The answer is complete (status ``ok``)."""


Action = Start | Cancel | Won | Raise | Done


def error_type_of(exc: BaseException) -> str:
    """The short machine name of an attempt's failure, as stored in records.

    ``error_type`` attribute of the error when it has one (``AttemptError`` and the front ends'
    failures), ``http_<status>`` for ``UpstreamError``, else the exception's class name
    (``ConnectError``, ``ReadTimeout``).
    """
    if isinstance(exc, UpstreamError):
        return f"http_{exc.status_code}"
    named = getattr(exc, "error_type", None)
    return named if isinstance(named, str) else type(exc).__name__


class Race:
    """The state machine of one hedged call (see the module docstring for inputs and actions).

    Args:
        upstreams: the upstream names in call order (first = primary); at least one.
        hedge_after_s: seconds after the primary's send before a hedge is considered (>= 0).
        hedging_enabled: False disables the hedge timer (failover still happens).
        max_backups: most backups (hedges and failovers together) per call, >= 0.
        total_timeout_s: seconds after the call began at which it gives up (``math.inf``: never).
        stall_timeout_s: longest gap after the first token, seconds, or None (no limit).
        budget: the hedge budget, shared by the client's calls; one deposit per call.
        failover_budget: the failover retry budget, shared by the client's calls.
        choices: the ``n`` of the request (every choice must finish for a complete answer).
        streaming: False for whole-response calls (no TPOT, no ITL in the record).
        api: the record's ``api`` (``chat`` or ``responses``).
        request_id, route, model, started_at, client, threshold_version: copied into the record.

    Raises:
        ValueError: for an empty ``upstreams`` or a negative ``hedge_after_s``/``max_backups``.
    """

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        hedge_after_s: float,
        hedging_enabled: bool,
        max_backups: int,
        total_timeout_s: float,
        stall_timeout_s: float | None,
        budget: HedgeBudget,
        failover_budget: FailoverBudget,
        request_id: str,
        route: str,
        model: str,
        started_at: datetime,
        client: str | None = None,
        threshold_version: int | None = None,
        choices: int = 1,
        streaming: bool = True,
        api: CallApi = "chat",
    ) -> None:
        if not upstreams:
            raise ValueError("Race.upstreams: at least one upstream name is required")
        if not hedge_after_s >= 0:
            raise ValueError(f"Race.hedge_after_s: must be >= 0, got {hedge_after_s!r}")
        if max_backups < 0:
            raise ValueError(f"Race.max_backups: must be >= 0, got {max_backups!r}")
        self._names = list(upstreams)
        self.hedge_after_s = hedge_after_s
        self._max_backups = max_backups
        self.total_timeout_s = total_timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._budget = budget
        self._failover_budget = failover_budget
        self._choices = max(1, choices)
        self._streaming = streaming
        self._api: CallApi = api
        self.request_id = request_id
        self._route = route
        self._model = model
        self.started_at = started_at
        self._client = client
        self._threshold_version = threshold_version
        self.attempts: list[AttemptState] = []
        self.winner: AttemptState | None = None
        self.status: CallStatus | None = None
        self.error_type: str | None = None
        self.hedge_reason: HedgeReason | None = None
        self.hedge_denied = False
        self.failover_denied = False
        self._hedge_pending = hedging_enabled
        self._finished_choices: set[int] = set()
        self.complete = False  # every choice of the winner finished
        self.finish_reason: str | None = None
        self._answer_at: float | None = None
        self.last_token_at: float | None = None
        self.max_itl_s: float | None = None
        self._prompt_tokens: int | None = None
        self._record: CallRecord | None = None

    # -- state ---------------------------------------------------------------------------------

    @property
    def hedged(self) -> bool:
        """True once a backup (hedge or failover) was started."""
        return len(self.attempts) > 1

    @property
    def over(self) -> bool:
        """True once the call's status is decided."""
        return self.status is not None

    @property
    def deadline(self) -> float:
        """The next time at which ``tick`` must be called (``math.inf``: only when events come)."""
        if self.status is not None:
            return math.inf
        deadline = self.total_timeout_s
        if self.winner is None:
            if self._hedge_pending and self.attempts:
                deadline = min(deadline, self.attempts[0].start + self.hedge_after_s)
        elif self._stall_timeout_s is not None and self.last_token_at is not None and not self.complete:
            deadline = min(deadline, self.last_token_at + self._stall_timeout_s)
        return deadline

    def _can_add_backup(self) -> bool:
        count = len(self.attempts)
        return count - 1 < self._max_backups and count < len(self._names)

    def _start(self, role: AttemptRole, now: float) -> Start:
        index = len(self.attempts)
        header_role = role if index < 2 else f"{role}{index}"
        attempt = AttemptState(index, role, header_role, self._names[index], now)
        self.attempts.append(attempt)
        return Start(attempt)

    def _set_status(self, status: CallStatus, error_type: str | None) -> None:
        if self.status is None:
            self.status = status
            self.error_type = error_type

    def _cancel_others(self, keep: AttemptState, now: float) -> list[Action]:
        cancels: list[Action] = []
        for other in self.attempts:
            if other is not keep and other.alive:
                other.outcome = "cancelled"
                other.end_at = max(now, other.start)  # a loser never ends before it began
                cancels.append(Cancel(other))
        return cancels

    # -- inputs --------------------------------------------------------------------------------

    def begin(self, now: float) -> tuple[Action, ...]:
        """The call starts at ``now``: one deposit into the hedge budget, the primary started.

        Returns ``(Start(primary),)``. Raises RuntimeError when called twice.
        """
        if self.attempts:
            raise RuntimeError("Race.begin: the call has already begun")
        self._budget.deposit()
        self._hedge_pending = self._hedge_pending and self._can_add_backup()
        return (self._start("primary", now),)

    def sent(self, attempt: AttemptState, now: float) -> None:
        """``attempt``'s request was sent at ``now`` (its start; the hedge timer counts from the primary's)."""
        attempt.start = now
        attempt.sent = True

    def response(self, attempt: AttemptState, status_code: int) -> None:
        """``attempt``'s response headers arrived with ``status_code``."""
        attempt.status_code = status_code

    def chunk(self, attempt: AttemptState, info: ChunkKind, now: float) -> tuple[Action, ...]:
        """``attempt`` delivered one chunk at ``now``, classified as ``info``.

        Returns ``()`` for the winner's chunks after its first token (the hot path) and for
        chunks without a token; ``(Won(attempt), Cancel(other)...)`` for the first token.
        """
        if attempt is self.winner:
            self.winner_chunk(attempt, info, now)
            return NO_ACTIONS
        if not attempt.alive:
            if attempt.outcome == "cancelled":  # tokens it sent before its cancellation took effect
                if info.token:
                    attempt.token_chunks += 1
                if info.usage is not None:
                    self._note_usage(attempt, info.usage)
            return NO_ACTIONS
        if self.winner is not None or self.status is not None:
            return NO_ACTIONS
        if not info.token:
            if info.usage is not None:
                self._note_usage(attempt, info.usage)
            if info.finished:
                attempt.finished = attempt.finished.union(info.finished)
            return NO_ACTIONS
        self._win(attempt)
        actions: list[Action] = [Won(attempt), *self._cancel_others(attempt, now)]
        if attempt.finished:
            self._finished_choices.update(attempt.finished)
        self.winner_chunk(attempt, info, now)
        return tuple(actions)

    def completed(self, attempt: AttemptState, now: float, usage: dict[str, Any] | None = None) -> tuple[Action, ...]:
        """``attempt`` delivered its whole answer at ``now`` (a non-streaming response).

        Returns ``(Won(attempt), Cancel(other)..., Done())``, or ``()`` when the call already
        has a winner or an outcome (the answer is dropped).
        """
        if not attempt.alive or self.winner is not None or self.status is not None:
            return NO_ACTIONS
        self._win(attempt)
        actions: list[Action] = [Won(attempt), *self._cancel_others(attempt, now)]
        if usage is not None:
            self._note_usage(attempt, usage)
        attempt.first_token_at = attempt.end_at = now
        self._answer_at = self.last_token_at = now
        self.complete = True
        self._set_status("ok", None)
        actions.append(Done())
        return tuple(actions)

    def failed(
        self, attempt: AttemptState, error: BaseException, now: float, *, caller_fault: bool = False, cut: bool = False
    ) -> tuple[Action, ...]:
        """``attempt`` failed at ``now`` with ``error``.

        Args:
            caller_fault: the failure is the caller's (HTTP 400/401/403/404/422): no failover;
                the call fails with ``error`` itself when nothing else runs.
            cut: the connection broke (a transport error while reading); after every choice
                finished that still is a complete answer.

        Returns:
            The actions (see the module docstring, rules 2 and 4); ``()`` for an attempt that
            already ended.
        """
        if attempt is self.winner:
            if self.status is not None:
                return NO_ACTIONS
            attempt.end_at = now
            if cut and self.complete:  # cut after the finish: only a trailing usage chunk is missing
                self._set_status("ok", None)
                return (Done(),)
            attempt.error = error
            kind = "truncated" if cut else error_type_of(error)
            attempt.error_type = kind
            self._set_status("error", kind)
            detail = str(error)[:200] or type(error).__name__
            return (Raise(StreamError(attempt.upstream, kind, detail)),)
        if not attempt.alive or self.status is not None:
            return NO_ACTIONS
        attempt.outcome = "failed"
        attempt.end_at = now
        attempt.error = error
        attempt.error_type = error_type_of(error)
        if caller_fault:
            if any(a.alive for a in self.attempts):
                return NO_ACTIONS  # e.g. a hedge's backup answering 401 while the primary runs
            self._set_status("error", attempt.error_type)
            return (Raise(error),)
        self._failover_budget.record_failure()
        if any(a.alive for a in self.attempts):
            return NO_ACTIONS
        if self._can_add_backup():
            if self._failover_budget.allows_failover():
                if self.hedge_reason is None:
                    self.hedge_reason = "primary_error"
                return (self._start("backup", now),)
            self.failover_denied = True  # upstreams are failing: no retry storm
        errors = [(a.upstream, a.error) for a in self.attempts if a.error is not None]
        self._set_status("error", "all_attempts_failed")
        return (Raise(AllAttemptsFailed(errors)),)

    def ended(self, attempt: AttemptState, now: float) -> tuple[Action, ...]:
        """``attempt``'s stream ended cleanly at ``now`` (``[DONE]`` or the end of its body)."""
        if attempt is self.winner:
            if self.status is not None:
                return NO_ACTIONS
            attempt.end_at = now
            if not self.complete:
                attempt.error_type = "truncated"
                self._set_status("error", "truncated")
                detail = "stream ended before every choice had a finish_reason"
                return (Raise(StreamError(attempt.upstream, "truncated", detail)),)
            self._set_status("ok", None)
            return (Done(),)
        if not attempt.alive or self.status is not None:
            return NO_ACTIONS
        if len(attempt.finished) >= self._choices:
            # A complete answer without a single token (an empty completion).
            self._win(attempt)
            actions: list[Action] = [Won(attempt), *self._cancel_others(attempt, now)]
            attempt.end_at = now
            self._finished_choices.update(attempt.finished)
            self.complete = True
            self._set_status("ok", None)
            actions.append(Done())
            return tuple(actions)
        return self.failed(attempt, AttemptError("empty_stream", "stream ended before any token"), now)

    def tick(self, now: float) -> tuple[Action, ...]:
        """The clock reached ``now`` (at or after ``deadline``): timeouts and the hedge timer."""
        if self.status is not None:
            return NO_ACTIONS
        winner = self.winner
        if now >= self.total_timeout_s:
            if winner is not None:
                self._note_gap(now)
                winner.error_type = "total_timeout"
                winner.end_at = now
            self._set_status("timeout", "total_timeout")
            return (Raise(TotalTimeout(self.total_timeout_s)),)
        if winner is not None:
            stall = self._stall_timeout_s
            last = self.last_token_at
            if stall is not None and last is not None and not self.complete and now >= last + stall:
                self._note_gap(now)
                winner.error_type = "stall_timeout"
                winner.end_at = now
                self._set_status("stalled", "stall_timeout")
                return (Raise(StallTimeout(winner.upstream, now - last)),)
            return NO_ACTIONS
        primary = self.attempts[0] if self.attempts else None
        if not self._hedge_pending or primary is None or not primary.sent:
            return NO_ACTIONS
        if now < primary.start + self.hedge_after_s:
            return NO_ACTIONS
        self._hedge_pending = False
        if not self._can_add_backup():
            return NO_ACTIONS
        if not self._budget.try_withdraw():
            self.hedge_denied = True
            return NO_ACTIONS
        if self.hedge_reason is None:
            self.hedge_reason = "ttft_timeout"
        return (self._start("backup", now),)

    def abandon(self, now: float, error_type: str = "caller_cancelled") -> tuple[Action, ...]:
        """The caller left (or the call is closed) at ``now``: every running attempt is cancelled.

        Sets status ``cancelled`` with ``error_type`` unless the call already had an outcome.
        Returns a ``Cancel`` for each attempt that was still running.
        """
        self._set_status("cancelled", error_type)
        cancels: list[Action] = []
        for attempt in self.attempts:
            if attempt.alive:
                attempt.outcome = "cancelled"
                attempt.end_at = max(now, attempt.start)
                cancels.append(Cancel(attempt))
            elif attempt is self.winner and attempt.end_at is None:
                attempt.end_at = now
        return tuple(cancels)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _win(self, attempt: AttemptState) -> None:
        self.winner = attempt
        attempt.outcome = "won"
        self._failover_budget.record_success()

    def winner_chunk(self, winner: AttemptState, info: ChunkKind, now: float) -> None:
        """The winner ``winner`` delivered one more chunk after its first token, at ``now``.

        The same as ``chunk(winner, info, now)`` for the winner (which always returns no action),
        without its dispatch: the front ends call it once per streamed chunk. Counts the token,
        the answer time, the inter-token gap, usage and finished choices.
        """
        if info.usage is not None:
            self._note_usage(winner, info.usage)
        if info.finished:
            self._finished_choices.update(info.finished)
            if len(self._finished_choices) >= self._choices:
                self.complete = True
                self.finish_reason = info.finish_reason
        if not info.token:
            return
        winner.token_chunks += 1
        if winner.first_token_at is None:
            winner.first_token_at = now
        if info.answer and self._answer_at is None:
            self._answer_at = now
        last = self.last_token_at
        if last is not None:
            gap = now - last
            if self.max_itl_s is None or gap > self.max_itl_s:
                self.max_itl_s = gap
        self.last_token_at = now

    def _note_gap(self, now: float) -> None:
        """The gap from the last token to giving up counts as an inter-token gap (the stall)."""
        if self.last_token_at is not None and not self.complete:
            gap = now - self.last_token_at
            self.max_itl_s = gap if self.max_itl_s is None else max(self.max_itl_s, gap)

    def _note_usage(self, attempt: AttemptState, usage: dict[str, Any]) -> None:
        completion = usage.get("completion_tokens")
        if isinstance(completion, int) and completion >= 0:
            attempt.usage_tokens = completion
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int) and prompt >= 0:
            attempt.usage_prompt_tokens = prompt
            if attempt is self.winner:
                self._prompt_tokens = prompt
        attempt.usage_cached_prompt_tokens = cached_prompt_tokens(usage)

    def record(self) -> CallRecord:
        """The call's one ``CallRecord`` (built on the first call, the same object after).

        Latencies count from the primary's send (docs/DESIGN.md "TTFT"); ``tpot_s`` is
        ``(e2e − ttft) / (completion_tokens − 1)`` for streamed calls with more than one token.
        A call without an outcome yet is recorded as ``cancelled``.
        """
        if self._record is not None:
            return self._record
        winner = self.winner
        if winner is not None and self._prompt_tokens is None:
            self._prompt_tokens = winner.usage_prompt_tokens
        attempts = tuple(
            AttemptRecord(
                upstream=a.upstream,
                role=a.role,
                start_s=round(a.start, 6),
                first_token_s=None if a.first_token_at is None else round(a.first_token_at, 6),
                end_s=round(a.end_at if a.end_at is not None else a.start, 6),
                outcome=a.outcome or "cancelled",
                status_code=a.status_code,
                error_type=a.error_type,
                completion_tokens=a.tokens(),
                prompt_tokens=a.usage_prompt_tokens,
                cached_prompt_tokens=a.usage_cached_prompt_tokens,
            )
            for a in self.attempts
        )
        sent = self.attempts[0].start if self.attempts else 0.0
        ttft = _since(winner.first_token_at, sent) if winner is not None else None
        ttfo = _since(self._answer_at, sent)
        e2e = _since(self.last_token_at, sent)
        completion = winner.tokens() if winner is not None else None
        tpot = None
        if self._streaming and ttft is not None and e2e is not None and completion is not None and completion > 1:
            tpot = (e2e - ttft) / (completion - 1)
        record = CallRecord(
            request_id=self.request_id,
            route=self._route,
            model=self._model,
            started_at=self.started_at,
            client=self._client,
            hedge_after_s=self.hedge_after_s,
            threshold_version=self._threshold_version,
            hedged=self.hedged,
            hedge_reason=self.hedge_reason,
            hedge_denied=self.hedge_denied,
            failover_denied=self.failover_denied,
            winner=None if winner is None else winner.role,
            status=self.status or "cancelled",
            error_type=self.error_type if self.status is not None else "caller_cancelled",
            ttft_s=_round(ttft),
            ttfo_s=_round(ttfo),
            tpot_s=_round(tpot),
            e2e_s=_round(e2e),
            max_itl_s=_round(self.max_itl_s) if self._streaming else None,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=completion,
            wasted_completion_tokens=sum(a.tokens() for a in self.attempts if a is not winner),
            attempts=attempts,
            api=self._api,
        )
        self._record = with_prompt_estimates(record)
        return self._record


def _since(at: float | None, origin: float) -> float | None:
    """``at - origin`` (never negative), or None when ``at`` is None."""
    return None if at is None else max(0.0, at - origin)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
