"""The race core (``hedgerow.client._race``) on a fake clock: one table row per failure mode.

No sockets, no tasks, no sleeps. A ``FakeCall`` drives a ``Race`` the way the front ends do:
every ``Start`` is sent at once, and before each scripted input at time ``t`` the clock is
advanced to ``t``, firing ``tick`` at every ``deadline`` on the way (so a row also checks that the
race asks for its ticks at the right times). Each row lists the inputs, the actions the race must
answer with (``"<time> <action> <role>"``) and what the record must say. The rows follow the
failure-mode table of ``hedgerow.client.hedging`` (and the stream-shape rules of
``hedgerow.client.chunks`` that decide a call's outcome).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from hedgerow.client import (
    AllAttemptsFailed,
    AttemptError,
    EventTooLarge,
    FailoverBudget,
    HedgeBudget,
    StallTimeout,
    StreamError,
    TotalTimeout,
    UpstreamError,
    classify_chunk,
)
from hedgerow.client._race import Cancel, Done, Race, Raise, Start, Won
from tests.client.scripted_server import chunk, usage_chunk

ROLE = chunk(role="assistant", content="")
TOKEN = chunk("hi")
FINISH = chunk(finish="stop")
EMPTY_FINISH = chunk(" there", finish="")
USAGE = usage_chunk(7, 3)
THINKING = chunk(content=[{"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]}])
TEXT_PART = chunk(content=[{"type": "text", "text": "Hi"}])


def choice(index: int, content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    """A chunk of choice ``index`` (n > 1 streams)."""
    data = chunk(content, finish=finish)
    data["choices"][0]["index"] = index
    return data


@dataclass
class FakeCall:
    """Drives a ``Race`` on a fake clock and logs its actions as ``"<t> <action> <role>"``."""

    race: Race
    now: float = 0.0
    log: list[str] = field(default_factory=list)
    raised: BaseException | None = None

    def apply(self, actions: tuple[Any, ...]) -> None:
        for action in actions:
            if isinstance(action, Start):
                self.log.append(f"{self.now:g} start {action.attempt.header_role}")
                self.race.sent(action.attempt, self.now)
            elif isinstance(action, Cancel):
                self.log.append(f"{self.now:g} cancel {action.attempt.header_role}")
            elif isinstance(action, Won):
                self.log.append(f"{self.now:g} won {action.attempt.header_role}")
            elif isinstance(action, Done):
                self.log.append(f"{self.now:g} done")
            elif isinstance(action, Raise):
                self.log.append(f"{self.now:g} raise {type(action.error).__name__}")
                self.raised = action.error

    def advance(self, to: float) -> None:
        """Move the clock to ``to``, ticking at every deadline reached on the way."""
        while self.race.deadline <= to:
            self.now = self.race.deadline
            self.apply(self.race.tick(self.now))
        self.now = to

    def step(self, at: float, op: str, index: int = 0, payload: Any = None) -> None:
        self.advance(at)
        if op == "advance":
            return
        state = self.race.attempts[index]
        if op == "chunk":
            self.apply(self.race.chunk(state, classify_chunk(payload), at))
        elif op == "status":
            self.race.response(state, payload)
        elif op == "fail":
            self.apply(self.race.failed(state, payload, at))
        elif op == "cut":
            self.apply(self.race.failed(state, payload or httpx.RemoteProtocolError("peer closed"), at, cut=True))
        elif op == "caller_fault":
            self.apply(self.race.failed(state, payload, at, caller_fault=True))
        elif op == "end":
            self.apply(self.race.ended(state, at))
        elif op == "complete":
            self.apply(self.race.completed(state, at, payload))
        elif op == "abandon":
            self.apply(self.race.abandon(at))
        else:
            raise AssertionError(f"unknown op {op!r}")


def make_race(
    upstreams: int = 2,
    *,
    hedge_after_s: float = 1.0,
    max_backups: int = 1,
    total_timeout_s: float = 30.0,
    stall_timeout_s: float | None = 5.0,
    budget: HedgeBudget | None = None,
    failover_budget: FailoverBudget | None = None,
    choices: int = 1,
    streaming: bool = True,
    hedging_enabled: bool = True,
) -> Race:
    return Race(
        [f"u{i}" for i in range(upstreams)],
        hedge_after_s=hedge_after_s,
        hedging_enabled=hedging_enabled,
        max_backups=max_backups,
        total_timeout_s=total_timeout_s,
        stall_timeout_s=stall_timeout_s,
        budget=budget or HedgeBudget(0.1, 10),
        failover_budget=failover_budget or FailoverBudget(),
        request_id="r1",
        route="route",
        model="m",
        started_at=datetime(2026, 12, 1, tzinfo=UTC),
        choices=choices,
        streaming=streaming,
    )


@dataclass(frozen=True)
class Row:
    """One failure mode: the race's settings, the inputs, and the expected actions and record."""

    name: str
    steps: tuple[tuple[Any, ...], ...]
    log: tuple[str, ...]
    status: str
    error_type: str | None = None
    raises: type[BaseException] | None = None
    attempts: tuple[tuple[str, str, str | None], ...] = ()  # (role, outcome, error_type)
    hedge_reason: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # further record fields to check


REFUSED = httpx.ConnectError("[Errno 111] Connection refused")
HTTP_503 = AttemptError("http_503", "HTTP 503: busy")

# A backup that answers at once after the primary failed: token, finish, end.
BACKUP_ANSWERS = ((0.3, "chunk", 1, TOKEN), (0.4, "chunk", 1, FINISH), (0.5, "end", 1))

ROWS = (
    Row(
        "connection refused: failover at once",
        ((0.01, "fail", 0, REFUSED), *BACKUP_ANSWERS),
        ("0 start primary", "0.01 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "ConnectError"), ("backup", "won", None)),
        hedge_reason="primary_error",
        record={"ttft_s": 0.3, "winner": "backup"},
    ),
    Row(
        "connect timeout: failover at once",
        ((0.2, "fail", 0, httpx.ConnectTimeout("timed out")), *BACKUP_ANSWERS),
        ("0 start primary", "0.2 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "ConnectTimeout"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "no first token by hedge_after_s: hedge, the first token wins and cancels the other",
        ((1.2, "chunk", 1, TOKEN), (1.3, "chunk", 0, TOKEN), (1.4, "chunk", 1, FINISH), (1.5, "end", 1)),
        ("0 start primary", "1 start backup", "1.2 won backup", "1.2 cancel primary", "1.5 done"),
        status="ok",
        attempts=(("primary", "cancelled", None), ("backup", "won", None)),
        hedge_reason="ttft_timeout",
        # the primary's token after its cancellation counts as wasted
        record={"ttft_s": 1.2, "wasted_completion_tokens": 1, "hedged": True},
    ),
    Row(
        "no first token by hedge_after_s, budget empty: hedge denied",
        ((2.0, "chunk", 0, TOKEN), (2.1, "chunk", 0, FINISH), (2.2, "end", 0)),
        ("0 start primary", "2 won primary", "2.2 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        settings={"budget": HedgeBudget(0.1, 0)},
        record={"hedge_denied": True, "hedged": False, "ttft_s": 2.0},
    ),
    Row(
        "hedging disabled by the threshold: no hedge timer",
        ((2.0, "chunk", 0, TOKEN), (2.1, "chunk", 0, FINISH), (2.2, "end", 0)),
        ("0 start primary", "2 won primary", "2.2 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        settings={"hedging_enabled": False},
        record={"hedge_denied": False, "hedged": False},
    ),
    Row(
        "no first token by total_timeout_s: TotalTimeout",
        ((9.0, "advance"),),
        ("0 start primary", "1 start backup", "4 raise TotalTimeout"),
        status="timeout",
        error_type="total_timeout",
        raises=TotalTimeout,
        attempts=(("primary", "cancelled", None), ("backup", "cancelled", None)),
        hedge_reason="ttft_timeout",
        settings={"total_timeout_s": 4.0},
    ),
    Row(
        "HTTP 503: failover at once",
        ((0.1, "status", 0, 503), (0.1, "fail", 0, HTTP_503), *BACKUP_ANSWERS),
        ("0 start primary", "0.1 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "http_503"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "HTTP 401: UpstreamError, no failover",
        ((0.1, "caller_fault", 0, UpstreamError("u0", 401, "bad key")),),
        ("0 start primary", "0.1 raise UpstreamError"),
        status="error",
        error_type="http_401",
        raises=UpstreamError,
        attempts=(("primary", "failed", "http_401"),),
    ),
    Row(
        "HTTP 401 from the hedge's backup while the primary runs: the primary completes the call",
        (
            (1.1, "caller_fault", 1, UpstreamError("u1", 401, "bad key")),
            (1.5, "chunk", 0, TOKEN),
            (1.6, "chunk", 0, FINISH),
            (1.7, "end", 0),
        ),
        ("0 start primary", "1 start backup", "1.5 won primary", "1.7 done"),
        status="ok",
        attempts=(("primary", "won", None), ("backup", "failed", "http_401")),
        hedge_reason="ttft_timeout",
    ),
    Row(
        "HTTP 200 with a body that is not SSE: failover (malformed_stream)",
        ((0.1, "fail", 0, AttemptError("malformed_stream", "body is not SSE")), *BACKUP_ANSWERS),
        ("0 start primary", "0.1 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "malformed_stream"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "SSE error before the first token: failover (sse_error)",
        ((0.1, "chunk", 0, ROLE), (0.2, "fail", 0, AttemptError("sse_error", "overloaded")), *BACKUP_ANSWERS),
        ("0 start primary", "0.2 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "sse_error"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "SSE error after the first token: StreamError",
        ((0.1, "chunk", 0, TOKEN), (0.2, "fail", 0, AttemptError("sse_error", "overloaded"))),
        ("0 start primary", "0.1 won primary", "0.2 raise StreamError"),
        status="error",
        error_type="sse_error",
        raises=StreamError,
        attempts=(("primary", "won", "sse_error"),),
    ),
    Row(
        "stream ends before any token (a role-only chunk, then [DONE]): failover (empty_stream)",
        ((0.1, "chunk", 0, ROLE), (0.15, "end", 0), *BACKUP_ANSWERS),
        ("0 start primary", "0.15 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "empty_stream"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "an empty completion (finish_reason, no token): the answer, status ok",
        ((0.1, "chunk", 0, ROLE), (0.2, "chunk", 0, FINISH), (0.3, "end", 0)),
        ("0 start primary", "0.3 won primary", "0.3 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        record={"ttft_s": None, "completion_tokens": 0},
    ),
    Row(
        "connection cut after tokens without a finish_reason: StreamError (truncated)",
        ((0.1, "chunk", 0, TOKEN), (0.2, "cut", 0)),
        ("0 start primary", "0.1 won primary", "0.2 raise StreamError"),
        status="error",
        error_type="truncated",
        raises=StreamError,
        attempts=(("primary", "won", "truncated"),),
    ),
    Row(
        "connection cut after the finish_reason: the answer is complete",
        ((0.1, "chunk", 0, TOKEN), (0.2, "chunk", 0, FINISH), (0.3, "cut", 0)),
        ("0 start primary", "0.1 won primary", "0.3 done"),
        status="ok",
        attempts=(("primary", "won", None),),
    ),
    Row(
        'finish_reason "" is not a finish: a clean end after it is truncated',
        ((0.1, "chunk", 0, TOKEN), (0.2, "chunk", 0, EMPTY_FINISH), (0.3, "end", 0)),
        ("0 start primary", "0.1 won primary", "0.3 raise StreamError"),
        status="error",
        error_type="truncated",
        raises=StreamError,
        attempts=(("primary", "won", "truncated"),),
        record={"completion_tokens": 2},
    ),
    Row(
        'finish_reason "" is not a finish: a gap after it is a stall',
        ((0.1, "chunk", 0, TOKEN), (0.2, "chunk", 0, EMPTY_FINISH), (9.0, "advance")),
        ("0 start primary", "0.1 won primary", "1.2 raise StallTimeout"),
        status="stalled",
        error_type="stall_timeout",
        raises=StallTimeout,
        attempts=(("primary", "won", "stall_timeout"),),
        settings={"stall_timeout_s": 1.0},
        record={"max_itl_s": 1.0},
    ),
    Row(
        "n = 2: one choice finished and the stream ends: truncated",
        (
            (0.1, "chunk", 0, choice(0, "a")),
            (0.2, "chunk", 0, choice(1, "b")),
            (0.3, "chunk", 0, choice(0, finish="stop")),
            (0.4, "end", 0),
        ),
        ("0 start primary", "0.1 won primary", "0.4 raise StreamError"),
        status="error",
        error_type="truncated",
        raises=StreamError,
        attempts=(("primary", "won", "truncated"),),
        settings={"choices": 2},
    ),
    Row(
        "n = 2: both choices finished: ok, and no stall after the last finish",
        (
            (0.1, "chunk", 0, choice(0, "a")),
            (0.2, "chunk", 0, choice(1, "b")),
            (0.3, "chunk", 0, choice(0, finish="stop")),
            (0.4, "chunk", 0, choice(1, finish="length")),
            (9.0, "end", 0),
        ),
        ("0 start primary", "0.1 won primary", "9 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        settings={"choices": 2, "stall_timeout_s": 1.0},
    ),
    Row(
        "thinking parts are tokens (TTFT), a text part the first answer token (TTFO)",
        ((0.4, "chunk", 0, THINKING), (0.9, "chunk", 0, TEXT_PART), (1.0, "chunk", 0, FINISH), (1.1, "end", 0)),
        ("0 start primary", "0.4 won primary", "1.1 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        record={"ttft_s": 0.4, "ttfo_s": 0.9, "completion_tokens": 2},
    ),
    Row(
        "usage inside choices[0]: token counts from there",
        (
            (0.1, "chunk", 0, TOKEN),
            (0.2, "chunk", 0, {**FINISH, "choices": [{**FINISH["choices"][0], "usage": USAGE["usage"]}]}),
            (0.3, "end", 0),
        ),
        ("0 start primary", "0.1 won primary", "0.3 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        record={"prompt_tokens": 7, "completion_tokens": 3},
    ),
    Row(
        "a whitespace-only first content is a token",
        ((0.2, "chunk", 0, chunk("\n")), (0.3, "chunk", 0, FINISH), (0.4, "end", 0)),
        ("0 start primary", "0.2 won primary", "0.4 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        record={"ttft_s": 0.2},
    ),
    Row(
        "gap after the first token longer than stall_timeout_s: StallTimeout",
        ((0.5, "chunk", 0, TOKEN), (0.7, "chunk", 0, TOKEN), (9.0, "advance")),
        ("0 start primary", "0.5 won primary", "2.7 raise StallTimeout"),
        status="stalled",
        error_type="stall_timeout",
        raises=StallTimeout,
        attempts=(("primary", "won", "stall_timeout"),),
        settings={"stall_timeout_s": 2.0},
        record={"max_itl_s": 2.0, "completion_tokens": 2},
    ),
    Row(
        "total_timeout_s passes while the winner streams: TotalTimeout",
        ((0.5, "chunk", 0, TOKEN), (2.5, "chunk", 0, TOKEN), (9.0, "advance")),
        ("0 start primary", "0.5 won primary", "3 raise TotalTimeout"),
        status="timeout",
        error_type="total_timeout",
        raises=TotalTimeout,
        attempts=(("primary", "won", "total_timeout"),),
        settings={"total_timeout_s": 3.0, "stall_timeout_s": None},
    ),
    Row(
        "an event over max_event_bytes before the first token: failover (event_too_large)",
        ((0.1, "fail", 0, EventTooLarge(1024)), *BACKUP_ANSWERS),
        ("0 start primary", "0.1 start backup", "0.3 won backup", "0.5 done"),
        status="ok",
        attempts=(("primary", "failed", "event_too_large"), ("backup", "won", None)),
        hedge_reason="primary_error",
    ),
    Row(
        "an event over max_event_bytes after the first token: StreamError (event_too_large)",
        ((0.1, "chunk", 0, TOKEN), (0.2, "fail", 0, EventTooLarge(1024))),
        ("0 start primary", "0.1 won primary", "0.2 raise StreamError"),
        status="error",
        error_type="event_too_large",
        raises=StreamError,
        attempts=(("primary", "won", "event_too_large"),),
    ),
    Row(
        "the caller abandons the stream: status cancelled, every attempt closed",
        ((1.5, "abandon"),),
        ("0 start primary", "1 start backup", "1.5 cancel primary", "1.5 cancel backup"),
        status="cancelled",
        error_type="caller_cancelled",
        attempts=(("primary", "cancelled", None), ("backup", "cancelled", None)),
        hedge_reason="ttft_timeout",
    ),
    Row(
        "every attempt failed (both, max_backups=1): AllAttemptsFailed",
        ((0.1, "fail", 0, REFUSED), (0.2, "fail", 1, HTTP_503)),
        ("0 start primary", "0.1 start backup", "0.2 raise AllAttemptsFailed"),
        status="error",
        error_type="all_attempts_failed",
        raises=AllAttemptsFailed,
        attempts=(("primary", "failed", "ConnectError"), ("backup", "failed", "http_503")),
        hedge_reason="primary_error",
    ),
    Row(
        "hedged, then both fail: AllAttemptsFailed only after the second",
        ((1.1, "fail", 0, HTTP_503), (1.2, "fail", 1, HTTP_503)),
        ("0 start primary", "1 start backup", "1.2 raise AllAttemptsFailed"),
        status="error",
        error_type="all_attempts_failed",
        raises=AllAttemptsFailed,
        attempts=(("primary", "failed", "http_503"), ("backup", "failed", "http_503")),
        hedge_reason="ttft_timeout",
    ),
    Row(
        "failover budget below half: no failover (failover_denied), AllAttemptsFailed",
        ((0.1, "fail", 0, REFUSED),),
        ("0 start primary", "0.1 raise AllAttemptsFailed"),
        status="error",
        error_type="all_attempts_failed",
        raises=AllAttemptsFailed,
        attempts=(("primary", "failed", "ConnectError"),),
        settings={"failover_budget": FailoverBudget(max_tokens=1.0)},
        record={"failover_denied": True},
    ),
    Row(
        "max_backups=2 with three upstreams: a failover after a hedge is the third attempt",
        (
            (1.1, "fail", 0, HTTP_503),
            (1.2, "fail", 1, HTTP_503),
            (1.5, "chunk", 2, TOKEN),
            (1.6, "chunk", 2, FINISH),
            (1.7, "end", 2),
        ),
        ("0 start primary", "1 start backup", "1.2 start backup2", "1.5 won backup2", "1.7 done"),
        status="ok",
        attempts=(("primary", "failed", "http_503"), ("backup", "failed", "http_503"), ("backup", "won", None)),
        hedge_reason="ttft_timeout",
        settings={"upstreams": 3, "max_backups": 2},
    ),
    Row(
        "max_backups=0: no hedge and no failover",
        ((2.0, "fail", 0, REFUSED),),
        ("0 start primary", "2 raise AllAttemptsFailed"),
        status="error",
        error_type="all_attempts_failed",
        raises=AllAttemptsFailed,
        attempts=(("primary", "failed", "ConnectError"),),
        settings={"max_backups": 0},
    ),
    Row(
        "one upstream only: no hedge",
        ((2.0, "chunk", 0, TOKEN), (2.1, "chunk", 0, FINISH), (2.2, "end", 0)),
        ("0 start primary", "2 won primary", "2.2 done"),
        status="ok",
        attempts=(("primary", "won", None),),
        settings={"upstreams": 1},
    ),
    Row(
        "whole response (unary): the first complete answer wins and cancels the other",
        ((1.4, "complete", 1, USAGE["usage"]), (1.5, "complete", 0, None)),
        ("0 start primary", "1 start backup", "1.4 won backup", "1.4 cancel primary", "1.4 done"),
        status="ok",
        attempts=(("primary", "cancelled", None), ("backup", "won", None)),
        hedge_reason="ttft_timeout",
        settings={"streaming": False},
        record={"ttft_s": 1.4, "ttfo_s": 1.4, "e2e_s": 1.4, "tpot_s": None, "max_itl_s": None, "completion_tokens": 3},
    ),
)


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_failure_mode(row: Row) -> None:
    call = FakeCall(make_race(**row.settings))
    call.apply(call.race.begin(0.0))
    for step in row.steps:
        call.step(*step)
    assert tuple(call.log) == row.log
    if row.raises is None:
        assert call.raised is None
    else:
        assert isinstance(call.raised, row.raises), call.raised
    # whatever happened, closing the call afterwards cancels what runs and changes no outcome
    call.apply(call.race.abandon(call.now + 1))
    record = call.race.record()
    assert (record.status, record.error_type) == (row.status, row.error_type)
    assert tuple((a.role, a.outcome, a.error_type) for a in record.attempts) == row.attempts
    assert record.hedge_reason == row.hedge_reason
    for name, value in row.record.items():
        actual = getattr(record, name)
        assert actual == (pytest.approx(value) if isinstance(value, float) else value), name
    assert call.race.record() is record  # one record per call
    assert call.race.deadline == math.inf


def test_all_attempts_failed_carries_every_attempts_error() -> None:
    call = FakeCall(make_race())
    call.apply(call.race.begin(0.0))
    call.step(0.1, "fail", 0, REFUSED)
    call.step(0.2, "fail", 1, HTTP_503)
    assert isinstance(call.raised, AllAttemptsFailed)
    assert call.raised.errors == [("u0", REFUSED), ("u1", HTTP_503)]


def test_the_hedge_timer_counts_from_the_primarys_send() -> None:
    # The primary's task ran late (sent at 0.3 s): the hedge is due at 1.3 s, not 1.0 s.
    race = make_race()
    (start,) = race.begin(0.0)
    assert isinstance(start, Start)
    assert race.tick(1.0) == ()  # not sent yet: no hedge, whatever the clock says
    race.sent(start.attempt, 0.3)
    assert race.deadline == pytest.approx(1.3)
    assert race.tick(1.2) == ()
    (backup,) = race.tick(1.3)
    assert isinstance(backup, Start) and backup.attempt.role == "backup"


def test_one_deposit_per_call_and_one_token_per_hedge() -> None:
    budget = HedgeBudget(0.5, 1.0)
    race = make_race(budget=budget)
    race.begin(0.0)
    race.sent(race.attempts[0], 0.0)
    assert budget.tokens == pytest.approx(1.0)  # capped at the burst
    race.tick(1.0)
    assert budget.tokens == pytest.approx(0.0) and race.hedged
    with pytest.raises(RuntimeError, match="already begun"):
        race.begin(0.0)


def test_the_winners_chunks_after_the_first_token_return_the_shared_empty_tuple() -> None:
    race = make_race()
    race.begin(0.0)
    primary = race.attempts[0]
    race.sent(primary, 0.0)
    assert race.chunk(primary, classify_chunk(TOKEN), 0.1)
    info = classify_chunk(TOKEN)
    first, second = race.chunk(primary, info, 0.2), race.chunk(primary, info, 0.3)
    assert first == () and first is second  # one shared tuple: nothing allocated per chunk


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="upstreams"):
        make_race(upstreams=0)
    with pytest.raises(ValueError, match="hedge_after_s"):
        make_race(hedge_after_s=-1.0)
    with pytest.raises(ValueError, match="max_backups"):
        make_race(max_backups=-1)
