"""The controller tick on recorded data: censored primaries, window widening, versions, history."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.jobs import backup_samples, run_tick
from hedgerow.controller.policy.estimation import estimate_ttft
from hedgerow.controller.policy.ttft_histogram import BUCKET_RATIO, MAX_RELATIVE_ERROR
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Threshold, ThresholdHistory
from hedgerow.controller.store.queries import HISTORY_FIELDS, get_history, list_thresholds
from hedgerow.settings import Settings
from tests.conftest import CallFactory

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
#: The worked number's one-sided 95% lower bound on the primary's P99 (module docstring of jobs).
P99_BOUND_S = 3.631


def _not_none(value_s: float | None) -> float:
    """``value_s``, which the workload guarantees is set (an assertion otherwise)."""
    assert value_s is not None
    return value_s


async def _store(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord], settings: Settings) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(settings))


def _hedged_workload(
    call_factory: CallFactory, n: int, *, seed: int, hedge_after_s: float, age_s: float = 3000.0
) -> list[CallRecord]:
    """Primaries with TTFT ~ Exp(mean 1 s); a backup starts at ``hedge_after_s`` (TTFT ~ Exp(0.5 s))."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        started = NOW - timedelta(seconds=rng.uniform(1.0, age_s))
        primary = rng.expovariate(1.0)
        if primary > hedge_after_s:
            records.append(
                call_factory(
                    f"h{seed}-{i}",
                    started_at=started,
                    primary_ttft_s=primary,
                    hedge_after_s=hedge_after_s,
                    backup_ttft_s=rng.expovariate(2.0),
                )
            )
        else:
            records.append(call_factory(f"h{seed}-{i}", started_at=started, primary_ttft_s=primary))
    return records


async def test_tick_with_censored_primaries_finds_the_budget_quantile(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    records = _hedged_workload(call_factory, 3000, seed=1, hedge_after_s=1.5)
    failed = [
        call_factory(f"f{i}", started_at=NOW - timedelta(seconds=60 + i), primary_ttft_s=None) for i in range(300)
    ]
    await _store(sessionmaker, records + failed, settings)
    censored_primaries = sum(1 for r in records if r.attempts[0].first_token_s is None)
    uncensored = [r.attempts[0].ttft_s for r in records if r.attempts[0].first_token_s is not None]
    naive_p90 = float(np.quantile(np.array(uncensored, dtype=float), 0.9))
    true_p90 = math.log(10.0)  # Exp(1): P(TTFT > t) = exp(-t)
    assert censored_primaries > 100 and naive_p90 < 1.6  # dropping the censored would be badly low

    rows = await run_tick(sessionmaker, settings, now=NOW)
    assert len(rows) == 1
    row = rows[0]
    assert tuple(row) == HISTORY_FIELDS
    assert row["samples"] == 3000 and row["censored"] == censored_primaries  # failed ones excluded
    assert row["window_s"] == settings.window_s
    assert abs(row["p90_s"] - true_p90) / true_p90 < 0.12
    # the target's upper confidence bound keeps the hedge rate under budget: at or a bit above P90
    assert true_p90 * 0.95 < row["hedge_after_s"] < true_p90 * 1.3
    assert row["applied"] and row["previous_hedge_after_s"] is None and row["source"] == "controller"
    assert row["budget"] == 0.10
    expected_hedge_rate = sum(1 for r in records if r.hedged) / 3300
    assert row["observed_hedge_rate"] == expected_hedge_rate
    hedged = [r for r in records if r.hedged]
    assert row["backup_win_rate"] == sum(1 for r in hedged if r.winner == "backup") / len(hedged)
    async with sessionmaker() as session:
        [threshold] = await list_thresholds(session)
    assert threshold["hedge_after_s"] == row["hedge_after_s"] and threshold["version"] == 1


async def test_a_cold_route_publishes_what_its_samples_support_and_history_always_written(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # 10 samples support no value below the maximum within the budget (0 of 10 gives 0.259):
    # the cold route publishes the maximum, not the 2.0 s default, and keeps it on the same data
    settings = Settings(default_hedge_after_s=2.0)
    await _store(
        sessionmaker, [call_factory(f"x{i}", started_at=NOW - timedelta(seconds=10 + i)) for i in range(10)], settings
    )
    first = await run_tick(sessionmaker, settings, now=NOW)
    second = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=60))
    assert [r["hedge_after_s"] for r in first + second] == [30.0, 30.0]
    assert first[0]["reason"] == "cold_start_supported,clamped_max" and first[0]["source"] == "cold_start"
    assert second[0]["reason"] == first[0]["reason"] and second[0]["source"] == "cold_start"
    assert first[0]["applied"] and not second[0]["applied"]
    assert second[0]["previous_hedge_after_s"] == 30.0
    # the window widened all the way while there were too few samples
    assert first[0]["window_s"] == settings.max_window_s and first[0]["samples"] == 10
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(ThresholdHistory)) == 2
        threshold = (await session.scalars(select(Threshold))).one()
        history = await get_history(session, "summarize", "m1", limit=10)
    assert threshold.version == 1  # value unchanged: same version
    assert [h["computed_at"] for h in history] == [
        "2026-11-29T12:01:00.000000Z",
        "2026-11-29T12:00:00.000000Z",
    ]  # newest first


def _old_calls(call_factory: CallFactory) -> list[CallRecord]:
    """80 calls 2.5 to 3.5 hours before ``NOW``, primary TTFT 0.1-0.5 s (seed 7)."""
    rng = random.Random(7)
    return [
        call_factory(
            f"o{i}", started_at=NOW - timedelta(hours=rng.uniform(2.5, 3.5)), primary_ttft_s=rng.uniform(0.1, 0.5)
        )
        for i in range(80)
    ]


async def test_window_widens_to_old_calls_and_version_increments(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings(min_samples=50, window_s=3600, max_window_s=86400)
    # 80 calls 2.5 to 3.5 hours old: the window must double twice (1 h -> 2 h -> 4 h)
    old = _old_calls(call_factory)
    await _store(sessionmaker, old, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["window_s"] == 4 * 3600 and row["samples"] == 80
    # the first publication takes the objective's value at once (no step from the default)
    first = row["hedge_after_s"]
    assert first < 2.0 and first == round(row["details"]["objective"]["chosen_s"], 4)  # 0.1 ms resolution
    assert row["reason"].split(",")[0] in {"budget_bound", "tail_min", "cost_tie"}
    # the same data a tick later: the same choice (or the rounded value held), nothing applied
    [row2] = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=1))
    assert row2["previous_hedge_after_s"] == first and row2["hedge_after_s"] == first
    assert row2["reason"] in {row["reason"], "hysteresis_hold"} and row2["applied"] is False
    async with sessionmaker() as session:
        threshold = (await session.scalars(select(Threshold))).one()
    assert threshold.version == 1 and threshold.hedge_after_s == first


async def test_calls_after_now_are_ignored_and_each_route_is_separate(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    await _store(
        sessionmaker,
        [
            call_factory("late", started_at=NOW + timedelta(seconds=5)),
            call_factory("a1", route="a", started_at=NOW - timedelta(seconds=5)),
            call_factory("b1", route="b", model="x", started_at=NOW - timedelta(seconds=5)),
        ],
        settings,
    )
    rows = await run_tick(sessionmaker, settings, now=NOW)
    assert [(r["route"], r["model"], r["samples"]) for r in rows] == [
        ("a", "m1", 1),
        ("b", "x", 1),
        ("summarize", "m1", 0),
    ]
    assert rows[2]["p50_s"] is None and rows[2]["observed_hedge_rate"] is None


def _failover(call_factory: CallFactory, request_id: str, started_at: datetime) -> CallRecord:
    """A call whose primary failed (503) before its first token and whose failover backup won."""
    from hedgerow.client.records import AttemptRecord, CallRecord

    return CallRecord(
        request_id,
        "summarize",
        "m1",
        started_at,
        client="test",
        hedged=True,
        hedge_reason="primary_error",
        winner="backup",
        ttft_s=0.4,
        ttfo_s=0.4,
        e2e_s=1.4,
        completion_tokens=20,
        attempts=(
            AttemptRecord("a", "primary", 0.0, None, 0.01, "failed", 503, "http_503", 0),
            AttemptRecord("b", "backup", 0.01, 0.4, 1.4, "won", 200, None, 20),
        ),
    )


async def test_failovers_are_not_hedges_in_the_observed_rate(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    normal = [
        call_factory(f"n{i}", started_at=NOW - timedelta(seconds=30 + i), primary_ttft_s=0.3 + i / 100)
        for i in range(80)
    ]
    failovers = [_failover(call_factory, f"f{i}", NOW - timedelta(seconds=20 + i)) for i in range(20)]
    await _store(sessionmaker, normal + failovers, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["observed_hedge_rate"] == 0.0 and row["backup_win_rate"] is None
    assert row["samples"] == 80  # failed primaries are not TTFT samples
    assert "raise_over_budget" not in row["reason"]


async def test_a_recent_hedge_burst_holds_the_value_instead_of_lowering_it(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # An hour-old calm period (fast primaries, so the target is low) and, in the last two minutes,
    # 30 calls of which 30% hedged: over the 10% budget in the short window, so no lowering now.
    settings = Settings(short_window_s=300.0, min_samples=50)
    old = [
        call_factory(f"o{i}", started_at=NOW - timedelta(seconds=3000 - i), primary_ttft_s=0.2 + i / 1000)
        for i in range(100)
    ]
    recent = []
    for i in range(30):
        started = NOW - timedelta(seconds=100 - i)
        if i % 10 < 3:
            recent.append(
                call_factory(f"r{i}", started_at=started, primary_ttft_s=0.9, hedge_after_s=0.5, backup_ttft_s=0.6)
            )
        else:
            recent.append(call_factory(f"r{i}", started_at=started, primary_ttft_s=0.25))
    await _store(sessionmaker, old + recent, settings)
    async with sessionmaker() as session, session.begin():
        from hedgerow.controller.store.models import Route, Threshold

        route = await session.scalar(select(Route))
        assert route is not None
        session.add(
            Threshold(
                route_id=route.id,
                hedge_after_s=1.0,
                enabled=True,
                source="controller",
                version=1,
                updated_at=NOW - timedelta(seconds=600),
            )
        )
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["previous_hedge_after_s"] == 1.0
    # the objective would lower to 0.9 s; the short window's 30% were hedged at 0.5 s, below the
    # value under test, and none of their primaries waited past 0.9 s: no evidence against it
    test = row["details"]["over_budget_test"]
    assert (test["samples"], test["known_over"], test["over_budget"]) == (30, 0, False)
    assert test["value_s"] == pytest.approx(0.9, rel=2 * MAX_RELATIVE_ERROR)  # the tick reads buckets
    # but 0.9 s predicts no better tail than 1.0 s: held
    assert row["reason"] == "hysteresis_hold" and row["hedge_after_s"] == 1.0


def _primary_durations(records: list[CallRecord]) -> list[float]:
    """Each record's primary sample: its TTFT, or the time it was cancelled at (censored)."""
    out = []
    for r in records:
        a = r.attempts[0]
        if a.first_token_s is not None:
            out.append(a.first_token_s - a.start_s)
        elif a.outcome == "cancelled":
            out.append(a.end_s - a.start_s)
    return out


async def test_unidentified_quantiles_are_null_with_a_lower_bound_in_details(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # Hedging at 1.0 s with a fast backup (mean 0.1 s) censors almost every primary slower than
    # ~1.1 s: the KM curve stops near F = 0.67, so P75..P99 are not identified.
    settings = Settings()
    rng = random.Random(11)
    records = []
    for i in range(400):
        started = NOW - timedelta(seconds=rng.uniform(1.0, 3000.0))
        primary = rng.expovariate(1.0)
        if primary > 1.0:
            records.append(
                call_factory(
                    f"u{i}",
                    started_at=started,
                    primary_ttft_s=primary,
                    hedge_after_s=1.0,
                    backup_ttft_s=rng.expovariate(10.0),
                )
            )
        else:
            records.append(call_factory(f"u{i}", started_at=started, primary_ttft_s=primary))
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["p50_s"] is not None and row["p99_s"] is None and row["p95_s"] is None
    missing = [name for name in ("p50_s", "p75_s", "p90_s", "p95_s", "p99_s") if row[name] is None]
    # the tick reads bucketed durations: the largest is the bucket value of the longest one
    bound = max(_primary_durations(records))
    bounds = row["details"]["quantile_lower_bounds_s"]
    assert set(bounds) == set(missing) and all(row["p50_s"] < b <= bound * BUCKET_RATIO for b in bounds.values())
    assert bound <= bounds["p99_s"] <= bound * BUCKET_RATIO
    # censored above ~1.1 s, but the default 2.0 s (nothing published yet) is above every
    # censoring time: the data cannot inform a higher value, so it is held (policy rule 3)
    assert row["details"]["target_s"] is None and row["reason"].startswith("censored_hold")
    async with sessionmaker() as session:
        [stored] = await get_history(session, "summarize", "m1")
    assert stored["details"] == row["details"]  # the JSON column round-trips


async def test_identified_quantiles_have_no_lower_bound(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    records = [
        call_factory(f"i{i}", started_at=NOW - timedelta(seconds=10 + i), primary_ttft_s=0.1 + i / 200)
        for i in range(200)
    ]
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["p99_s"] is not None and "quantile_lower_bounds_s" not in row["details"]
    short = row["details"]["short_window"]
    # the older calls are slower (TTFT grows with age): the log-rank test places a change 2
    # minutes ago, and the short window then holds only the 110 calls since it
    assert row["details"]["drift"]["since_s"] == 120.0
    assert (short["window_s"], short["hedge_rate"]) == (120.0, 0.0)
    assert abs(short["calls"] - 110) <= 30  # minutes belong to a window by their middle
    assert short["target_s"] is not None  # 110 calls in the short window: its own KM target
    assert row["details"]["target_s"] == pytest.approx(row["p90_s"], rel=0.1)
    assert row["actor"] is None


def _hedged_calls(
    call_factory: CallFactory, prefix: str, n: int, *, backup_mean_s: float, seed: int, age_s: float = 3000.0
) -> list[CallRecord]:
    """Primaries ~ Exp(mean 1 s) hedged at 1.0 s; the backup's TTFT ~ Exp(mean ``backup_mean_s``)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        started = NOW - timedelta(seconds=rng.uniform(1.0, age_s))
        primary = rng.expovariate(1.0)
        if primary > 1.0:
            out.append(
                call_factory(
                    f"{prefix}{i}",
                    started_at=started,
                    primary_ttft_s=primary,
                    hedge_after_s=1.0,
                    backup_ttft_s=rng.expovariate(1.0 / backup_mean_s),
                )
            )
        else:
            out.append(call_factory(f"{prefix}{i}", started_at=started, primary_ttft_s=primary))
    return out


async def test_hedges_that_help_lower_p99_and_are_not_flagged(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    records = _hedged_calls(call_factory, "g", 1500, backup_mean_s=0.3, seed=3)
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    check = row["details"]["p99_check"]
    call_ttfts = sorted(_not_none(r.ttft_s) for r in records)
    raw_p99_s = call_ttfts[math.ceil(0.99 * len(call_ttfts)) - 1]
    assert raw_p99_s <= check["call_p99_s"] <= raw_p99_s * BUCKET_RATIO  # read at its bucket's end
    # the slow primaries were cancelled, so the primary's P99 is censored: its lower bound is used
    assert row["p99_s"] is None and check["primary_p99_is_lower_bound"] is True
    assert check["primary_p99_s"] == row["details"]["quantile_lower_bounds_s"]["p99_s"]
    assert check["call_ttft_samples"] == 1500
    assert check["call_p99_s"] < 0.8 * check["primary_p99_s"] and check["flagged"] is False
    assert "hedges_did_not_lower_p99" not in row["reason"]


async def test_hedges_that_never_win_are_flagged_twice(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # The backup shares the primary's slow queue (mean 30 s): it never wins, the app's P99 is the
    # primary's P99, so both flags fire.
    settings = Settings()
    records = _hedged_calls(call_factory, "s", 1500, backup_mean_s=30.0, seed=4)
    assert sum(r.winner == "backup" for r in records) <= 25
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    check = row["details"]["p99_check"]
    assert check["flagged"] is True and check["call_p99_s"] >= 0.95 * check["primary_p99_s"]
    assert "hedges_did_not_lower_p99" in row["reason"].split(",")
    assert "backups_rarely_win" in row["reason"].split(",")


async def test_counts_use_the_widened_window(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # 60 calls 2.5-3.5 h old, 20 of them hedged: the window widens 1 h -> 2 h -> 4 h, and the hedge
    # rate, backup win rate and P99 check must be computed over those 4 h, not over the first hour.
    settings = Settings(min_samples=50, min_hedges_for_flag=5)
    rng = random.Random(9)
    records = []
    for i in range(60):
        started = NOW - timedelta(hours=rng.uniform(2.5, 3.5))
        if i % 3 == 0:
            records.append(
                call_factory(
                    f"w{i}",
                    started_at=started,
                    primary_ttft_s=3.0,
                    hedge_after_s=1.0,
                    backup_ttft_s=0.5 if i % 2 == 0 else 5.0,
                )
            )
        else:
            records.append(call_factory(f"w{i}", started_at=started, primary_ttft_s=rng.uniform(0.2, 0.8)))
    recent = [
        call_factory(f"r{i}", started_at=NOW - timedelta(seconds=30 + i), primary_ttft_s=0.3) for i in range(5)
    ]  # a few calls in the first hour: too few to stop the widening
    await _store(sessionmaker, records + recent, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["window_s"] == 4 * 3600 and row["samples"] == 65
    hedged = [r for r in records if r.hedged]
    assert len(hedged) == 20
    assert row["observed_hedge_rate"] == pytest.approx(20 / 65)
    assert row["backup_win_rate"] == pytest.approx(sum(r.winner == "backup" for r in hedged) / 20)
    assert row["details"]["p99_check"]["call_ttft_samples"] == 65
    assert row["details"]["p99_check"]["hedges"] == 20


async def test_worked_number_in_module_docstring(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    settings = Settings()
    rng = random.Random(1)
    records = []
    for i in range(2000):
        started = NOW - timedelta(seconds=rng.uniform(1.0, 3000.0))
        primary = rng.expovariate(1.0)
        if primary > 1.5:
            records.append(
                call_factory(
                    f"h{i}",
                    started_at=started,
                    primary_ttft_s=primary,
                    hedge_after_s=1.5,
                    backup_ttft_s=rng.expovariate(2.0),
                )
            )
        else:
            records.append(call_factory(f"h{i}", started_at=started, primary_ttft_s=primary))
    await _store(sessionmaker, records, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert (row["samples"], row["censored"], row["observed_hedge_rate"]) == (2000, 324, 0.2395)
    uncensored = [r.attempts[0].first_token_s for r in records if r.attempts[0].first_token_s is not None]
    assert float(np.quantile(uncensored, 0.9, method="inverted_cdf")) == pytest.approx(1.465, abs=5e-4)
    assert (round(row["p50_s"], 3), round(row["p90_s"], 3), row["p95_s"], row["p99_s"]) == (0.724, 2.512, None, None)
    # the tick reads minute aggregates: each figure at or above the raw samples' KM, within a bucket
    raw = estimate_ttft(
        np.asarray(_primary_durations(records)),
        np.asarray([r.attempts[0].first_token_s is None for r in records]),
        budget=0.10,
    )
    for name in ("p50_s", "p90_s"):
        assert getattr(raw, name) <= row[name] <= getattr(raw, name) * BUCKET_RATIO, name
    assert raw.target_s <= row["details"]["target_s"] <= raw.target_s * BUCKET_RATIO
    assert raw.p90_s is not None and raw.p95_s is not None and raw.target_s is not None
    assert (round(raw.p90_s, 3), round(raw.p95_s, 3), round(raw.target_s, 3)) == (2.402, 2.754, 2.535)
    # the buckets' curve lies above the raw one: it does not reach 0.95, and P95's lower bound
    # (2.630 s) is below the raw estimate
    p95_bound_s = row["details"]["quantile_lower_bounds_s"]["p95_s"]
    assert p95_bound_s == pytest.approx(2.630, abs=5e-4) and p95_bound_s < raw.p95_s
    # a one-sided 95% lower bound on the unidentified P99 (true P99 = ln 100 = 4.605 s)
    assert row["details"]["quantile_lower_bounds_s"]["p99_s"] == pytest.approx(P99_BOUND_S, abs=5e-4)
    assert row["details"]["quantile_lower_bounds_s"]["p99_s"] < math.log(100)
    assert row["details"]["target_s"] == pytest.approx(2.630, abs=5e-4)
    assert math.exp(-row["details"]["target_s"]) == pytest.approx(0.072, abs=5e-4)
    # the objective: the predicted call P99 is lowest at the budget's edge (3.527 s); 2.699 s
    # predicts 3.595 s, within the 2% tolerance, with fewer hedges
    obj = row["details"]["objective"]
    assert obj["backup_curve"] == "backup" and obj["bucket_replay"]
    assert obj["predicted_min_tail_s"] == pytest.approx(3.527, abs=5e-4)
    assert obj["predicted_tail_at_budget_target_s"] == obj["predicted_min_tail_s"]
    assert obj["predicted_tail_at_chosen_s"] == pytest.approx(3.595, abs=5e-4)
    assert obj["win_probability_at_chosen"] == pytest.approx(0.923, abs=5e-4)  # observed at 1.5 s: 0.676
    assert row["hedge_after_s"] == pytest.approx(2.6985, abs=5e-5) and row["reason"] == "cost_tie"
    assert row["details"]["binding"] == "cost"
    # the short window's hedges fired at 1.5 s, below 2.699 s: only 1 of its 199 primaries is
    # known to have waited past 2.699 s, far from evidence of over budget
    test = row["details"]["over_budget_test"]
    assert (test["samples"], test["known_over"], test["over_budget"]) == (199, 1, False)
    assert row["details"]["wanted_hedge_rate"] == 0.2395
    short = row["details"]["short_window"]
    assert short["calls"] == 199 and short["hedge_rate"] == pytest.approx(0.201, abs=5e-4)
    assert short["target_s"] is None  # the short window's budget quantile is censored
    check = row["details"]["p99_check"]
    assert check["call_p99_s"] == pytest.approx(2.630, abs=5e-4) and check["flagged"] is False


async def test_a_slowdown_in_the_short_window_raises_to_its_own_target_at_once(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # 55 minutes of 1,500 fast primaries (0.2-0.6 s) and a published 1.0 s; then, in the last 4 minutes,
    # 60 primaries take 2.5-3.5 s: every one hedges at 1.0 s (a slow backup, so the primary still
    # wins and its TTFT is observed). The hour's target lags; the short window's does not.
    settings = Settings()
    rng = random.Random(21)
    old = [
        call_factory(
            f"o{i}", started_at=NOW - timedelta(seconds=rng.uniform(400, 3300)), primary_ttft_s=rng.uniform(0.2, 0.6)
        )
        for i in range(1500)
    ]
    slow = [
        call_factory(
            f"s{i}",
            started_at=NOW - timedelta(seconds=rng.uniform(1, 240)),
            primary_ttft_s=rng.uniform(2.5, 3.5),
            hedge_after_s=1.0,
            backup_ttft_s=5.0,
        )
        for i in range(60)
    ]
    await _store(sessionmaker, old + slow, settings)
    async with sessionmaker() as session, session.begin():
        from hedgerow.controller.store.models import Route, Threshold

        route = await session.scalar(select(Route))
        assert route is not None
        session.add(
            Threshold(
                route_id=route.id,
                hedge_after_s=1.0,
                enabled=True,
                source="controller",
                version=1,
                updated_at=NOW - timedelta(seconds=600),
            )
        )
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    short = row["details"]["short_window"]
    assert short["calls"] == 60 and short["hedge_rate"] == 1.0
    # the log-rank test finds the change: the window shrinks to the last 5 minutes
    drift = row["details"]["drift"]
    assert row["window_s"] == 300.0 and drift["since_s"] == 300.0 and drift["recent_samples"] == 60
    assert drift["median_ratio"] > 5 and drift["p_value"] < 1e-6
    codes = row["reason"].split(",")
    assert "drift_window" in codes and 2.5 < row["hedge_after_s"] <= 3.5 * BUCKET_RATIO
    assert (
        row["hedge_after_s"] >= round(row["details"]["target_s"], 4) and row["details"]["target_s"] == short["target_s"]
    )
    assert "backups_rarely_win" in codes  # the slow backup never won


async def test_backup_samples_and_denied_hedges_reach_the_decision(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # drift detection off: the 60 slow denied calls of the last 4 minutes would (rightly) be
    # detected as a change and shrink the window, which is not what this test is about
    settings = Settings(drift_alpha=0.0)
    records = _hedged_workload(call_factory, 1500, seed=4, hedge_after_s=1.5)
    # 60 calls in the last 4 minutes whose hedge the client's bucket denied (primary only, 2 s)
    denied = [
        dataclasses.replace(
            call_factory(f"d{i}", started_at=NOW - timedelta(seconds=5 + 4 * i), primary_ttft_s=2.0),
            hedge_after_s=1.5,
            hedge_denied=True,
        )
        for i in range(60)
    ]
    await _store(sessionmaker, records + denied, settings)
    hedged = [r for r in records if r.hedged]
    expected_backup = sorted(
        (b.first_token_s if b.first_token_s is not None else b.end_s) - b.start_s
        for r in hedged
        for b in r.attempts
        if b.role == "backup"
    )
    async with sessionmaker() as session:
        backups = await backup_samples(session, 1, NOW - timedelta(hours=1), NOW)
    assert sorted(backups.durations_s) == pytest.approx(expected_backup)
    assert sum(backups.censored) == sum(1 for r in hedged if r.winner == "primary")

    [row] = await run_tick(sessionmaker, settings, now=NOW)
    calls = len(records) + 60
    assert row["observed_hedge_rate"] == pytest.approx(len(hedged) / calls)  # the real hedge rate
    assert row["details"]["wanted_hedge_rate"] == pytest.approx((len(hedged) + 60) / calls)
    short = row["details"]["short_window"]
    assert short["wanted_rate"] > short["hedge_rate"]
    obj = row["details"]["objective"]
    assert obj["backup_curve"] == "backup"
    assert obj["budget_target_s"] == row["details"]["target_s"]
    assert obj["chosen_s"] >= obj["budget_target_s"]


async def test_few_calls_with_little_censoring_hold_over_ticks(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # The ops review's repro on the store: 120 calls in the last 10 minutes, lognormal primary
    # TTFT, hedged at 2.0 s, a few primaries censored, budget 0.05. Before the fix each tick
    # doubled the threshold on unchanged data (2 -> 4 -> 8 -> 16 -> 30 s).
    settings = Settings(default_budget=0.05, default_hedge_after_s=2.0)
    for seed in range(100):
        rng = random.Random(seed)
        records = []
        for i in range(120):
            started = NOW - timedelta(seconds=rng.uniform(1.0, 600.0))
            primary, backup = rng.lognormvariate(-0.5, 0.8), rng.lognormvariate(-0.5, 0.8)
            if primary > 2.0:
                records.append(
                    call_factory(
                        f"r{i}", started_at=started, primary_ttft_s=primary, hedge_after_s=2.0, backup_ttft_s=backup
                    )
                )
            else:
                records.append(call_factory(f"r{i}", started_at=started, primary_ttft_s=primary))
        if sum(r.attempts[0].first_token_s is None for r in records) == 3:
            break
    await _store(sessionmaker, records, settings)
    rows = [(await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=60 * k)))[0] for k in range(4)]
    # the tick reads bucketed durations: those in the bucket holding 2.0 s (1.995-2.089 s) count
    # at its value, 2.042 s, so the first tick may raise to what the samples support; then held
    values = [r["hedge_after_s"] for r in rows]
    assert values == [values[0]] * 4 and 2.0 <= values[0] <= 2.2
    assert rows[0]["reason"].split(",")[0] in ("too_few_samples", "small_sample_raise", "censored_raise")
    assert not any(r["applied"] for r in rows[1:])
    assert rows[0]["censored"] == 3 and rows[0]["samples"] == 120 and rows[0]["p95_s"] is not None


class _ChangeBeforePublish:
    """A real sessionmaker that, when the ``publish_at``-th session is opened (the publish of
    :func:`tick_route`: its sessions are observe, then publish), first runs ``change`` (an
    operator's change that lands after the tick decided and before it publishes)."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], change: Callable[[], Awaitable[None]], publish_at: int = 2
    ) -> None:
        self._sessionmaker = sessionmaker
        self._change = change
        self._publish_at = publish_at
        self.opened = 0

    def __call__(self) -> _Hooked:
        self.opened += 1
        return _Hooked(self._sessionmaker(), self._change if self.opened == self._publish_at else None)


class _Hooked:
    def __init__(self, session: AsyncSession, change: Callable[[], Awaitable[None]] | None) -> None:
        self._session = session
        self._change = change

    async def __aenter__(self) -> AsyncSession:
        if self._change is not None:
            await self._change()
        return await self._session.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._session.__aexit__(*exc_info)


_OPERATOR_CHANGES = pytest.mark.parametrize(
    ("change", "expected"),
    [({"pinned_hedge_after_s": 7.0}, (7.0, True, "pinned")), ({"enabled": False}, (None, False, "disabled"))],
    ids=["pin", "disable"],
)


async def _published_route(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory, settings: Settings
) -> float:
    """300 fast calls stored and one tick run: the value it published (under the 2 s default)."""
    records = [
        call_factory(f"c{i}", started_at=NOW - timedelta(seconds=10 + i), primary_ttft_s=0.1 + i / 500)
        for i in range(300)
    ]
    await _store(sessionmaker, records, settings)
    [first] = await run_tick(sessionmaker, settings, now=NOW)
    assert first["hedge_after_s"] < 2.0
    return float(first["hedge_after_s"])


@_OPERATOR_CHANGES
async def test_a_route_change_between_decide_and_publish_is_not_overwritten(
    sessionmaker: async_sessionmaker[AsyncSession],
    call_factory: CallFactory,
    change: dict[str, object],
    expected: tuple[float | None, bool, str],
) -> None:
    from hedgerow.controller.jobs import tick_route
    from hedgerow.controller.routes_admin import configure_route
    from hedgerow.controller.store.models import Route

    settings = Settings(default_hedge_after_s=2.0)
    published = await _published_route(sessionmaker, call_factory, settings)
    # the tick reads the route and its value, decides ...
    async with sessionmaker() as session:
        route = (await session.scalars(select(Route))).one()
    later = NOW + timedelta(seconds=60)

    async def operator_change() -> None:  # ... an operator's change lands here ...
        await configure_route(sessionmaker, settings, "summarize", "m1", change, replace=False, actor="ops", now=later)

    hooked = _ChangeBeforePublish(sessionmaker, operator_change)
    row = await tick_route(hooked, settings, route, published, now=later + timedelta(seconds=1))  # type: ignore[arg-type]  # a sessionmaker stand-in
    value, enabled, source = expected
    value = published if value is None else value
    assert (row["hedge_after_s"], row["source"], row["previous_hedge_after_s"]) == (value, source, value)
    async with sessionmaker() as session:
        threshold = (await session.scalars(select(Threshold))).one()
        history = list(reversed(await get_history(session, "summarize", "m1", limit=10)))
    assert (threshold.hedge_after_s, threshold.enabled, threshold.source) == (value, enabled, source)
    assert threshold.version == 2  # v1 = 1.5 by the first tick, v2 = the operator's change
    assert hooked.opened >= 3  # the tick saw the change at publish and decided again
    assert [h["reason"].split(",")[0] for h in history[1:]] == ["config", source]
    # the history is a chain: each row's previous value is what the row before published
    assert history[0]["previous_hedge_after_s"] is None
    for before, after in itertools.pairwise(history):
        assert after["previous_hedge_after_s"] == before["hedge_after_s"]


@_OPERATOR_CHANGES
async def test_a_route_change_before_the_ticks_shared_publish_is_decided_again_under_the_lock(
    sessionmaker: async_sessionmaker[AsyncSession],
    call_factory: CallFactory,
    change: dict[str, object],
    expected: tuple[float | None, bool, str],
) -> None:
    from hedgerow.controller.routes_admin import configure_route

    settings = Settings(default_hedge_after_s=2.0)
    published = await _published_route(sessionmaker, call_factory, settings)
    later = NOW + timedelta(seconds=60)

    async def operator_change() -> None:
        await configure_route(sessionmaker, settings, "summarize", "m1", change, replace=False, actor="ops", now=later)

    # run_tick's sessions: 1 lists the routes, 2 observes the one route, 3 publishes every route
    hooked = _ChangeBeforePublish(sessionmaker, operator_change, publish_at=3)
    [row] = await run_tick(hooked, settings, now=later + timedelta(seconds=1))  # type: ignore[arg-type]  # a sessionmaker stand-in
    value, enabled, source = expected
    value = published if value is None else value
    assert (row["hedge_after_s"], row["source"], row["previous_hedge_after_s"]) == (value, source, value)
    assert hooked.opened == 3  # decided again inside the publish transaction, under the lock
    async with sessionmaker() as session:
        threshold = (await session.scalars(select(Threshold))).one()
        history = list(reversed(await get_history(session, "summarize", "m1", limit=10)))
    assert (threshold.hedge_after_s, threshold.enabled, threshold.source, threshold.version) == (
        value,
        enabled,
        source,
        2,
    )
    assert [h["reason"].split(",")[0] for h in history[1:]] == ["config", source]
    for before, after in itertools.pairwise(history):
        assert after["previous_hedge_after_s"] == before["hedge_after_s"]


async def test_a_failed_shared_publish_falls_back_to_one_transaction_per_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    call_factory: CallFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hedgerow.controller import jobs

    settings = Settings(default_hedge_after_s=2.0)
    records = [
        call_factory(f"{route}-{i}", route=route, started_at=NOW - timedelta(seconds=10 + i), primary_ttft_s=0.2)
        for route in ("a", "b")
        for i in range(50)
    ]
    await _store(sessionmaker, records, settings)

    async def broken(*args: object, **kwargs: Any) -> NoReturn:
        raise RuntimeError("the shared write failed")

    monkeypatch.setattr(jobs, "_publish_all", broken)
    rows = await run_tick(sessionmaker, settings, now=NOW)
    assert [r["route"] for r in rows] == ["a", "b"]
    assert "publishing route by route" in caplog.text
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(ThresholdHistory)) == 2
        assert await session.scalar(select(func.count()).select_from(Threshold)) == 2


async def test_a_change_of_source_alone_bumps_the_version(
    sessionmaker: async_sessionmaker[AsyncSession], call_factory: CallFactory
) -> None:
    # a value published as cold_start that the objective then keeps: the row the api serves
    # changes (source), so its version must too, or a client comparing versions misses it
    settings = Settings(min_samples=50, window_s=3600, max_window_s=86400)
    old = _old_calls(call_factory)
    await _store(sessionmaker, old, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["source"] == "controller"
    async with sessionmaker() as session, session.begin():
        threshold = (await session.scalars(select(Threshold))).one()
        threshold.source = "cold_start"  # as if the same value had been published cold
    [again] = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=1))
    assert again["hedge_after_s"] == row["hedge_after_s"] and again["source"] == "controller"
    async with sessionmaker() as session:
        threshold = (await session.scalars(select(Threshold))).one()
        served = (await list_thresholds(session))[0]
    assert (threshold.source, threshold.version) == ("controller", 2)
    assert (served["source"], served["version"]) == ("controller", 2)
    # nothing served changes on the next tick: the version stays
    await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=2))
    async with sessionmaker() as session:
        assert (await session.scalars(select(Threshold))).one().version == 2
