"""Retention: raw calls older than the retention age go, only after their hour is rolled up."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from typer.testing import CliRunner

from hedgerow.cli import app
from hedgerow.client.records import CallRecord
from hedgerow.controller.scheduler import ControllerScheduler
from hedgerow.controller.store.db import make_engine, make_sessionmaker
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Attempt, Base, Call, HourlyRollup, utc_now
from hedgerow.controller.store.retention import delete_folded_raw, run_retention
from hedgerow.controller.store.rollups import (
    COUNTER_FIELDS,
    Rollup,
    floor_hour,
    fold_hours,
    merge_rollups,
)
from hedgerow.settings import Settings
from tests.controller.rollup_workload import direct_figures, workload

NOW = datetime(2026, 11, 29, 12, 20, tzinfo=UTC)
DAY = timedelta(days=1)


async def _store(sessionmaker: async_sessionmaker[AsyncSession], *batches: list[CallRecord]) -> None:
    """Ingest each batch in turn (ids grow batch after batch, as they do in time)."""
    for records in batches:
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, records, defaults=route_defaults(Settings()))


def _postgresql(sessionmaker: async_sessionmaker[AsyncSession]) -> bool:
    """Whether the store is PostgreSQL (day partitions: retention drops whole days)."""
    dialect: str = sessionmaker.kw["bind"].dialect.name
    return dialect == "postgresql"


async def _count(sessionmaker: async_sessionmaker[AsyncSession], model: type[Base]) -> int:
    async with sessionmaker() as session:
        count = await session.scalar(select(func.count()).select_from(model))
        assert count is not None  # COUNT(*) always answers
        return int(count)


async def _request_ids(sessionmaker: async_sessionmaker[AsyncSession]) -> set[str]:
    async with sessionmaker() as session:
        return set((await session.scalars(select(Call.request_id))).all())


async def _merged(
    sessionmaker: async_sessionmaker[AsyncSession], since: datetime, until: datetime
) -> dict[tuple[str, str], Rollup]:
    async with sessionmaker() as session:
        return {(r.route, r.model): r.rollup for r in await merge_rollups(session, since=since, until=until)}


@pytest.mark.slow
async def test_old_raw_goes_after_its_rollup_and_figures_survive(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    settings = Settings(retention_s=14 * 86400.0, retention_batch_rows=37)
    old = workload(900, seed=31, start=NOW - 17 * DAY, span_s=2 * 86400, prefix="old")  # 15-17 days old
    edge = workload(60, seed=32, start=floor_hour(NOW - 14 * DAY), span_s=3599, prefix="edge")  # straddles
    new = workload(300, seed=33, start=NOW - 3 * DAY, span_s=2 * 86400, prefix="new")
    await _store(sessionmaker, old, edge, new)
    attempts_before = await _count(sessionmaker, Attempt)
    since, until = floor_hour(NOW - 20 * DAY), floor_hour(NOW)
    report = await run_retention(sessionmaker, settings, now=NOW)

    assert report.cutoff == floor_hour(NOW - 14 * DAY)
    assert report.deleted_calls == len(old)
    assert report.deleted_attempts == sum(len(r.attempts) for r in old)
    assert all(h.skipped is None for h in report.deleted)
    assert await _request_ids(sessionmaker) == {r.request_id for r in edge + new}  # newer raw kept
    assert await _count(sessionmaker, Attempt) == attempts_before - report.deleted_attempts
    async with sessionmaker() as session:  # no orphan attempt survives its call
        orphans = await session.scalar(
            select(func.count()).select_from(Attempt).where(~Attempt.call_id.in_(select(Call.id)))
        )
        assert orphans == 0
        sealed = await session.scalar(select(func.count()).where(HourlyRollup.sealed_at.is_not(None)))
    assert sealed == len({(r.route, r.model, floor_hour(r.started_at)) for r in old})

    # the rollups still give every figure of the deleted calls
    merged = await _merged(sessionmaker, since, until)
    for pair in {(r.route, r.model) for r in old}:
        expected = direct_figures([r for r in old + edge + new if (r.route, r.model) == pair])
        for name in COUNTER_FIELDS:
            assert getattr(merged[pair], name) == expected[name], (pair, name)

    # a second run has nothing left to fold or delete
    again = await run_retention(sessionmaker, settings, now=NOW)
    assert again.folded == [] and again.deleted == []
    assert await _merged(sessionmaker, since, until) == merged


@pytest.mark.slow
async def test_weekly_aggregate_is_the_same_before_and_after_deletion(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    monday = datetime(2026, 11, 2, tzinfo=UTC)  # 2026-W45, more than 14 days before NOW
    records = workload(1000, seed=41, start=monday, span_s=7 * 86400, prefix="w", pairs=[("chat", "m1")])
    newer = workload(5, seed=42, start=NOW - DAY, span_s=3600, prefix="n", pairs=[("chat", "m1")])
    await _store(sessionmaker, records, newer)
    await fold_hours(sessionmaker, now=NOW)
    before = await _merged(sessionmaker, monday, monday + 7 * DAY)
    report = await run_retention(sessionmaker, Settings(), now=NOW)
    assert report.deleted_calls == 1000 and await _count(sessionmaker, Call) == 5
    after = await _merged(sessionmaker, monday, monday + 7 * DAY)
    assert after == before
    total = next(iter(after.values())).merged(*list(after.values())[1:])
    figures = total.figures()
    expected = direct_figures(records)
    assert figures["calls"] == 1000 and figures["hedges"] == expected["hedges"]
    assert figures["ttft_p90_s"] is not None and figures["primary_ttft_p90_s"] is not None


async def test_a_call_arriving_late_in_a_sealed_hour_is_counted_then_deleted(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> None:
    hour = floor_hour(NOW - 20 * DAY)
    first = workload(30, seed=51, start=hour, span_s=3599, prefix="a", pairs=[("chat", "m1")])
    await _store(sessionmaker, first)
    await run_retention(sessionmaker, Settings(), now=NOW)
    # SQLite: the newest call of the table stays (already counted), so it never reuses an id;
    # PostgreSQL (ids from a sequence) drops the whole day, and the late batch below makes the
    # day's partitions again
    kept = 0 if _postgresql(sessionmaker) else 1
    assert await _count(sessionmaker, Call) == kept
    late = workload(3, seed=52, start=hour, span_s=3599, prefix="late", pairs=[("chat", "m1")])
    await _store(sessionmaker, late)
    report = await run_retention(sessionmaker, Settings(), now=NOW)
    assert [(f.kind, f.calls) for f in report.folded] == [("late", 33)]
    assert report.deleted_calls == 3 and await _count(sessionmaker, Call) == kept
    merged = await _merged(sessionmaker, hour, hour + timedelta(hours=1))
    expected = direct_figures(first + late)
    for name in COUNTER_FIELDS:
        assert getattr(merged[("chat", "m1")], name) == expected[name], name
    # the late fold is not repeated
    assert (await run_retention(sessionmaker, Settings(), now=NOW)).folded == []


async def test_unfolded_or_stale_hours_are_never_deleted(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    hour = floor_hour(NOW - 20 * DAY)
    newest = workload(1, seed=63, start=NOW - DAY, span_s=60, prefix="new", pairs=[("chat", "m1")])
    await _store(
        sessionmaker, workload(20, seed=61, start=hour, span_s=3599, prefix="s", pairs=[("chat", "m1")]), newest
    )
    cutoff = floor_hour(NOW - 14 * DAY)
    # no rollup yet: retention alone deletes nothing
    [kept] = await delete_folded_raw(sessionmaker, cutoff=cutoff, batch_rows=5, now=NOW)
    assert (kept.skipped, kept.calls) == ("not_folded", 0) and await _count(sessionmaker, Call) == 21
    await fold_hours(sessionmaker, now=NOW)
    # a call lands after the fold: the rollup no longer matches, so the hour is kept
    late = workload(1, seed=62, start=hour, span_s=3599, prefix="x", pairs=[("chat", "m1")])
    await _store(sessionmaker, late)
    [stale] = await delete_folded_raw(sessionmaker, cutoff=cutoff, batch_rows=5, now=NOW)
    assert stale.skipped == "stale_rollup" and await _count(sessionmaker, Call) == 22
    async with sessionmaker() as session:
        assert await session.scalar(select(func.count()).where(HourlyRollup.sealed_at.is_not(None))) == 0
    # the full job folds first, then deletes in batches of 5
    report = await run_retention(sessionmaker, Settings(retention_batch_rows=5), now=NOW)
    if _postgresql(sessionmaker):  # the whole day goes, the late call "x" with it (counted)
        assert [f.kind for f in report.folded] == ["refolded"] and report.deleted_calls == 21
        assert await _request_ids(sessionmaker) == {"new63-0"}
        assert await _count(sessionmaker, Attempt) == len(newest[0].attempts)
    else:
        assert [f.kind for f in report.folded] == ["refolded"] and report.deleted_calls == 20
        # the late call "x" is now the newest row of the table: counted, and kept for now
        assert await _request_ids(sessionmaker) == {"new63-0", "x62-0"}
        assert await _count(sessionmaker, Attempt) == len(newest[0].attempts) + len(late[0].attempts)
    with pytest.raises(ValueError, match="whole UTC hour"):
        await delete_folded_raw(sessionmaker, cutoff=NOW, batch_rows=5)
    with pytest.raises(ValueError, match="batch_rows"):
        await delete_folded_raw(sessionmaker, cutoff=cutoff, batch_rows=0)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"retention_s": 0}, "retention_s"),
        ({"retention_s": 3600}, "retention_s"),  # shorter than max_window_s (the controller's window)
        ({"retention_s": "two weeks"}, "retention_s"),
        ({"rollup_interval_s": 0}, "rollup_interval_s"),
        ({"retention_batch_rows": 0}, "retention_batch_rows"),
        ({"retention_batch_rows": 50_000}, "retention_batch_rows"),
    ],
)
def test_bad_settings_are_rejected(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(**values)
    assert caught.value.errors()[0]["loc"] == (field,)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDGEROW_RETENTION_S", "1209600")
    monkeypatch.setenv("HEDGEROW_ROLLUP_INTERVAL_S", "900.5")
    settings = Settings()
    assert (settings.retention_s, settings.rollup_interval_s, settings.retention_batch_rows) == (1209600.0, 900.5, 2000)
    monkeypatch.setenv("HEDGEROW_RETENTION_S", "-1")
    with pytest.raises(ValidationError, match="retention_s"):
        Settings()


def _seed(url: str, records: list[CallRecord]) -> None:
    async def run() -> None:
        engine = make_engine(url)
        try:
            await _store(make_sessionmaker(engine), records)
        finally:
            await engine.dispose()

    asyncio.run(run())


def test_cli_runs_the_job_once(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    now = utc_now()
    old = workload(50, seed=71, start=now - 20 * DAY, span_s=3 * 3600, prefix="o")
    new = workload(20, seed=72, start=now - 3 * DAY, span_s=3600, prefix="n")
    _seed(url, old)
    _seed(url, new)
    fold_only = runner.invoke(app, ["db", "retention", "--db", url, "--fold-only", "--json"])
    assert fold_only.exit_code == 0, fold_only.output
    out = json.loads(fold_only.stdout)
    assert out["folded_hours"] >= 2 and out["deleted_calls"] == 0
    result = runner.invoke(app, ["db", "retention", "--db", url, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["folded_hours"] == 0 and out["deleted_calls"] == 50
    assert out["deleted_attempts"] == sum(len(r.attempts) for r in old)
    assert {h["calls"] for h in out["deleted"]} - {0} and all(h["skipped"] is None for h in out["deleted"])
    text = runner.invoke(app, ["db", "retention", "--db", url])
    assert text.exit_code == 0 and "deleted 0 call(s)" in text.output
    bad = runner.invoke(app, ["db", "retention", "--db", url, "--retention", "60"])
    assert bad.exit_code == 2 and "--retention: " in bad.output and "Traceback" not in bad.output
    missing = runner.invoke(app, ["db", "retention", "--db", f"sqlite+aiosqlite:///{tmp_path / 'none.db'}"])
    assert missing.exit_code == 1 and "db upgrade" in missing.output


async def test_scheduled_job_runs_on_the_lease_holder_only(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    now = utc_now()
    old = workload(40, seed=81, start=now - 20 * DAY, span_s=7200, prefix="o")
    await _store(sessionmaker, old, workload(10, seed=82, start=now - DAY, span_s=3600, prefix="n"))
    settings = Settings(rollup_interval_s=0.5, lease_ttl_s=30.0, controller_interval_s=3600.0)
    first = ControllerScheduler(sessionmaker, settings, holder="first")
    assert await first.renew()  # first holds the lease before either job starts
    second = ControllerScheduler(sessionmaker, settings, holder="second")
    first.start()
    second.start()
    try:
        for _ in range(300):  # up to 30 s on a loaded machine
            if first.rollups >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        await first.shutdown()
        await second.shutdown()
    assert first.rollups >= 2 and second.rollups == 0
    assert await _count(sessionmaker, Call) == 10
    assert first.last_rollup is not None and first.last_rollup.deleted == []  # later runs: nothing left


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "0", "-5", "-inf"])
def test_cli_retention_out_of_range_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade", "--db", url]).exit_code == 0
    result = runner.invoke(app, ["db", "retention", "--db", url, f"--retention={value}"])
    assert result.exit_code == 2, (value, result.output, result.exception)
    assert "--retention: " in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
