"""The controller tick on recorded data: censored primaries, window widening, versions, history."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone

import numpy as np
from sqlalchemy import func, select

from hedgerow.controller.ingest import ingest_calls, route_defaults
from hedgerow.controller.jobs import run_tick
from hedgerow.controller.models import Threshold, ThresholdHistory
from hedgerow.controller.queries import HISTORY_FIELDS, get_history, list_thresholds
from hedgerow.settings import Settings

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


async def _store(sessionmaker, records, settings) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(settings))


def _hedged_workload(call_factory, n: int, *, seed: int, hedge_after_s: float, age_s: float = 3000.0):
    """Primaries with TTFT ~ Exp(mean 1 s); a backup starts at ``hedge_after_s`` (TTFT ~ Exp(0.5 s))."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        started = NOW - timedelta(seconds=rng.uniform(1.0, age_s))
        primary = rng.expovariate(1.0)
        if primary > hedge_after_s:
            records.append(call_factory(f"h{seed}-{i}", started_at=started, primary_ttft_s=primary,
                                        hedge_after_s=hedge_after_s, backup_ttft_s=rng.expovariate(2.0)))
        else:
            records.append(call_factory(f"h{seed}-{i}", started_at=started, primary_ttft_s=primary))
    return records


async def test_tick_with_censored_primaries_finds_the_budget_quantile(sessionmaker, call_factory) -> None:
    settings = Settings()
    records = _hedged_workload(call_factory, 3000, seed=1, hedge_after_s=1.5)
    failed = [call_factory(f"f{i}", started_at=NOW - timedelta(seconds=60 + i), primary_ttft_s=None)
              for i in range(300)]
    await _store(sessionmaker, records + failed, settings)
    censored_primaries = sum(1 for r in records if r.attempts[0].first_token_s is None)
    uncensored = [r.attempts[0].ttft_s for r in records if r.attempts[0].first_token_s is not None]
    naive_p90 = float(np.quantile(uncensored, 0.9))
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


async def test_too_few_samples_publishes_default_and_history_always_written(sessionmaker, call_factory) -> None:
    settings = Settings(default_hedge_after_s=2.0)
    await _store(sessionmaker, [call_factory(f"x{i}", started_at=NOW - timedelta(seconds=10 + i))
                                for i in range(10)], settings)
    first = await run_tick(sessionmaker, settings, now=NOW)
    second = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=60))
    assert [r["hedge_after_s"] for r in first + second] == [2.0, 2.0]
    assert first[0]["reason"].startswith("too_few_samples") and first[0]["source"] == "default"
    assert first[0]["applied"] and not second[0]["applied"]
    assert second[0]["previous_hedge_after_s"] == 2.0
    # the window widened all the way while there were too few samples
    assert first[0]["window_s"] == settings.max_window_s and first[0]["samples"] == 10
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(ThresholdHistory)) == 2
        threshold = (await session.scalars(select(Threshold))).one()
        history = await get_history(session, "summarize", "m1", limit=10)
    assert threshold.version == 1  # value unchanged: same version
    assert [h["computed_at"] for h in history] == [
        "2026-11-29T12:01:00.000000Z", "2026-11-29T12:00:00.000000Z"]  # newest first


async def test_window_widens_to_old_calls_and_version_increments(sessionmaker, call_factory) -> None:
    settings = Settings(min_samples=50, window_s=3600, max_window_s=86400)
    rng = random.Random(7)
    # 80 calls 2.5 to 3.5 hours old: the window must double twice (1 h -> 2 h -> 4 h)
    old = [call_factory(f"o{i}", started_at=NOW - timedelta(hours=rng.uniform(2.5, 3.5)),
                        primary_ttft_s=rng.uniform(0.1, 0.5)) for i in range(80)]
    await _store(sessionmaker, old, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["window_s"] == 4 * 3600 and row["samples"] == 80
    assert row["hedge_after_s"] < 2.0  # lowered from the default, by a bounded step
    assert "step_down_limited" in row["reason"] and row["hedge_after_s"] == 2.0 * 0.75
    [row2] = await run_tick(sessionmaker, settings, now=NOW + timedelta(seconds=1))
    assert row2["previous_hedge_after_s"] == 1.5 and row2["hedge_after_s"] == 1.5 * 0.75
    async with sessionmaker() as session:
        threshold = (await session.scalars(select(Threshold))).one()
    assert threshold.version == 2 and threshold.hedge_after_s == 1.125
    assert threshold.updated_at == NOW + timedelta(seconds=1)


async def test_calls_after_now_are_ignored_and_each_route_is_separate(sessionmaker, call_factory) -> None:
    settings = Settings()
    await _store(sessionmaker, [
        call_factory("late", started_at=NOW + timedelta(seconds=5)),
        call_factory("a1", route="a", started_at=NOW - timedelta(seconds=5)),
        call_factory("b1", route="b", model="x", started_at=NOW - timedelta(seconds=5)),
    ], settings)
    rows = await run_tick(sessionmaker, settings, now=NOW)
    assert [(r["route"], r["model"], r["samples"]) for r in rows] == [
        ("a", "m1", 1), ("b", "x", 1), ("summarize", "m1", 0)]
    assert rows[2]["p50_s"] is None and rows[2]["observed_hedge_rate"] is None


def _failover(call_factory, request_id: str, started_at: datetime):
    """A call whose primary failed (503) before its first token and whose failover backup won."""
    from hedgerow.client.records import AttemptRecord, CallRecord

    return CallRecord(
        request_id, "summarize", "m1", started_at, client="test", hedged=True, hedge_reason="primary_error",
        winner="backup", ttft_s=0.4, ttfo_s=0.4, e2e_s=1.4, completion_tokens=20,
        attempts=(AttemptRecord("a", "primary", 0.0, None, 0.01, "failed", 503, "http_503", 0),
                  AttemptRecord("b", "backup", 0.01, 0.4, 1.4, "won", 200, None, 20)),
    )


async def test_failovers_are_not_hedges_in_the_observed_rate(sessionmaker, call_factory) -> None:
    settings = Settings()
    normal = [call_factory(f"n{i}", started_at=NOW - timedelta(seconds=30 + i), primary_ttft_s=0.3 + i / 100)
              for i in range(80)]
    failovers = [_failover(call_factory, f"f{i}", NOW - timedelta(seconds=20 + i)) for i in range(20)]
    await _store(sessionmaker, normal + failovers, settings)
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["observed_hedge_rate"] == 0.0 and row["backup_win_rate"] is None
    assert row["samples"] == 80  # failed primaries are not TTFT samples
    assert "raise_over_budget" not in row["reason"]


async def test_a_recent_hedge_burst_holds_the_value_instead_of_lowering_it(sessionmaker, call_factory) -> None:
    # An hour-old calm period (fast primaries, so the target is low) and, in the last two minutes,
    # 30 calls of which 30% hedged: over the 10% budget in the short window, so no lowering now.
    settings = Settings(short_window_s=300.0, min_samples=50)
    old = [call_factory(f"o{i}", started_at=NOW - timedelta(seconds=3000 - i), primary_ttft_s=0.2 + i / 1000)
           for i in range(100)]
    recent = []
    for i in range(30):
        started = NOW - timedelta(seconds=100 - i)
        if i % 10 < 3:
            recent.append(call_factory(f"r{i}", started_at=started, primary_ttft_s=0.9, hedge_after_s=0.5,
                                       backup_ttft_s=0.6))
        else:
            recent.append(call_factory(f"r{i}", started_at=started, primary_ttft_s=0.25))
    await _store(sessionmaker, old + recent, settings)
    async with sessionmaker() as session, session.begin():
        from hedgerow.controller.models import Route, Threshold

        route = await session.scalar(select(Route))
        session.add(Threshold(route_id=route.id, hedge_after_s=1.0, enabled=True, source="controller",
                              version=1, updated_at=NOW - timedelta(seconds=600)))
    [row] = await run_tick(sessionmaker, settings, now=NOW)
    assert row["previous_hedge_after_s"] == 1.0
    assert row["reason"].startswith("over_budget_hold") and row["hedge_after_s"] == 1.0
