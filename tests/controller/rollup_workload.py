"""A varied, seeded workload of call records for the rollup and retention tests, and the figures
computed directly from the records (no database, no rollup code) to check rollups against."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, TypedDict

from hedgerow.client.records import AttemptRecord, AttemptRole, CallRecord, CallStatus

PAIRS = (("summarize", "m1"), ("summarize", "m2"), ("chat", "m1"))
HEDGE_AFTER_S = 1.5


class _Common(TypedDict):
    """The fields every record of :func:`make_record` shares."""

    request_id: str
    route: str
    model: str
    started_at: datetime
    client: str
    hedge_after_s: float
    prompt_tokens: int | None


def _primary_ttft(rng: random.Random) -> float:
    return rng.lognormvariate(-0.2, 0.8)  # median 0.82 s, P90 about 2.3 s


def make_record(rng: random.Random, request_id: str, started_at: datetime, pair: tuple[str, str]) -> CallRecord:
    """One call: plain, hedged (either side wins), hedge denied, failover, failed, stalled, cancelled."""
    route, model = pair
    prompt = rng.choice([None, rng.randint(50, 500)])
    completion = rng.randint(10, 300)
    base: _Common = {
        "request_id": request_id,
        "route": route,
        "model": model,
        "started_at": started_at,
        "client": "test",
        "hedge_after_s": HEDGE_AFTER_S,
        "prompt_tokens": prompt,
    }
    attempts: tuple[AttemptRecord, ...]
    status: CallStatus
    winner: AttemptRole
    u = rng.random()
    primary = _primary_ttft(rng)
    if u < 0.05:  # failover: the primary fails fast, the backup answers
        fail_at = rng.uniform(0.01, 0.3)
        first = fail_at + rng.expovariate(2.0)
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, fail_at, "failed", 503, "http_503", 0),
            AttemptRecord("b", "backup", fail_at, first, first + 2.0, "won", 200, None, completion),
        )
        return CallRecord(
            **base,
            completion_tokens=completion,
            hedged=True,
            hedge_reason="primary_error",
            winner="backup",
            ttft_s=first,
            ttfo_s=first,
            e2e_s=first + 2.0,
            attempts=attempts,
        )
    if u < 0.09:  # the primary fails and nothing saves it
        status = rng.choice(["error", "timeout"])
        end = rng.uniform(0.05, 3.0)
        attempts = (AttemptRecord("a", "primary", 0.0, None, end, "failed", 500, "http_500", 0),)
        return CallRecord(**base, completion_tokens=0, status=status, error_type="http_500", attempts=attempts)
    if u < 0.11:  # the caller walked away before any token: the primary is censored
        end = rng.uniform(0.1, 1.4)
        attempts = (AttemptRecord("a", "primary", 0.0, None, end, "cancelled", 200, None, 0),)
        return CallRecord(**base, completion_tokens=0, status="cancelled", attempts=attempts)
    status = "stalled" if u < 0.13 else "ok"
    if primary <= HEDGE_AFTER_S or u < 0.2:  # no hedge, or the budget refused it
        denied = primary > HEDGE_AFTER_S
        attempts = (AttemptRecord("a", "primary", 0.0, primary, primary + 2.0, "won", 200, None, completion),)
        return CallRecord(
            **base,
            completion_tokens=completion,
            hedge_denied=denied,
            winner="primary",
            status=status,
            ttft_s=primary,
            ttfo_s=primary,
            e2e_s=primary + 2.0,
            attempts=attempts,
        )
    backup_first = HEDGE_AFTER_S + rng.expovariate(1.0 / 0.4)
    wasted = rng.randint(0, 5)
    if primary <= backup_first:
        first, winner = primary, "primary"
        attempts = (
            AttemptRecord("a", "primary", 0.0, primary, primary + 2.0, "won", 200, None, completion),
            AttemptRecord("b", "backup", HEDGE_AFTER_S, None, primary, "cancelled", 200, None, wasted),
        )
    else:
        first, winner = backup_first, "backup"
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, backup_first, "cancelled", 200, None, wasted),
            AttemptRecord("b", "backup", HEDGE_AFTER_S, backup_first, backup_first + 2.0, "won", 200, None, completion),
        )
    return CallRecord(
        **base,
        completion_tokens=completion,
        hedged=True,
        hedge_reason="ttft_timeout",
        winner=winner,
        status=status,
        ttft_s=first,
        ttfo_s=first,
        e2e_s=first + 2.0,
        wasted_completion_tokens=wasted,
        attempts=attempts,
    )


def workload(
    n: int, *, seed: int, start: datetime, span_s: float, prefix: str = "c", pairs: Sequence[tuple[str, str]] = PAIRS
) -> list[CallRecord]:
    """``n`` records started uniformly in ``[start, start + span_s)``."""
    rng = random.Random(seed)
    return [make_record(rng, f"{prefix}{seed}-{i}", start + timedelta(seconds=rng.uniform(0, span_s)),
                        rng.choice(list(pairs)))
            for i in range(n)]  # fmt: skip


def direct_figures(records: Sequence[CallRecord]) -> dict[str, Any]:
    """Counters, token sums and TTFT samples computed straight from the records."""
    out: dict[str, Any] = {
        name: 0
        for name in (
            "calls",
            "ok_calls",
            "error_calls",
            "timeout_calls",
            "stalled_calls",
            "cancelled_calls",
            "hedges",
            "hedge_denied",
            "backup_wins",
            "failovers",
            "prompt_tokens",
            "completion_tokens",
            "wasted_completion_tokens",
        )
    }
    observed: list[float] = []
    censored: list[float] = []
    call_ttft: list[float] = []
    for r in records:
        out["calls"] += 1
        out[f"{r.status}_calls"] += 1
        out["hedges"] += r.hedge_reason == "ttft_timeout"
        out["backup_wins"] += r.hedge_reason == "ttft_timeout" and r.winner == "backup"
        out["failovers"] += r.hedge_reason == "primary_error"
        out["hedge_denied"] += r.hedge_denied
        out["prompt_tokens"] += r.prompt_tokens or 0
        out["completion_tokens"] += r.completion_tokens or 0
        out["wasted_completion_tokens"] += r.wasted_completion_tokens
        if r.ttft_s is not None:
            call_ttft.append(r.ttft_s)
        p = next(a for a in r.attempts if a.role == "primary")
        if p.first_token_s is not None:
            observed.append(p.first_token_s - p.start_s)
        elif p.outcome == "cancelled":
            censored.append(p.end_s - p.start_s)
    out["observed"] = observed
    out["censored"] = censored
    out["call_ttft"] = call_ttft
    return out
