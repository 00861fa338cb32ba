"""Read side of the store: thresholds, routes and history as the JSON dicts the api returns.

Shapes (timestamps are ISO 8601 UTC strings with a ``Z``; durations float seconds):

- threshold: ``{"route", "model", "hedge_after_s", "enabled", "source", "version", "budget",
  "updated_at"}``
- route: ``{"route", "model", "enabled", "budget", "default_hedge_after_s", "min_hedge_after_s",
  "max_hedge_after_s", "pinned_hedge_after_s", "created_at", "updated_at", "threshold"}`` where
  ``threshold`` is a threshold dict or None before the first tick.
- history row: exactly :data:`HISTORY_FIELDS`: the DESIGN.md fields, then ``actor`` (the token
  or name behind a manual change; null for the controller job) and ``details`` (a JSON object or
  null: ``quantile_lower_bounds_s`` for the quantiles left null, ``target_s``, ``short_window``,
  ``p99_check``, and for a ``config`` row ``changes``: ``{"field": {"from": x, "to": y}}``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.records import format_timestamp
from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.models import Route, Threshold, ThresholdHistory

__all__ = [
    "HISTORY_FIELDS",
    "THRESHOLD_FIELDS",
    "get_history",
    "get_route",
    "get_threshold",
    "history_row_dict",
    "list_routes",
    "list_thresholds",
    "route_dict",
    "threshold_dict",
]

#: The keys of a history row, in order (DESIGN.md "controller"; contracts.md).
HISTORY_FIELDS: tuple[str, ...] = (
    "computed_at", "route", "model", "previous_hedge_after_s", "hedge_after_s", "applied",
    "reason", "source", "window_s", "samples", "censored", "p50_s", "p75_s", "p90_s", "p95_s",
    "p99_s", "observed_hedge_rate", "backup_win_rate", "budget", "actor", "details",
)  # fmt: skip

#: The keys of a published threshold, in order.
THRESHOLD_FIELDS: tuple[str, ...] = (
    "route", "model", "hedge_after_s", "enabled", "source", "version", "budget", "updated_at",
)  # fmt: skip


def history_row_dict(row: ThresholdHistory, route: Route) -> dict[str, Any]:
    """A ``threshold_history`` row as the api returns it (exactly :data:`HISTORY_FIELDS`)."""
    return {
        "computed_at": format_timestamp(row.computed_at),
        "route": route.route,
        "model": route.model,
        "previous_hedge_after_s": row.previous_hedge_after_s,
        "hedge_after_s": row.hedge_after_s,
        "applied": row.applied,
        "reason": row.reason,
        "source": row.source,
        "window_s": row.window_s,
        "samples": row.samples,
        "censored": row.censored,
        "p50_s": row.p50_s,
        "p75_s": row.p75_s,
        "p90_s": row.p90_s,
        "p95_s": row.p95_s,
        "p99_s": row.p99_s,
        "observed_hedge_rate": row.observed_hedge_rate,
        "backup_win_rate": row.backup_win_rate,
        "budget": row.budget,
        "actor": row.actor,
        "details": row.details,
    }


def threshold_dict(threshold: Threshold, route: Route) -> dict[str, Any]:
    """A published threshold as the api returns it (exactly :data:`THRESHOLD_FIELDS`)."""
    return {
        "route": route.route,
        "model": route.model,
        "hedge_after_s": threshold.hedge_after_s,
        "enabled": threshold.enabled,
        "source": threshold.source,
        "version": threshold.version,
        "budget": route.budget,
        "updated_at": format_timestamp(threshold.updated_at),
    }


def route_dict(route: Route, threshold: Threshold | None) -> dict[str, Any]:
    """A route's configuration and its published threshold (None before the first tick)."""
    return {
        "route": route.route,
        "model": route.model,
        "enabled": route.enabled,
        "budget": route.budget,
        "default_hedge_after_s": route.default_hedge_after_s,
        "min_hedge_after_s": route.min_hedge_after_s,
        "max_hedge_after_s": route.max_hedge_after_s,
        "pinned_hedge_after_s": route.pinned_hedge_after_s,
        "created_at": format_timestamp(route.created_at),
        "updated_at": format_timestamp(route.updated_at),
        "threshold": None if threshold is None else threshold_dict(threshold, route),
    }


async def list_thresholds(session: AsyncSession) -> list[dict[str, Any]]:
    """Every published threshold, ordered by (route, model)."""
    result = await session.execute(
        select(Threshold, Route).join(Route, Route.id == Threshold.route_id).order_by(Route.route, Route.model)
    )
    return [threshold_dict(t, r) for t, r in result.all()]


async def _route(session: AsyncSession, route: str, model: str) -> Route:
    row = await session.scalar(select(Route).where(Route.route == route, Route.model == model))
    if row is None:
        raise UnknownRoute(route, model)
    return row


async def get_threshold(session: AsyncSession, route: str, model: str) -> dict[str, Any]:
    """The threshold published for (route, model).

    Raises:
        UnknownRoute: no such route, or nothing published for it yet.
    """
    result = await session.execute(
        select(Threshold, Route)
        .join(Route, Route.id == Threshold.route_id)
        .where(Route.route == route, Route.model == model)
    )
    found = result.first()
    if found is None:
        if await session.scalar(select(Route.id).where(Route.route == route, Route.model == model)) is not None:
            raise UnknownRoute(
                route,
                model,
                f"route {route!r} with model {model!r} has no threshold yet: "
                "the controller publishes one at its next tick",
            )
        raise UnknownRoute(route, model)
    return threshold_dict(*found)


async def list_routes(session: AsyncSession) -> list[dict[str, Any]]:
    """Every route with its configuration and published threshold, ordered by (route, model)."""
    result = await session.execute(
        select(Route, Threshold).outerjoin(Threshold, Threshold.route_id == Route.id).order_by(Route.route, Route.model)
    )
    return [route_dict(r, t) for r, t in result.all()]


async def get_route(session: AsyncSession, route: str, model: str) -> dict[str, Any]:
    """One route with its configuration and published threshold.

    Raises:
        UnknownRoute: no such (route, model).
    """
    row = await _route(session, route, model)
    threshold = await session.get(Threshold, row.id)
    return route_dict(row, threshold)


async def get_history(
    session: AsyncSession, route: str, model: str, *, limit: int = 100, since: datetime | None = None
) -> list[dict[str, Any]]:
    """The newest ``limit`` history rows of (route, model), newest first.

    Args:
        since: when given (aware), only rows computed at or after it.

    Raises:
        UnknownRoute: no such (route, model).
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    row = await _route(session, route, model)
    result = await session.scalars(
        select(ThresholdHistory)
        .where(ThresholdHistory.route_id == row.id)
        .where(ThresholdHistory.computed_at >= since if since is not None else true())
        .order_by(ThresholdHistory.computed_at.desc(), ThresholdHistory.id.desc())
        .limit(limit)
    )
    return [history_row_dict(h, row) for h in result.all()]
