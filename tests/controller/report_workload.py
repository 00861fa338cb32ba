"""A week of varied call records for the report tests, and the figures computed straight from them.

The workload spans ISO week 2026-W48 (Monday 2026-11-23 to Sunday 2026-11-29, UTC) plus a few
calls of the weeks around it, on two routes: ``chat``/``m-priced`` (a price change on Wednesday
noon, an upstream with a price of its own) and ``batch``/``m-free`` (no price at all). Calls hedge,
fail over, fail, get their hedge denied; some attempts carry their own prompt tokens (record
version 2, cached tokens included), others not (version 1: the store estimates them).

:func:`direct_figures` computes the report's figures from the records with plain arithmetic
(no rollup, no histogram), so the tests compare two independent computations.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hedgerow.client.records import AttemptRecord, AttemptRole, CallRecord

__all__ = [
    "EDGE_CALLS",
    "MONDAY",
    "NEXT_MONDAY",
    "PRICES",
    "PRICE_CHANGE_AT",
    "direct_figures",
    "exact_quantile",
    "price_for",
    "week_records",
]

MONDAY = datetime(2026, 11, 23, tzinfo=UTC)
NEXT_MONDAY = MONDAY + timedelta(days=7)
PRICE_CHANGE_AT = datetime(2026, 11, 25, 12, tzinfo=UTC)


@dataclass(frozen=True)
class _Price:
    upstream: str
    since: datetime
    input_usd: float
    output_usd: float
    cached_usd: float | None


#: The prices of ``m-priced`` (``m-free`` has none), as set through the api in the tests.
PRICES = (
    _Price("", datetime(2026, 11, 1, tzinfo=UTC), 2.0, 8.0, 1.0),
    _Price("", PRICE_CHANGE_AT, 3.0, 12.0, None),
    _Price("b", datetime(2026, 11, 1, tzinfo=UTC), 1.5, 6.0, 0.5),
)

#: Calls on the edges of the week: (request_id, started_at, in W48).
EDGE_CALLS = (
    ("edge-first-instant", MONDAY, True),
    ("edge-last-millisecond", NEXT_MONDAY - timedelta(milliseconds=1), True),
    ("edge-next-week", NEXT_MONDAY, False),
    ("edge-previous-week", MONDAY - timedelta(milliseconds=1), False),
)


def price_for(model: str, upstream: str, at: datetime) -> _Price | None:
    """The price in force for (model, upstream) at the start of ``at``'s hour (the report's rule)."""
    if model != "m-priced":
        return None
    hour = at.replace(minute=0, second=0, microsecond=0)
    own = [p for p in PRICES if p.upstream == upstream and p.since <= hour]
    wide = [p for p in PRICES if p.upstream == "" and p.since <= hour]
    chosen = own or wide
    return max(chosen, key=lambda p: p.since) if chosen else None


def _call(rng: random.Random, request_id: str, route: str, model: str, started_at: datetime) -> CallRecord:
    """One call: plain, hedged (either side wins), failover, failed, or hedge denied."""
    prompt = rng.randint(50, 2000)
    completion = rng.randint(5, 300)
    primary_ttft = rng.lognormvariate(math.log(0.4), 0.6)
    hedge_after = 0.8
    kind = rng.random()
    v2 = rng.random() < 0.5  # half the records carry their attempts' own prompt tokens
    own = prompt if v2 else None
    cached = (prompt // 4) if v2 and rng.random() < 0.5 else None
    common: dict[str, Any] = {"client": "t", "started_at": started_at, "record_version": 2 if v2 else 1}
    attempts: tuple[AttemptRecord, ...]
    winner: AttemptRole
    if kind < 0.06:  # the primary fails with a 503, the backup answers (failover)
        first = 0.05 + rng.uniform(0.1, 0.6)
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, 0.05, "failed", 503, "http_503", 0),
            AttemptRecord("b", "backup", 0.05, first, first + 1.0, "won", 200, None, completion, own, False, cached),
        )
        return CallRecord(request_id, route, model, hedged=True, hedge_reason="primary_error", winner="backup",
                          ttft_s=first, ttfo_s=first, e2e_s=first + 1.0, tpot_s=1.0 / max(completion - 1, 1),
                          prompt_tokens=prompt, completion_tokens=completion, attempts=attempts, **common)  # fmt: skip
    if kind < 0.09:  # everything fails
        attempts = (AttemptRecord("a", "primary", 0.0, None, 0.02, "failed", None, "ConnectError", 0),)
        return CallRecord(request_id, route, model, status="error", error_type="ConnectError", attempts=attempts,
                          **common)  # fmt: skip
    if primary_ttft > hedge_after and kind < 0.12:  # late, but the budget refused the hedge
        e2e = primary_ttft + 1.5
        attempts = (AttemptRecord("a", "primary", 0.0, primary_ttft, e2e, "won", 200, None, completion, own, False),)
        return CallRecord(request_id, route, model, hedge_after_s=hedge_after, hedge_denied=True, winner="primary",
                          ttft_s=primary_ttft, ttfo_s=primary_ttft, e2e_s=e2e, tpot_s=1.5 / max(completion - 1, 1),
                          prompt_tokens=prompt, completion_tokens=completion, attempts=attempts, **common)  # fmt: skip
    if primary_ttft > hedge_after:  # hedged: the first of the two first tokens wins
        backup_first = hedge_after + rng.lognormvariate(math.log(0.3), 0.5)
        loser_tokens = rng.randint(0, 3)
        if primary_ttft <= backup_first:
            first = primary_ttft
            attempts = (
                AttemptRecord(
                    "a", "primary", 0.0, first, first + 1.2, "won", 200, None, completion, own, False, cached
                ),
                AttemptRecord("b", "backup", hedge_after, None, first, "cancelled", 200, None, loser_tokens),
            )
            winner = "primary"
        else:
            first = backup_first
            attempts = (
                AttemptRecord("a", "primary", 0.0, None, first, "cancelled", 200, None, loser_tokens),
                AttemptRecord("b", "backup", hedge_after, first, first + 1.2, "won", 200, None, completion, own, False),
            )
            winner = "backup"
        return CallRecord(request_id, route, model, hedge_after_s=hedge_after, hedged=True, hedge_reason="ttft_timeout",
                          winner=winner, ttft_s=first, ttfo_s=first, e2e_s=first + 1.2,
                          tpot_s=1.2 / max(completion - 1, 1), prompt_tokens=prompt, completion_tokens=completion,
                          wasted_completion_tokens=loser_tokens, attempts=attempts, **common)  # fmt: skip
    e2e = primary_ttft + 1.0
    attempts = (
        AttemptRecord("a", "primary", 0.0, primary_ttft, e2e, "won", 200, None, completion, own, False, cached),
    )
    return CallRecord(request_id, route, model, hedge_after_s=hedge_after, winner="primary", ttft_s=primary_ttft,
                      ttfo_s=primary_ttft, e2e_s=e2e, tpot_s=1.0 / max(completion - 1, 1), prompt_tokens=prompt,
                      completion_tokens=completion, attempts=attempts, **common)  # fmt: skip


def week_records(seed: int = 7, per_route: int = 900) -> list[CallRecord]:
    """``per_route`` calls per route spread over W48, the edge calls, and 150 calls of W47 (chat)."""
    rng = random.Random(seed)
    records = []
    for route, model in (("chat", "m-priced"), ("batch", "m-free")):
        for i in range(per_route):
            at = MONDAY + timedelta(seconds=rng.uniform(0, 7 * 86400 - 1))
            records.append(_call(rng, f"{route}-{i}", route, model, at))
    for request_id, at, _ in EDGE_CALLS:
        records.append(_call(rng, request_id, "chat", "m-priced", at))
    for i in range(150):
        at = MONDAY - timedelta(days=7) + timedelta(seconds=rng.uniform(0, 7 * 86400 - 1))
        records.append(_call(rng, f"prev-{i}", "chat", "m-priced", at))
    return records


def exact_quantile(values: list[float], q: float) -> float:
    """The smallest sample with empirical CDF >= q (the definition the histograms approximate)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]


def _prompt_cost(record: CallRecord, attempt: AttemptRecord) -> int:
    if attempt.prompt_tokens is not None:
        return attempt.prompt_tokens
    if attempt.status_code is not None and 200 <= attempt.status_code < 300 and record.prompt_tokens is not None:
        return record.prompt_tokens
    return 0


def direct_figures(records: list[CallRecord]) -> dict[str, Any]:
    """The figures of a set of records (one route or many), with plain arithmetic."""
    out: dict[str, Any] = {"calls": len(records), "ok": 0, "error": 0, "hedges": 0, "denied": 0, "backup_wins": 0,
                           "failovers": 0, "prompt": 0, "completion": 0, "extra_prompt": 0, "extra_completion": 0,
                           "spend_usd": 0.0, "overhead_usd": 0.0, "unpriced": 0}  # fmt: skip
    ttfts, tpots, e2es, primary, censored = [], [], [], [], []
    for r in records:
        out[r.status] = out.get(r.status, 0) + 1
        out["hedges"] += r.hedge_reason == "ttft_timeout"
        out["backup_wins"] += r.hedge_reason == "ttft_timeout" and r.winner == "backup"
        out["failovers"] += r.hedge_reason == "primary_error"
        out["denied"] += r.hedge_denied
        if r.ttft_s is not None:
            ttfts.append(r.ttft_s)
        if r.tpot_s is not None:
            tpots.append(r.tpot_s)
        if r.e2e_s is not None:
            e2es.append(r.e2e_s)
        first_primary = next((a for a in r.attempts if a.role == "primary"), None)
        if first_primary is not None and first_primary.first_token_s is not None:
            primary.append(first_primary.first_token_s - first_primary.start_s)
            censored.append(False)
        elif first_primary is not None and first_primary.outcome == "cancelled":
            primary.append(first_primary.end_s - first_primary.start_s)
            censored.append(True)
        for a in r.attempts:
            prompt = _prompt_cost(r, a)
            cached = min(a.cached_prompt_tokens or 0, prompt)
            extra = len(r.attempts) > 1 and a.outcome != "won"
            out["prompt"] += prompt
            out["completion"] += a.completion_tokens
            if extra:
                out["extra_prompt"] += prompt
                out["extra_completion"] += a.completion_tokens
            price = price_for(r.model, a.upstream, r.started_at)
            if price is None:
                out["unpriced"] += prompt + a.completion_tokens
                continue
            cached_usd = price.input_usd if price.cached_usd is None else price.cached_usd
            usd = (
                (prompt - cached) * price.input_usd + cached * cached_usd + a.completion_tokens * price.output_usd
            ) / 1e6
            out["spend_usd"] += usd
            if extra:
                out["overhead_usd"] += usd
    out.update(ttfts=ttfts, tpots=tpots, e2es=e2es, primary=primary, censored=censored)
    return out
