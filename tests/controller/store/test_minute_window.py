"""Minute aggregates kept by ingest equal the raw calls as the tick reads them (``window_records``).

A varied workload (hedges either side winning, censored primaries, failovers, failed calls,
denied hedges; ``rollup_workload``) over three routes and ~40 minutes is ingested in several
batches, one of them posted twice and one mixing stored and new records, plus calls before and
after the span read. For every route, the counters and the five histograms that
``read_minutes`` returns must equal those computed from ``jobs.window_records`` of the same
span. Concurrent ingest into the same minutes (one transaction held open while the other
writes) must sum, not overwrite. The retention job deletes the minutes no tick can read.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.client.records import CallRecord
from hedgerow.controller.jobs import observe_routes, window_records
from hedgerow.controller.policy._policy_window import WindowRecords
from hedgerow.controller.policy.minute_counts import KINDS, minute_index
from hedgerow.controller.policy.ttft_histogram import BUCKET_RATIO, N_BUCKETS, histogram_of
from hedgerow.controller.store._minute_window import RouteMinutes, minutes_of, raw_since, read_minutes, window_data
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Call, MinuteAggregate, Route
from hedgerow.controller.store.retention import run_retention
from hedgerow.settings import Settings
from tests.controller.rollup_workload import workload

#: The span read: whole minutes.
SINCE = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
UNTIL = SINCE + timedelta(minutes=40)


def _dense(values: np.ndarray) -> np.ndarray:
    counts = np.zeros(N_BUCKETS, dtype=np.int64)
    for index, count in histogram_of(values.tolist()).items():
        counts[index] = count
    return counts


def _expected(records: WindowRecords) -> dict[str, Any]:
    """Counters and histograms of ``WindowRecords`` (the raw-call read of the tick)."""
    primary = ~np.isnan(records.primary_s)
    backup = records.hedged & ~np.isnan(records.backup_s)
    ttft = ~np.isnan(records.call_ttft_s)
    return {
        "calls": int(records.age_s.size),
        "hedged": int(records.hedged.sum()),
        "backup_wins": int(records.backup_won.sum()),
        "denied": int(records.denied.sum()),
        "wanted": int((records.hedged | records.denied).sum()),
        "primary_observed": _dense(records.primary_s[primary & ~records.primary_censored]),
        "primary_censored": _dense(records.primary_s[primary & records.primary_censored]),
        "backup_observed": _dense(records.backup_s[backup & ~records.backup_censored]),
        "backup_censored": _dense(records.backup_s[backup & records.backup_censored]),
        "call_ttft": _dense(records.call_ttft_s[ttft]),
    }


async def _ingest(sessionmaker: async_sessionmaker[AsyncSession], batch: list[CallRecord]) -> tuple[int, int]:
    async with sessionmaker() as session, session.begin():
        return await ingest_calls(session, batch, defaults=route_defaults(Settings()))


async def _check_equal(
    sessionmaker: async_sessionmaker[AsyncSession], since: datetime = SINCE, until: datetime = UNTIL
) -> int:
    """Compare every route's minutes with its raw calls; returns the calls compared."""
    async with sessionmaker() as session:
        routes = (await session.scalars(select(Route.id))).all()
        minutes = await read_minutes(session, since, until)
        compared = 0
        for route_id in routes:
            want = _expected(await window_records(session, route_id, since, until))
            got = minutes.get(route_id)
            if want["calls"] == 0:
                assert got is None
                continue
            assert got is not None
            assert got.totals() == {k: want[k] for k in ("calls", "hedged", "backup_wins", "denied", "wanted")}
            for kind in KINDS:
                assert np.array_equal(got.histogram(kind), want[kind]), (route_id, kind)
            # per minute, in order: the calls of each minute, and a histogram of the later half
            records = await window_records(session, route_id, since, until)
            minute_of = np.floor((until.timestamp() - records.age_s) / 60).astype(np.int64)
            seen, calls = np.unique(minute_of, return_counts=True)
            assert got.minutes.tolist() == seen.tolist() and got.calls.tolist() == calls.tolist()
            middle = int(seen[len(seen) // 2])
            later = minute_of >= middle
            observed = later & ~np.isnan(records.primary_s) & ~records.primary_censored
            assert np.array_equal(
                got.histogram("primary_observed", since_minute=middle), _dense(records.primary_s[observed])
            )
            assert got.totals(since_minute=middle)["calls"] == int(later.sum())
            compared += want["calls"]
    return compared


async def test_minutes_equal_raw_calls_and_reposts_change_nothing(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    inside = workload(3000, seed=3, start=SINCE, span_s=40 * 60)
    before = workload(100, seed=4, start=SINCE - timedelta(minutes=30), span_s=29 * 60, prefix="b")
    after = workload(100, seed=5, start=UNTIL + timedelta(minutes=1), span_s=20 * 60, prefix="a")
    records = inside + before + after
    kinds = {r.hedge_reason for r in inside} | {("denied", r.hedge_denied) for r in inside}
    assert {"ttft_timeout", "primary_error", None, ("denied", True)} <= kinds  # the workload has every case
    batches = [records[i : i + 700] for i in range(0, len(records), 700)]
    for batch in batches:
        await _ingest(sessionmaker, batch)
    assert await _check_equal(sessionmaker) == 3000
    async with sessionmaker() as session:
        rows_before = (await session.execute(select(MinuteAggregate).order_by("route_id", "minute_index"))).all()
        snapshot = [(r.route_id, r.minute_index, r.calls, r.histograms) for (r,) in rows_before]
    # a batch posted again, and one mixing stored and new records: only the new ones are counted
    assert await _ingest(sessionmaker, batches[1]) == (0, len(batches[1]))
    extra = workload(50, seed=6, start=SINCE, span_s=40 * 60, prefix="x")
    assert await _ingest(sessionmaker, batches[2][:100] + extra) == (50, 100)
    assert await _check_equal(sessionmaker) == 3050
    async with sessionmaker() as session:
        total = await session.scalar(select(func.sum(MinuteAggregate.calls)))
    assert total == len(records) + 50
    assert snapshot  # rows existed before the re-posts


async def test_a_bad_batch_counts_nothing(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    good = workload(200, seed=7, start=SINCE, span_s=600)
    await _ingest(sessionmaker, good)
    bad = workload(20, seed=8, start=SINCE, span_s=600, prefix="bad")
    # a negative TTFT is no duration: counting it fails after the calls were written, and the
    # whole batch (calls, attempts, counts) rolls back
    bad[-1] = dataclasses.replace(bad[-1], ttft_s=-1.0)
    with pytest.raises(ValueError, match="ttft_s"):
        await _ingest(sessionmaker, bad)
    assert await _check_equal(sessionmaker) == 200
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).select_from(Call)) == 200


async def test_concurrent_ingest_into_the_same_minutes_sums(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    first = workload(400, seed=9, start=SINCE, span_s=300, prefix="f", pairs=(("chat", "m1"),))
    second = workload(400, seed=10, start=SINCE, span_s=300, prefix="s", pairs=(("chat", "m1"),))
    await _ingest(sessionmaker, first[:10])  # the route and some minutes exist before
    async with sessionmaker() as held:
        async with held.begin():
            await ingest_calls(held, first[10:], defaults=route_defaults(Settings()))
            # the other writer runs while this transaction holds its rows (it waits on them)
            other = asyncio.create_task(_ingest(sessionmaker, second))
            await asyncio.sleep(0.5)
            assert not other.done()
        assert await other == (400, 0)
    assert await _check_equal(sessionmaker) == 800


async def test_retention_deletes_minutes_no_tick_can_read(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    now = SINCE + timedelta(hours=30)
    old = workload(100, seed=11, start=now - timedelta(hours=26), span_s=3600, prefix="o")
    recent = workload(100, seed=12, start=now - timedelta(hours=23), span_s=3600, prefix="n")
    await _ingest(sessionmaker, old + recent)
    report = await run_retention(sessionmaker, Settings(max_window_s=24 * 3600), now=now)
    deleted = report.pruned_minutes
    async with sessionmaker() as session:
        left = (
            await session.execute(select(func.min(MinuteAggregate.minute_index), func.sum(MinuteAggregate.calls)))
        ).one()
    assert deleted > 0
    assert left[1] == 100  # every recent call kept, every old one gone
    assert left[0] >= minute_index(now - timedelta(hours=24)) - 1
    assert await _check_equal(sessionmaker, now - timedelta(hours=24), now) == 100


async def test_window_data_stands_for_every_call_of_the_minutes(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """The weighted entries the tick observes carry every call and sample of the minutes read:
    weights sum to the counts, durations are bucket upper edges (at most a bucket above the raw
    samples, never below), and ages place each minute at its middle."""
    records = workload(600, seed=4, start=SINCE, span_s=1800.0)
    await _ingest(sessionmaker, records)
    now = SINCE + timedelta(minutes=30, seconds=20)
    async with sessionmaker() as session:
        minutes = await read_minutes(session, SINCE, now)
        route_ids = (await session.scalars(select(Route.id))).all()
        for route_id in route_ids:
            raw = (await window_records(session, route_id, SINCE, now)).data()
            data = window_data(minutes[route_id], now)
            for kind in ("primary", "backup", "call_ttft"):
                got, want = getattr(data, kind), getattr(raw, kind)
                assert got.weight.sum() == want.weight.sum(), kind
                assert got.weight[got.censored].sum() == want.weight[want.censored].sum(), kind
                # the same distribution, each duration at most a bucket later: compare medians
                median = np.median(np.repeat(got.durations_s, got.weight.astype(int)))
                assert np.median(want.durations_s) <= median <= np.median(want.durations_s) * BUCKET_RATIO, kind
            assert data.counts.calls.sum() == raw.counts.calls.sum()
            assert data.counts.hedged.sum() == raw.counts.hedged.sum()
            # each minute at its middle, floored at 0 (the minute holding now, 20 s into it)
            middles = now.timestamp() - (minutes[route_id].minutes * 60.0 + 30.0)
            assert data.counts.age_s.tolist() == pytest.approx(np.maximum(middles, 0.0).tolist())
            assert set(np.unique(data.primary.age_s).tolist()) <= set(data.counts.age_s.tolist())


async def test_observe_routes_reads_the_wide_window_only_for_routes_that_need_it(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    """A busy route is observed over ``window_s``; a quiet one, whose samples are too few, over
    ``max_window_s``, including calls older than the hour; every route is in the answer."""
    now = SINCE + timedelta(hours=3)
    busy = [
        dataclasses.replace(r, route="busy", model="m")
        for r in workload(400, seed=5, start=now - timedelta(minutes=50), span_s=2900.0)
    ]
    quiet = [
        dataclasses.replace(r, route="quiet", model="m")
        for r in workload(30, seed=6, start=now - timedelta(hours=2, minutes=50), span_s=9000.0, prefix="q")
    ]
    await _ingest(sessionmaker, busy + quiet)
    settings = Settings()
    async with sessionmaker() as session:
        routes = list((await session.scalars(select(Route).order_by(Route.route))).all())
        observations = await observe_routes(session, routes, settings, now)
        raw_quiet = await window_records(session, routes[1].id, now - timedelta(hours=24), now)
    by_name = {route.route: observations[route.id] for route in routes}
    assert set(by_name) == {"busy", "quiet"}
    assert by_name["busy"].window_s == settings.window_s
    assert by_name["quiet"].window_s == settings.max_window_s
    assert by_name["quiet"].calls == raw_quiet.age_s.size == 30


async def test_minutes_of_the_records_are_what_ingest_kept(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """``minutes_of`` (the virtual-time evaluation's ``--minutes``) gives, from one route's
    records, the minutes and entries that ingest stored and ``read_minutes`` returns."""
    await _ingest(sessionmaker, workload(500, seed=7, start=SINCE, span_s=1800.0))
    now = SINCE + timedelta(minutes=30)
    async with sessionmaker() as session:
        stored = await read_minutes(session, SINCE, now)
        for route_id, got in stored.items():
            made = minutes_of(await window_records(session, route_id, SINCE, now), now)
            for name in ("minutes", "calls", "hedged", "backup_wins", "denied", "wanted"):
                assert getattr(made, name).tolist() == getattr(got, name).tolist(), name

            def entries(m: RouteMinutes) -> list[tuple[int, int, int, int]]:
                return sorted(zip(m.entry_minute.tolist(), m.entry_kind.tolist(), m.entry_bucket.tolist(),
                                  m.entry_count.tolist(), strict=True))  # fmt: skip

            assert entries(made) == entries(got)


async def test_the_last_minutes_are_read_call_by_call(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """The tick reads the calls since ``raw_since(now)`` one by one: a short window of seconds
    counts exactly its calls, and calls started after ``now`` (in its minute) are left out."""
    now = SINCE + timedelta(minutes=30, seconds=40)
    records = [
        dataclasses.replace(r, route="r", model="m")
        for r in workload(60, seed=8, start=now - timedelta(seconds=50), span_s=70.0)  # 20 s past now
    ]
    older = [
        dataclasses.replace(r, route="r", model="m")
        for r in workload(200, seed=9, start=SINCE, span_s=1500.0, prefix="o")
    ]
    await _ingest(sessionmaker, records + older)
    settings = Settings(short_window_s=30.0, drift_alpha=0.0)
    async with sessionmaker() as session:
        [route] = (await session.scalars(select(Route))).all()
        observation = (await observe_routes(session, [route], settings, now))[route.id]
        in_short = await window_records(session, route.id, now - timedelta(seconds=30), now)
        in_window = await window_records(session, route.id, now - timedelta(hours=1), now)
    assert raw_since(now) == SINCE + timedelta(minutes=29)
    assert observation.short_window_calls == in_short.age_s.size > 0
    assert observation.calls == in_window.age_s.size == 200 + sum(r.started_at <= now for r in records)
