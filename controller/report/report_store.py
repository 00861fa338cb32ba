"""Read what a weekly report needs from the store: rollups (folded, or raw calls not yet folded),
threshold decisions, route configurations and prices; then build the report.

Never empty because a job has not run: for every (route, hour) of the week the figures come from

* the hourly rollup, when it matches the hour's raw calls (or the raw calls are gone);
* the raw calls, folded in memory with the same rules (:func:`~hedgerow.controller.store.rollups.aggregate_hour`),
  when the hour has no rollup yet (the current hour, or the rollup job has not run), when the
  rollup is stale (late calls, an older fold version) and is not sealed;
* a sealed rollup plus its late calls (``id > max_call_id``), as the fold job would add them.

Reading writes nothing: the report is the same whether or not the fold job ran first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.report.report import (
    HourRollup,
    IsoWeek,
    RouteState,
    ThresholdEvent,
    WeekData,
    build_weekly_report,
)
from hedgerow.controller.report.report_clients import week_clients
from hedgerow.controller.report.report_upstreams import week_upstreams
from hedgerow.controller.store.models import Call, HourlyRollup, Route, ThresholdHistory, utc_now
from hedgerow.controller.store.prices import load_price_book
from hedgerow.controller.store.rollups import (
    FOLD_VERSION,
    aggregate_hour,
    hour_index_sql,
    hour_of_index,
    rollup_from_row,
)

__all__ = ["load_week_data", "load_week_hours", "weekly_report"]


async def load_week_hours(session: AsyncSession, since: datetime, until: datetime) -> list[HourRollup]:
    """The hourly rollup of every (route, model) and hour in ``[since, until)`` with calls.

    Args:
        session: an open session.
        since, until: whole UTC hours (aware), ``since < until``.

    Returns:
        One :class:`HourRollup` per (route, hour) with calls, by (route, model, hour).

    Raises:
        StoreError: a stored rollup uses another histogram scheme or is malformed.
    """
    names = {
        rid: (route, model)
        for rid, route, model in (await session.execute(select(Route.id, Route.route, Route.model))).all()
    }
    rows = (
        await session.scalars(
            select(HourlyRollup).where(HourlyRollup.hour_start >= since, HourlyRollup.hour_start < until)
        )
    ).all()
    stored = {(row.route_id, row.hour_start): row for row in rows}
    hour = hour_index_sql(session.get_bind().dialect.name).label("hour")
    raw_rows = await session.execute(
        select(Call.route_id, hour, func.count(), func.max(Call.id))
        .where(Call.started_at >= since, Call.started_at < until)
        .group_by(Call.route_id, hour)
    )
    raw = {(int(rid), hour_of_index(index)): (int(count), int(max_id)) for rid, index, count, max_id in raw_rows.all()}
    out: list[HourRollup] = []
    for key in sorted(set(stored) | set(raw), key=lambda k: (names[k[0]], k[1])):
        route_id, hour_start = key
        row = stored.get(key)
        counts = raw.get(key)
        if row is None:
            rollup, _ = await aggregate_hour(session, route_id, hour_start)
        elif counts is None:
            rollup = rollup_from_row(row)
        elif row.sealed_at is not None:
            rollup = rollup_from_row(row)
            if counts[1] > row.max_call_id:
                late, _ = await aggregate_hour(session, route_id, hour_start, after_call_id=row.max_call_id)
                rollup = rollup.merged(late)
        elif (row.calls, row.max_call_id, row.fold_version) != (*counts, FOLD_VERSION):
            rollup, _ = await aggregate_hour(session, route_id, hour_start)
        else:
            rollup = rollup_from_row(row)
        if rollup.calls:
            route, model = names[route_id]
            out.append(HourRollup(route, model, hour_start, rollup))
    return out


async def _history(
    session: AsyncSession, since: datetime, until: datetime
) -> tuple[dict[tuple[str, str], list[ThresholdEvent]], dict[tuple[str, str], float | None]]:
    """Each route's decisions in ``[since, until)`` and its published value at ``since``."""
    events: dict[tuple[str, str], list[ThresholdEvent]] = {}
    # a held decision repeated over many ticks is one row (``repeats``, ``computed_at`` to
    # ``last_at``): every row whose span overlaps the week counts
    rows = await session.execute(
        select(Route.route, Route.model, ThresholdHistory)
        .join(Route, Route.id == ThresholdHistory.route_id)
        .where(ThresholdHistory.computed_at < until, ThresholdHistory.last_at >= since)
        .order_by(ThresholdHistory.computed_at, ThresholdHistory.id)
    )
    for route, model, row in rows.all():
        began_before = row.computed_at < since  # published before the week: no change within it
        events.setdefault((route, model), []).append(
            ThresholdEvent(
                max(row.computed_at, since), row.hedge_after_s, row.applied and not began_before, row.reason,
                row.budget, row.previous_hedge_after_s, row.repeats,
            )
        )  # fmt: skip
    latest = (
        select(ThresholdHistory.route_id, func.max(ThresholdHistory.computed_at).label("at"))
        .where(ThresholdHistory.applied.is_(True), ThresholdHistory.computed_at < since)
        .group_by(ThresholdHistory.route_id)
        .subquery()
    )
    start_rows = await session.execute(
        select(Route.route, Route.model, ThresholdHistory.hedge_after_s)
        .join(latest, latest.c.route_id == ThresholdHistory.route_id)
        .join(Route, Route.id == ThresholdHistory.route_id)
        .where(ThresholdHistory.computed_at == latest.c.at, ThresholdHistory.applied.is_(True))
        .order_by(ThresholdHistory.id)
    )
    starts: dict[tuple[str, str], float | None] = {(r, m): v for r, m, v in start_rows.all()}
    return events, starts


async def load_week_data(session: AsyncSession, week: IsoWeek, *, now: datetime | None = None) -> WeekData:
    """Everything :func:`~hedgerow.controller.report.report.build_weekly_report` reads for ``week``.

    Args:
        session: an open session.
        week: the ISO week.
        now: the report's time (aware UTC; default now): a week not over yet is partial.

    Raises:
        StoreError: a stored rollup uses another histogram scheme or is malformed.
    """
    now = utc_now() if now is None else now
    previous = week.previous()
    hours = await load_week_hours(session, week.since, week.until)
    previous_hours = await load_week_hours(session, previous.since, previous.until)
    routes = {
        (r.route, r.model): RouteState(r.enabled, r.budget, r.pinned_hedge_after_s)
        for r in (await session.scalars(select(Route))).all()
    }
    events, starts = await _history(session, week.since, week.until)
    return WeekData(
        week=week,
        generated_at=now,
        hours=hours,
        previous_hours=previous_hours,
        routes=routes,
        events=events,
        start_values=starts,
        prices=await load_price_book(session),
    )


async def weekly_report(
    sessionmaker: async_sessionmaker[AsyncSession], week: IsoWeek | str | None = None, *, now: datetime | None = None
) -> dict[str, Any]:
    """The JSON report of an ISO week (default: the current week), read in one session, with its
    per-upstream table under ``upstreams`` (:mod:`hedgerow.controller.report.report_upstreams`)
    and its per-client table under ``clients`` (:mod:`hedgerow.controller.report.report_clients`).

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        week: an :class:`IsoWeek`, its text (``2026-W48``) or None for the week holding ``now``.
        now: the report's time (aware UTC; default now).

    Raises:
        ValueError: a malformed week.
        StoreError: a stored rollup uses another histogram scheme or is malformed.
    """
    now = utc_now() if now is None else now
    if week is None:
        week = IsoWeek.of(now)
    elif isinstance(week, str):
        week = IsoWeek.parse(week)
    async with sessionmaker() as session:
        data = await load_week_data(session, week, now=now)
        upstreams = await week_upstreams(session, week)
        clients = await week_clients(session, week, data.prices)
    report = build_weekly_report(data)
    report["upstreams"] = upstreams  # the per-upstream table (report_upstreams; from raw attempts)
    report["clients"] = clients  # the per-client table (report_clients; from raw calls)
    return report
