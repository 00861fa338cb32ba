"""Hourly rollups: the bucket scheme, KM quantiles over buckets, folding raw calls, merging hours."""

from __future__ import annotations

import asyncio
import math
import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.policy.estimation import estimate_ttft
from hedgerow.controller.policy.ttft_histogram import (
    BUCKET_RATIO,
    MAX_RELATIVE_ERROR,
    MIN_S,
    N_BUCKETS,
    bucket_bounds,
    bucket_index,
    bucket_value_s,
    counts_from_json,
    counts_to_json,
    histogram_of,
    km_quantile,
    merge_counts,
)
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import HourlyRollup, Route
from hedgerow.controller.store.rollups import (
    COUNTER_FIELDS,
    Rollup,
    floor_hour,
    fold_hours,
    merge_rollups,
    rollup_from_row,
)
from hedgerow.settings import Settings
from tests.controller.rollup_workload import direct_figures, make_record, workload

NOW = datetime(2026, 11, 29, 12, 20, tzinfo=UTC)
START = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)  # ten complete hours before NOW's hour


async def _store(sessionmaker: async_sessionmaker[AsyncSession], records: list[CallRecord]) -> None:
    async with sessionmaker() as session, session.begin():
        await ingest_calls(session, records, defaults=route_defaults(Settings()))


def _exact_quantile(values: Iterable[float], q: float) -> float:
    """The smallest sample t with empirical F(t) >= q (estimate_ttft's convention)."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered) - 1e-9) - 1]


# ---- the bucket scheme (no database) ----


def test_bucket_edges_and_relative_error() -> None:
    assert bucket_index(0.0) == 0 and bucket_index(0.000999) == 0
    assert bucket_index(MIN_S) == 1
    low, high = bucket_bounds(1)
    assert high is not None
    assert low == MIN_S and math.isclose(high / low, BUCKET_RATIO)
    assert bucket_index(high) == 2  # half-open [low, high)
    assert bucket_index(3600.0) == N_BUCKETS - 2 and bucket_index(4000.0) == N_BUCKETS - 1
    assert bucket_bounds(N_BUCKETS - 1)[1] is None and math.isclose(
        bucket_bounds(N_BUCKETS - 1)[0], 3630.78, rel_tol=1e-5
    )
    rng = np.random.default_rng(3)
    values = np.exp(rng.uniform(math.log(MIN_S), math.log(3600.0), 20_000))
    errors = [abs(bucket_value_s(bucket_index(v)) - v) / v for v in values]
    assert max(errors) <= MAX_RELATIVE_ERROR + 1e-12
    assert max(errors) > 0.9 * MAX_RELATIVE_ERROR  # the bound is tight, not loose
    assert math.isclose(MAX_RELATIVE_ERROR, 0.0233, abs_tol=5e-5)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_durations_are_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="ttft_s"):
        bucket_index(bad)


def test_histograms_merge_element_wise_and_round_trip_json() -> None:
    rng = random.Random(4)
    values = [rng.lognormvariate(0, 1) for _ in range(5000)]
    whole = histogram_of(values)
    parts = merge_counts(histogram_of(values[:1234]), histogram_of(values[1234:4000]), histogram_of(values[4000:]))
    assert parts == whole and sum(whole.values()) == 5000
    assert counts_from_json(counts_to_json(whole)) == whole
    with pytest.raises(ValueError, match="key 'x'"):
        counts_from_json({"x": 1})
    with pytest.raises(ValueError, match="key '999'"):
        counts_from_json({"999": 1})
    with pytest.raises(ValueError, match="non-negative"):
        counts_from_json({"3": -1})
    with pytest.raises(TypeError, match="JSON object"):
        counts_from_json([1, 2])
    with pytest.raises(ValueError, match="q must be"):
        km_quantile(whole, None, 1.0)
    assert km_quantile({}, {}, 0.5) is None


def test_uncensored_quantiles_within_half_a_bucket() -> None:
    rng = random.Random(5)
    values = [rng.lognormvariate(-0.5, 1.2) for _ in range(7919)]
    histogram = histogram_of(values)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = _exact_quantile(values, q)
        got = km_quantile(histogram, None, q)
        assert got is not None and got.value_s is not None and got.high_s is not None
        assert abs(got.value_s - exact) / exact <= MAX_RELATIVE_ERROR + 1e-12
        assert got.low_s <= exact < got.high_s
        assert math.isclose(got.high_s / got.low_s, BUCKET_RATIO)  # no censoring: one bucket


def _primary_samples(n: int, seed: int) -> tuple[list[float], list[bool]]:
    rng = random.Random(seed)
    records = [make_record(rng, f"q{i}", NOW, ("r", "m")) for i in range(n)]
    figures = direct_figures(records)
    durations = figures["observed"] + figures["censored"]
    flags = [False] * len(figures["observed"]) + [True] * len(figures["censored"])
    return durations, flags


def test_censored_km_quantiles_hold_the_exact_km_quantile() -> None:
    durations, flags = _primary_samples(20_000, seed=6)
    assert 0.05 < sum(flags) / len(flags) < 0.3  # hedging censored a good share of primaries
    exact = estimate_ttft(durations, flags)
    observed = histogram_of(d for d, c in zip(durations, flags, strict=True) if not c)
    censored = histogram_of(d for d, c in zip(durations, flags, strict=True) if c)
    for name, q in (("p50_s", 0.5), ("p75_s", 0.75), ("p90_s", 0.9), ("p95_s", 0.95)):
        truth = getattr(exact, name)
        got = km_quantile(observed, censored, q)
        assert truth is not None and got is not None and got.value_s is not None
        assert got.high_s is not None
        assert got.low_s <= truth < got.high_s, (name, truth, got)
        # the error is bounded by the interval the function reports; here at most three buckets
        assert got.high_s / got.low_s <= BUCKET_RATIO**3 * (1 + 1e-9), (name, got)
        assert abs(got.value_s - truth) / truth <= got.high_s / got.low_s - 1
        # the life-table estimate lands in the exact quantile's bucket on this much data
        assert abs(got.value_s - truth) / truth <= MAX_RELATIVE_ERROR + 1e-12, (name, truth, got)


def test_bucket_km_bound_is_the_estimation_module_on_bucket_midpoints() -> None:
    """The upper-bound curve is ``estimate_ttft`` (scipy) on every sample moved to its bucket midpoint."""
    durations, flags = _primary_samples(3000, seed=7)
    observed = histogram_of(d for d, c in zip(durations, flags, strict=True) if not c)
    censored = histogram_of(d for d, c in zip(durations, flags, strict=True) if c)
    reference = estimate_ttft([bucket_value_s(bucket_index(d)) for d in durations], flags)
    for name, q in (("p50_s", 0.5), ("p75_s", 0.75), ("p90_s", 0.9), ("p95_s", 0.95), ("p99_s", 0.99)):
        got = km_quantile(observed, censored, q)
        assert got is not None
        expected = getattr(reference, name)
        if expected is None:
            assert got.high_s is None
        else:
            assert got.value_s is not None
            assert got.high_s == bucket_bounds(bucket_index(expected))[1], name
            assert got.low_s <= got.value_s <= expected


def test_unidentified_quantile_is_none_with_a_lower_bound() -> None:
    # 100 primaries: 40 first tokens under 1 s, 60 censored at 2 s; F never passes 0.4
    observed = histogram_of([0.5] * 40)
    censored = histogram_of([2.0] * 60)
    got = km_quantile(observed, censored, 0.9)
    assert got is not None
    assert got.value_s is None and got.high_s is None
    assert got.low_s <= 2.0 and got.low_s > 1.9  # the top bucket's lower edge
    assert estimate_ttft([0.5] * 40 + [2.0] * 60, [False] * 40 + [True] * 60).p90_s is None


# ---- folding raw calls (SQLite and PostgreSQL) ----


def _by_key(records: list[CallRecord]) -> dict[tuple[str, str, datetime], list[CallRecord]]:
    grouped: defaultdict[tuple[str, str, datetime], list[CallRecord]] = defaultdict(list)
    for r in records:
        grouped[(r.route, r.model, floor_hour(r.started_at))].append(r)
    return grouped


async def _rollups(sessionmaker: async_sessionmaker[AsyncSession]) -> dict[tuple[str, str, datetime], HourlyRollup]:
    async with sessionmaker() as session:
        rows = await session.execute(
            select(Route.route, Route.model, HourlyRollup).join(Route, Route.id == HourlyRollup.route_id)
        )
        return {(route, model, row.hour_start): row for route, model, row in rows.all()}


def _check_row(row: HourlyRollup, records: list[CallRecord]) -> None:
    expected = direct_figures(records)
    rollup = rollup_from_row(row)
    for name in COUNTER_FIELDS:
        assert getattr(rollup, name) == expected[name], name
    assert row.primary_samples == len(expected["observed"]) + len(expected["censored"])
    assert row.primary_censored == len(expected["censored"])
    assert rollup.primary_ttft == histogram_of(expected["observed"])
    assert rollup.primary_censored == histogram_of(expected["censored"])
    assert rollup.call_ttft == histogram_of(expected["call_ttft"])
    assert row.max_call_id >= row.calls and row.sealed_at is None


async def test_fold_matches_a_direct_computation_and_is_idempotent(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    records = workload(1500, seed=11, start=START, span_s=10 * 3600)
    current = workload(40, seed=12, start=floor_hour(NOW), span_s=1000, prefix="now")  # incomplete hour
    await _store(sessionmaker, records + current)
    folded = await fold_hours(sessionmaker, now=NOW)
    grouped = _by_key(records)
    assert {(f.route, f.model, f.hour_start) for f in folded} == set(grouped)
    assert {f.kind for f in folded} == {"new"}
    rows = await _rollups(sessionmaker)
    assert set(rows) == set(grouped)  # the current hour is not folded
    for key, row in rows.items():
        _check_row(row, grouped[key])

    assert await fold_hours(sessionmaker, now=NOW) == []  # nothing changed: nothing written
    again = await _rollups(sessionmaker)
    assert {k: rollup_from_row(r) for k, r in again.items()} == {k: rollup_from_row(r) for k, r in rows.items()}

    # a late exporter batch lands in an hour already folded: that hour alone is recomputed
    late = workload(7, seed=13, start=START + timedelta(hours=3), span_s=3599, prefix="late", pairs=[("chat", "m1")])
    await _store(sessionmaker, late)
    refolded = await fold_hours(sessionmaker, now=NOW)
    assert [(f.route, f.model, f.hour_start, f.kind) for f in refolded] == [
        ("chat", "m1", START + timedelta(hours=3), "refolded")
    ]
    rows = await _rollups(sessionmaker)
    grouped = _by_key(records + late)
    for key, row in rows.items():
        _check_row(row, grouped[key])
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(HourlyRollup)) == len(grouped)

    # an hour later, the hour that was current is complete and gets folded too
    later = await fold_hours(sessionmaker, now=NOW + timedelta(hours=1))
    assert {f.hour_start for f in later} == {floor_hour(NOW)}


@pytest.mark.slow
async def test_a_fold_looks_only_at_the_hours_of_calls_it_has_not_seen(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    records = workload(600, seed=21, start=START, span_s=6 * 3600, pairs=[("chat", "m1")])
    await _store(sessionmaker, records)
    first = await fold_hours(sessionmaker, now=NOW)
    assert len(first) == 6
    # an old hour's rollup disappears behind the fold's back: a fold that looked at every hour
    # would make it again; one that reads only the calls since its last run does not
    gone = START + timedelta(hours=1)
    async with sessionmaker() as session, session.begin():
        await session.execute(delete(HourlyRollup).where(HourlyRollup.hour_start == gone))
    assert await fold_hours(sessionmaker, now=NOW) == []
    # a late record in another old hour brings back that hour alone
    late = workload(3, seed=22, start=START + timedelta(hours=4), span_s=3599, prefix="late", pairs=[("chat", "m1")])
    await _store(sessionmaker, late)
    assert [(f.hour_start, f.kind) for f in await fold_hours(sessionmaker, now=NOW)] == [
        (START + timedelta(hours=4), "refolded")
    ]
    # a full fold (what a process's first fold is) finds the missing hour, and nothing else
    assert [(f.hour_start, f.kind) for f in await fold_hours(sessionmaker, now=NOW, full=True)] == [(gone, "new")]
    rows = await _rollups(sessionmaker)
    grouped = _by_key(records + late)
    assert set(rows) == set(grouped)
    for key, row in rows.items():
        _check_row(row, grouped[key])


async def test_a_call_committed_after_the_fold_began_is_folded_by_the_next(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """PostgreSQL: a batch that drew its ids before a later batch committed, and commits while a
    fold runs, is not passed over by the fold's cursor (the fold waits for it)."""
    if sessionmaker.kw["bind"].dialect.name != "postgresql":
        pytest.skip("SQLite has one writer: a batch in flight always gets ids above every visible one")
    early = workload(5, seed=31, start=START, span_s=3599, prefix="early", pairs=[("chat", "m1")])
    later = workload(5, seed=32, start=START + timedelta(hours=1), span_s=3599, prefix="later", pairs=[("chat", "m1")])
    await _store(sessionmaker, workload(1, seed=33, start=START, span_s=60, prefix="route", pairs=[("chat", "m1")]))
    await fold_hours(sessionmaker, now=NOW)  # the process's first fold: the cursor is known from here on
    written = asyncio.Event()
    release = asyncio.Event()

    async def in_flight() -> None:
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, early, defaults=route_defaults(Settings()))
            written.set()
            await release.wait()

    batch = asyncio.create_task(in_flight())
    await asyncio.wait_for(written.wait(), 60)
    await _store(sessionmaker, later)  # committed, with ids above the batch in flight
    fold = asyncio.create_task(fold_hours(sessionmaker, now=NOW))
    async with sessionmaker() as session:
        for _ in range(600):  # the fold waits for the ingest lock held by the batch in flight
            waiting = await session.scalar(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            )
            await session.rollback()
            if waiting:
                break
            await asyncio.sleep(0.1)
    assert waiting == 1 and not fold.done()
    release.set()
    await batch
    await fold
    await fold_hours(sessionmaker, now=NOW)
    rows = await _rollups(sessionmaker)
    assert rows[("chat", "m1", START)].calls == 6 and rows[("chat", "m1", START + timedelta(hours=1))].calls == 5


async def test_weekly_figures_from_rollups_equal_figures_from_raw(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    monday = datetime(2026, 11, 23, tzinfo=UTC)
    records = workload(4000, seed=21, start=monday - timedelta(hours=5), span_s=7 * 86400 + 10 * 3600)
    await _store(sessionmaker, records)
    await fold_hours(sessionmaker, now=monday + timedelta(days=8))
    week = [r for r in records if monday <= r.started_at < monday + timedelta(days=7)]
    async with sessionmaker() as session:
        per_route = await merge_rollups(session, since=monday, until=monday + timedelta(days=7))
        only = await merge_rollups(session, since=monday, until=monday + timedelta(days=7), route="chat", model="m1")
    assert [(r.route, r.model) for r in per_route] == sorted({(r.route, r.model) for r in week})
    assert [(r.route, r.model) for r in only] == [("chat", "m1")]
    for merged in per_route:
        expected = direct_figures([r for r in week if (r.route, r.model) == (merged.route, merged.model)])
        for name in COUNTER_FIELDS:
            assert getattr(merged.rollup, name) == expected[name], name
        assert merged.hours == len(
            {floor_hour(r.started_at) for r in week if (r.route, r.model) == (merged.route, merged.model)}
        )
    total = Rollup().merged(*(r.rollup for r in per_route))
    expected = direct_figures(week)
    figures = total.figures((0.5, 0.9, 0.99))
    assert figures["calls"] == len(week)
    assert figures["hedge_rate"] == expected["hedges"] / len(week)
    assert figures["backup_win_rate"] == expected["backup_wins"] / expected["hedges"]
    assert figures["wasted_completion_tokens"] == expected["wasted_completion_tokens"]
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        exact_call = _exact_quantile(expected["call_ttft"], q)
        assert abs(figures[f"ttft_{name}_s"] - exact_call) / exact_call <= MAX_RELATIVE_ERROR + 1e-12
        km = getattr(
            estimate_ttft(
                expected["observed"] + expected["censored"],
                [False] * len(expected["observed"]) + [True] * len(expected["censored"]),
            ),
            f"{name}_s",
        )
        low, high = figures[f"primary_ttft_{name}_bounds_s"]
        assert low <= km < high and figures[f"primary_ttft_{name}_s"] is not None
    assert figures["primary_samples"] == len(expected["observed"]) + len(expected["censored"])


async def test_merge_rejects_bad_periods(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    async with sessionmaker() as session:
        with pytest.raises(ValueError, match="timezone-aware"):
            await merge_rollups(session, since=datetime(2026, 11, 23), until=NOW)
        with pytest.raises(ValueError, match="whole UTC hour"):
            await merge_rollups(session, since=START, until=NOW)
        with pytest.raises(ValueError, match="before until"):
            await merge_rollups(session, since=START, until=START)
        assert await merge_rollups(session, since=START, until=START + timedelta(hours=1)) == []
