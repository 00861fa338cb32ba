"""Calls that failed entirely: per route over a recent window (the routes list) and per time slot
of one route (the route page's chart).

A call *failed* when it ended without an answer: status ``error``, ``timeout`` or ``stalled``
(:data:`~hedgerow.controller.calls_filters.FAILED_STATUSES`, the calls explorer's ``failed``
outcome, :func:`~hedgerow.controller.store.calls_query.outcome_clause`); a call that failed over
to a backup and was answered did not. The failed-call rate is failed calls over calls started in
the window (cancelled calls count as calls).

- :func:`failed_calls_by_route`: one statement grouped by route over the calls started in
  ``(since, until]`` (the window rule of :func:`hedgerow.controller.jobs.count_calls`, which the
  routes list's other recent figures use).
- :func:`failure_series`: one statement grouped by UTC time slot
  (:func:`~hedgerow.controller.store.upstream_series.slot_width_s`, the per-upstream lines' slots) over
  one route's calls started in ``[since, until)``, on the ``(route_id, started_at)`` index.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.store.calls_query import outcome_clause
from hedgerow.controller.store.models import Call, Route
from hedgerow.controller.store.queries import route_row
from hedgerow.controller.store.upstream_series import slot_sql, slot_width_s

__all__ = ["failed_calls_by_route", "failure_series"]


def _failed_count() -> Any:
    return func.coalesce(func.sum(case((outcome_clause("failed"), 1), else_=0)), 0)


async def failed_calls_by_route(
    session: AsyncSession, since: datetime, until: datetime
) -> dict[tuple[str, str], tuple[int, int]]:
    """Calls and failed calls of every route with a call started in ``(since, until]``.

    Args:
        session: an open session.
        since, until: the window (aware UTC).

    Returns:
        ``{(route, model): (calls, failed_calls)}``; a route without calls in the window is absent.
    """
    grouped = (
        select(Call.route_id, func.count().label("calls"), _failed_count().label("failed"))
        .where(Call.started_at > since, Call.started_at <= until)
        .group_by(Call.route_id)
        .subquery()
    )
    rows = await session.execute(
        select(Route.route, Route.model, grouped.c.calls, grouped.c.failed).join(
            grouped, Route.id == grouped.c.route_id
        )
    )
    return {(route, model): (int(calls), int(failed)) for route, model, calls, failed in rows}


async def failure_series(
    session: AsyncSession, *, route: str, model: str, since: datetime, until: datetime
) -> dict[str, Any]:
    """One route's calls and failed calls per UTC time slot over ``[since, until)``.

    Args:
        session: an open session (read only).
        route, model: the route.
        since, until: the range (aware UTC, ``since < until``).

    Returns:
        ``{"slot_s", "points": [{"start", "end", "calls", "failed", "rate"}...]}``: the slot width
        (:func:`~hedgerow.controller.store.upstream_series.slot_width_s`), and one point per slot with a
        call, oldest first, ``start``/``end`` the slot's part inside the range, ``rate`` = failed /
        calls.

    Raises:
        UnknownRoute: no such (route, model).
    """
    row = await route_row(session, route, model)
    width_s = slot_width_s((until - since).total_seconds())
    slot = slot_sql((await session.connection()).dialect.name, width_s)
    query = (
        select(slot.label("slot"), func.count(), _failed_count())
        .where(Call.route_id == row.id, Call.started_at >= since, Call.started_at < until)
        .group_by(slot)
        .order_by(slot)
    )
    points = []
    for at, calls, failed in await session.execute(query):
        start = max(since, datetime.fromtimestamp(int(at) * width_s, tz=since.tzinfo))
        end = min(until, datetime.fromtimestamp((int(at) + 1) * width_s, tz=since.tzinfo))
        points.append(
            {"start": start, "end": end, "calls": int(calls), "failed": int(failed), "rate": int(failed) / int(calls)}
        )
    return {"slot_s": width_s, "points": points}
