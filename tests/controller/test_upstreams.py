"""Per-upstream figures (hedgerow.controller.store.upstreams) on SQLite and PostgreSQL.

Checked twice: by hand on a handful of calls, and against a plain-Python recount of a random
workload (the same definitions applied record by record, with the KM quantiles of
:func:`km_quantile` over the raw samples' histograms).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import AttemptRecord, CallRecord, attempt_prompt_tokens
from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.policy.samples import ttft_sample
from hedgerow.controller.policy.ttft_histogram import histogram_of, km_quantile
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.upstreams import (
    MAX_WINDOW_S,
    UpstreamWindowError,
    coverage_note,
    failure_kind,
    upstream_stats,
    window_error,
)
from hedgerow.settings import Settings

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _call(
    rid: str,
    attempts: tuple[AttemptRecord, ...],
    *,
    route: str = "chat",
    at: datetime = T0,
    reason: str | None = None,
    status: str = "ok",
    error_type: str | None = None,
) -> CallRecord:
    winner = next((a.role for a in attempts if a.outcome == "won"), None)
    first = next((a.first_token_s for a in attempts if a.outcome == "won"), None)
    return CallRecord(
        rid,
        route,
        "m1",
        at,
        hedged=len(attempts) > 1,
        hedge_reason=reason,  # type: ignore[arg-type]
        winner=winner,
        status=status,  # type: ignore[arg-type]
        error_type=error_type,
        ttft_s=first,
        prompt_tokens=10,
        completion_tokens=5 if winner else None,
        wasted_completion_tokens=sum(a.completion_tokens for a in attempts if a.outcome != "won"),
        attempts=attempts,
    )


def _hand_calls() -> list[CallRecord]:
    A = AttemptRecord
    return [
        # a answers alone, TTFT 0.2 s
        _call("c1", (A("a", "primary", 0.0, 0.2, 1.0, "won", 200, None, 30),)),
        # a is slow: hedge to b at 0.5 s, b wins at 0.8 s (a censored at 0.8 s, 0 tokens, its
        # 120 prompt tokens prefilled and lost)
        _call(
            "c2",
            (
                A("a", "primary", 0.0, None, 0.8, "cancelled", 200, None, 0, prompt_tokens=120),
                A("b", "backup", 0.5, 0.8, 2.0, "won", 200, None, 40),
            ),
            reason="ttft_timeout",
        ),
        # a is slow, hedge to b, a still wins; b generated 7 tokens before the cancel (its prompt
        # tokens estimated from the call's)
        _call(
            "c3",
            (
                A("a", "primary", 0.0, 0.6, 1.5, "won", 200, None, 30),
                A(
                    "b",
                    "backup",
                    0.5,
                    0.55,
                    0.6,
                    "cancelled",
                    200,
                    None,
                    7,
                    prompt_tokens=10,
                    prompt_tokens_estimated=True,
                ),
            ),
            reason="ttft_timeout",
        ),
        # a fails with a 503, failover to b
        _call(
            "c4",
            (
                A("a", "primary", 0.0, None, 0.1, "failed", 503, "http_503", 0),
                A("b", "backup", 0.1, 0.4, 1.0, "won", 200, None, 20),
            ),
            reason="primary_error",
        ),
        # b as primary stalls after its first token
        _call(
            "c5",
            (A("b", "primary", 0.0, 0.3, 9.0, "won", 200, "stall_timeout", 4),),
            status="stalled",
            error_type="stall_timeout",
        ),
        # c times out with no first token (a failed attempt: no TTFT sample)
        _call(
            "c6",
            (A("c", "primary", 0.0, None, 30.0, "failed", None, "ReadTimeout", 0),),
            status="error",
            error_type="all_attempts_failed",
        ),
        # another route, outside the route filter; and a call outside the window
        _call("c7", (A("a", "primary", 0.0, 0.2, 1.0, "won", 200, None, 30),), route="other"),
        _call("c8", (A("a", "primary", 0.0, 0.2, 1.0, "won", 200, None, 30),), at=T0 - timedelta(days=3)),
    ]


async def _store(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord]) -> None:
    defaults = route_defaults(Settings())
    for start in range(0, len(records), 500):
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records[start : start + 500], defaults=defaults)


async def _stats(sessionmaker: async_sessionmaker[AsyncSession], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("since", T0 - timedelta(hours=1))
    kwargs.setdefault("until", T0 + timedelta(hours=1))
    async with sessionmaker() as session:
        return await upstream_stats(session, **kwargs)


async def test_hand_checked_figures(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    await _store(sessionmaker, _hand_calls())
    result = await _stats(sessionmaker, route="chat")
    rows = {row["upstream"]: row for row in result["upstreams"]}
    assert [row["upstream"] for row in result["upstreams"]] == ["a", "b", "c"]  # most attempts first
    a, b, c = rows["a"], rows["b"], rows["c"]
    assert (a["attempts"], a["primary_attempts"], a["backup_attempts"]) == (4, 4, 0)
    assert (b["attempts"], b["primary_attempts"], b["backup_attempts"]) == (4, 1, 3)
    # a: samples 0.2, 0.6 observed, 0.8 censored (the 503 is no sample)
    assert (a["ttft_samples"], a["ttft_censored"]) == (3, 1)
    # b: 0.3 (0.8 - 0.5), 0.05 (cancelled after its first token: observed), 0.3, 0.3
    assert (b["ttft_samples"], b["ttft_censored"]) == (4, 0)
    assert b["ttft_s"]["p50"]["value_s"] == pytest.approx(0.3, rel=0.025)
    assert b["ttft_s"]["p99"]["value_s"] == pytest.approx(0.3, rel=0.025)
    # a's KM: 0.2 (1 of 3), 0.6 (1 of 2), then one censored: S never falls below 1/3
    assert a["ttft_s"]["p50"]["value_s"] == pytest.approx(0.6, rel=0.025)
    assert a["ttft_s"]["p90"]["value_s"] is None and a["ttft_s"]["p90"]["low_s"] > 0.5
    assert c["ttft_samples"] == 0 and c["ttft_s"] == {"p50": None, "p90": None, "p99": None}
    assert (a["errors"], a["timeouts"], a["stalls"], a["error_rate"]) == (1, 0, 0, 0.25)
    assert (b["errors"], b["timeouts"], b["stalls"], b["stall_rate"]) == (0, 0, 1, 0.25)
    assert (c["errors"], c["timeouts"], c["timeout_rate"]) == (0, 1, 1.0)
    assert (a["raced"], a["wins"], a["win_rate"]) == (2, 1, 0.5)
    assert (b["raced"], b["wins"], b["win_rate"]) == (2, 1, 0.5)
    assert c["raced"] == 0 and c["win_rate"] is None
    assert (a["hedges_caused"], a["hedge_share"], a["failovers_caused"]) == (2, 1.0, 1)
    assert (b["hedges_caused"], b["hedge_share"], b["failovers_caused"]) == (0, 0.0, 0)
    assert (a["loser_completion_tokens"], b["loser_completion_tokens"]) == (0, 7)
    # the losers' prompts: a's 120 (c2; its c4 attempt refused with a 503 was billed none: 0 by the
    # store's estimate rule), b's estimated 10 (c3); every record carries them
    assert (a["loser_prompt_tokens"], a["loser_prompt_tokens_estimated"]) == (120, 0)
    assert (b["loser_prompt_tokens"], b["loser_prompt_tokens_estimated"]) == (10, 10)
    assert (a["loser_attempts_without_prompt_tokens"], b["loser_attempts_without_prompt_tokens"]) == (0, 0)
    assert result["hedges"] == 2 and result["attempts"] == 9 and not result["truncated"]
    assert result["covered_from"] == T0 - timedelta(days=3)
    everything = await _stats(sessionmaker)
    assert {r["upstream"]: r["attempts"] for r in everything["upstreams"]} == {"a": 5, "b": 4, "c": 1}
    limited = await _stats(sessionmaker, limit=1)
    assert [r["upstream"] for r in limited["upstreams"]] == ["a"] and limited["truncated"]
    empty = await _stats(sessionmaker, route="other", since=T0 + timedelta(hours=2), until=T0 + timedelta(hours=3))
    assert empty["upstreams"] == [] and empty["hedges"] == 0
    with pytest.raises(UnknownRoute, match="unknown route 'nothing'"):
        await _stats(sessionmaker, route="nothing")


def _random_calls(n: int, seed: int) -> list[CallRecord]:
    rng = random.Random(seed)
    A = AttemptRecord
    names = ["east", "west", "north", "sou[th]"]
    out = []
    for i in range(n):
        at = T0 - timedelta(seconds=rng.uniform(0, 7200))
        primary, backup = rng.sample(names, 2)
        ttft = rng.lognormvariate(-1.0, 0.8)
        kind = rng.random()
        if kind < 0.6:
            err = rng.choice([None, None, None, "stall_timeout"])
            out.append(_call(f"r{i}", (A(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, err, 20),), at=at))
        elif kind < 0.7:
            err = rng.choice(["http_503", "ConnectError", "total_timeout", "ConnectTimeout"])
            b_ttft = rng.lognormvariate(-1.0, 0.8)
            fail_at = rng.uniform(0.01, 0.5)
            out.append(
                _call(
                    f"r{i}",
                    (
                        A(primary, "primary", 0.0, None, fail_at, "failed", None, err, 0),
                        A(backup, "backup", fail_at, fail_at + b_ttft, fail_at + b_ttft + 1, "won", 200, None, 20),
                    ),
                    at=at,
                    reason="primary_error",
                )
            )
        else:
            hedge = 0.4
            b_ttft = rng.lognormvariate(-1.0, 0.8)
            ttft = max(ttft, hedge + 0.01)
            if ttft <= hedge + b_ttft:
                atts = (
                    A(primary, "primary", 0.0, ttft, ttft + 1, "won", 200, None, 20),
                    A(backup, "backup", hedge, None, ttft, "cancelled", 200, None, rng.randint(0, 9), prompt_tokens=50),
                )
            else:
                first = hedge + b_ttft
                atts = (
                    A(primary, "primary", 0.0, None, first, "cancelled", 200, None, 0),
                    A(backup, "backup", hedge, first, first + 1, "won", 200, None, 20),
                )
            out.append(_call(f"r{i}", atts, at=at, reason="ttft_timeout"))
    return out


_KEYS = ("attempts", "error", "timeout", "stall", "raced", "wins", "hedges", "loser", "loser_prompt")


def _recount(records: list[CallRecord], since: datetime, until: datetime) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[tuple[float, bool]]] = {}
    for record in records:
        if not since <= record.started_at < until:
            continue
        for a in record.attempts:
            row = rows.setdefault(a.upstream, dict.fromkeys(_KEYS, 0))
            row["attempts"] += 1
            kind = failure_kind(a.outcome, a.error_type)
            if kind:
                row[kind] += 1
            if record.hedge_reason == "ttft_timeout":
                row["raced"] += 1
                row["wins"] += a.outcome == "won"
                row["hedges"] += a.role == "primary"
            if record.hedged and a.outcome != "won":
                row["loser"] += a.completion_tokens
                row["loser_prompt"] += attempt_prompt_tokens(record, a)[0]  # the store's rule
            sample = ttft_sample(a.start_s, a.first_token_s, a.end_s, a.outcome)
            if sample is not None:
                samples.setdefault(a.upstream, []).append(sample)
    for name, row in rows.items():
        mine = samples.get(name, [])
        events = histogram_of(s for s, cut in mine if not cut)
        cut = histogram_of(s for s, cut in mine if cut)
        row["p"] = {q: km_quantile(events, cut, level) for q, level in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
        row["censored"] = sum(cut.values())
    return rows


async def test_matches_a_plain_recount(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    records = _random_calls(1500, seed=7)
    await _store(sessionmaker, records)
    since, until = T0 - timedelta(minutes=90), T0
    expected = _recount(records, since, until)
    result = await _stats(sessionmaker, since=since, until=until)
    assert {r["upstream"] for r in result["upstreams"]} == set(expected)
    for row in result["upstreams"]:
        want = expected[row["upstream"]]
        assert row["attempts"] == want["attempts"]
        assert (row["errors"], row["timeouts"], row["stalls"]) == (want["error"], want["timeout"], want["stall"])
        assert (row["raced"], row["wins"], row["hedges_caused"]) == (want["raced"], want["wins"], want["hedges"])
        assert row["loser_completion_tokens"] == want["loser"] > 0
        assert row["loser_prompt_tokens"] == want["loser_prompt"] > 0
        assert row["ttft_censored"] == want["censored"]
        for q, found in want["p"].items():
            assert found is not None
            assert row["ttft_s"][q] == {"value_s": found.value_s, "low_s": found.low_s, "high_s": found.high_s}


def test_failure_kinds() -> None:
    assert failure_kind("won", None) is None and failure_kind("cancelled", None) is None
    assert failure_kind("failed", None) == "error"
    assert failure_kind("failed", "http_429") == "error"
    assert failure_kind("won", "truncated") == "error"
    assert failure_kind("won", "stall_timeout") == "stall"
    for name in ("total_timeout", "ReadTimeout", "ConnectTimeout"):
        assert failure_kind("failed", name) == "timeout"


async def test_windows_refused(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    assert window_error(T0, T0 + timedelta(seconds=MAX_WINDOW_S)) is None
    empty = window_error(T0, T0)
    assert empty is not None and empty[0] == "since"
    too_long = window_error(T0, T0 + timedelta(seconds=MAX_WINDOW_S + 1))
    assert too_long is not None and "at most 32 days" in too_long[1]
    naive = window_error(T0.replace(tzinfo=None), T0)
    assert naive is not None and naive[0] == "since"
    with pytest.raises(UpstreamWindowError) as caught:
        await _stats(sessionmaker, since=T0, until=T0 - timedelta(seconds=1))
    assert caught.value.field == "since"
    with pytest.raises(UpstreamWindowError) as caught:
        await _stats(sessionmaker, limit=0)
    assert caught.value.field == "limit"


async def test_the_sql_pass_and_the_streamed_fallback_agree(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """The one grouped statement (``log`` in SQL) reads the same counters and histograms as the
    fallback of a SQLite without math functions (an aggregate, then samples bucketed here)."""
    from hedgerow.controller.store.upstreams import _collect

    await _store(sessionmaker, _random_calls(800, seed=3))
    window = (T0 - timedelta(hours=3), T0 + timedelta(hours=1))
    async with sessionmaker() as session:
        in_sql = await _collect(session, *window, None, in_sql=True)
        streamed = await _collect(session, *window, None, in_sql=False)
    names = {"east", "west", "north", "sou[th]"}
    assert set(in_sql.totals) == set(streamed.totals) == set(in_sql.observed) == names
    for name in names:
        assert in_sql.totals[name] == streamed.totals[name]
        assert (in_sql.observed[name] == streamed.observed[name]).all()
        assert (in_sql.censored[name] == streamed.censored[name]).all()
        assert in_sql.censored[name].sum() > 0 and in_sql.totals[name][2] > 0  # censored samples, errors


def test_an_empty_table_says_why() -> None:
    since, until = T0 - timedelta(days=2), T0 - timedelta(days=1)
    assert coverage_note(since, until, None, 0) is not None
    assert "No raw call is stored yet" in (coverage_note(since, until, None, 0) or "")
    before = coverage_note(since, until, T0, 0) or ""
    assert before.startswith("The window ends before the oldest raw call stored (2026-12-01 12:00 UTC)")
    assert (coverage_note(since, until, since, 0) or "").startswith("No attempt in this window")
    assert coverage_note(since, until, T0, 3) is None  # rows: nothing to explain
