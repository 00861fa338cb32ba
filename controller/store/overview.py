"""Read side of the ops console: every route at a glance, and one route's history over a range.

- :func:`route_overview`: each (route, model) with its configuration and published threshold
  (:func:`hedgerow.controller.store.queries.route_dict`), plus the last hour's calls, hedge rate and
  backup win rate (counted by :func:`hedgerow.controller.jobs.count_calls`, the controller's own
  rule), the flags of its latest decision and when its published value last changed;
- :func:`history_series`: the history rows of one route over ``[since, until]``, oldest first, with
  the row in force at ``since`` in front, for the threshold step chart.

Flags are the reason codes :data:`FLAG_CODES` of the route's newest history row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.records import format_timestamp
from hedgerow.controller.jobs import count_calls
from hedgerow.controller.store.models import Route, Threshold, ThresholdHistory
from hedgerow.controller.store.queries import history_row_dict, route_dict, route_row

__all__ = ["FLAG_CODES", "MAX_SERIES_ROWS", "flags_of", "history_series", "route_overview"]

#: Reason codes that flag a route for the ops team (see :mod:`hedgerow.controller.policy.policy`).
FLAG_CODES: tuple[str, ...] = ("backups_rarely_win", "hedges_did_not_lower_p99")
#: Most history rows one chart reads (the newest are kept).
MAX_SERIES_ROWS = 5000


def flags_of(reason: str | None) -> list[str]:
    """The flag codes among a history row's comma-separated reason codes, in :data:`FLAG_CODES` order."""
    codes = set((reason or "").split(","))
    return [code for code in FLAG_CODES if code in codes]


async def route_overview(session: AsyncSession, now: datetime, *, recent_s: float = 3600.0) -> list[dict[str, Any]]:
    """Every route not archived with what the overview page shows, ordered by (route, model).

    Args:
        session: a database session.
        now: the current time (aware UTC).
        recent_s: the recent window, seconds (default one hour).

    Returns:
        One dict per route: :func:`~hedgerow.controller.store.queries.route_dict`'s keys, plus
        ``recent_calls``, ``recent_hedge_rate`` and ``recent_backup_win_rate`` (fractions, None
        without calls or hedges), ``flags`` (list of codes), ``last_reason`` (the newest row's
        reason, or None) and ``last_change_at`` (ISO time of the newest applied row, or None).
    """
    result = await session.execute(
        select(Route, Threshold)
        .outerjoin(Threshold, Threshold.route_id == Route.id)
        .where(Route.archived_at.is_(None))
        .order_by(Route.route, Route.model)
    )
    pairs = list(result.all())
    newest = (
        select(ThresholdHistory.route_id, func.max(ThresholdHistory.id).label("id"))
        .group_by(ThresholdHistory.route_id)
        .subquery()
    )
    reasons = {
        route_id: reason
        for route_id, reason in (
            await session.execute(
                select(ThresholdHistory.route_id, ThresholdHistory.reason).join(
                    newest, newest.c.id == ThresholdHistory.id
                )
            )
        ).all()
    }
    changed = dict(
        (
            await session.execute(
                select(ThresholdHistory.route_id, func.max(ThresholdHistory.computed_at))
                .where(ThresholdHistory.applied.is_(True))
                .group_by(ThresholdHistory.route_id)
            )
        ).all()
    )
    since = now - timedelta(seconds=recent_s)
    rows: list[dict[str, Any]] = []
    for route, threshold in pairs:
        counts = await count_calls(session, route.id, since, now)
        reason = reasons.get(route.id)
        last_change = changed.get(route.id)
        rows.append(
            route_dict(route, threshold)
            | {
                "recent_calls": counts.calls,
                "recent_hedge_rate": None if counts.calls == 0 else counts.hedges / counts.calls,
                "recent_backup_win_rate": None if counts.hedges == 0 else counts.backup_wins / counts.hedges,
                "flags": flags_of(reason),
                "last_reason": reason,
                "last_change_at": None if last_change is None else format_timestamp(last_change),
            }
        )
    return rows


async def history_series(
    session: AsyncSession, route: str, model: str, since: datetime, until: datetime
) -> list[dict[str, Any]]:
    """One route's history rows seen in ``[since, until]``, oldest first, for the charts.

    The row in force at ``since`` (the newest first computed before it) comes first, so a step
    chart of the threshold starts at the value published then. At most :data:`MAX_SERIES_ROWS`
    rows (the newest).

    Args:
        session: a database session.
        route, model: which route.
        since, until: the range (aware UTC).

    Returns:
        History rows as :func:`~hedgerow.controller.store.queries.history_row_dict` gives them.

    Raises:
        UnknownRoute: no such (route, model).
    """
    row = await route_row(session, route, model)
    order = (ThresholdHistory.computed_at.desc(), ThresholdHistory.id.desc())
    inside = list(
        await session.scalars(
            select(ThresholdHistory)
            .where(
                ThresholdHistory.route_id == row.id,
                ThresholdHistory.last_at >= since,
                ThresholdHistory.computed_at <= until,
            )
            .order_by(*order)
            .limit(MAX_SERIES_ROWS)
        )
    )
    before = await session.scalar(
        select(ThresholdHistory)
        .where(ThresholdHistory.route_id == row.id, ThresholdHistory.last_at < since)
        .order_by(*order)
        .limit(1)
    )
    ordered = ([before] if before is not None else []) + inside[::-1]
    return [history_row_dict(h, row) for h in ordered]
