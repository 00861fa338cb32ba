"""Read side of the store: thresholds, routes and history as the JSON dicts the api returns.

Shapes (timestamps are ISO 8601 UTC strings with a ``Z``; durations float seconds):

- threshold: ``{"route", "model", "hedge_after_s", "enabled", "source", "version", "budget",
  "updated_at"}``
- route: ``{"route", "model", "enabled", "budget", "default_hedge_after_s", "min_hedge_after_s",
  "max_hedge_after_s", "pinned_hedge_after_s", "created_at", "updated_at", "archived_at",
  "archived_by", "threshold"}`` where ``threshold`` is a threshold dict or None before the first
  tick, and ``archived_at``/``archived_by`` are null for a route in use.

Archived routes (``routes.archived_at`` set, :mod:`hedgerow.controller.routes_admin`) are left
out of :func:`list_routes` (unless asked for) and :func:`list_thresholds`, and
:func:`get_threshold` answers :class:`UnknownRoute` for them; :func:`get_route` and
:func:`get_history` still read them.
- history row: exactly :data:`HISTORY_FIELDS`: the DESIGN.md fields, then ``actor`` (the token
  or name behind a manual change; null for the controller job) and ``details`` (a JSON object or
  null: ``quantile_lower_bounds_s`` for the quantiles left null, ``target_s``, ``short_window``,
  ``p99_check``, and for a ``config`` row ``changes``: ``{"field": {"from": x, "to": y}}``), then
  ``repeats`` (ticks the row stands for: identical holds are merged into one row) and ``last_at``
  (the latest of those ticks).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ScalarSelect, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.client.records import format_timestamp
from hedgerow.controller.errors import AmbiguousModel, UnknownRoute
from hedgerow.controller.store.models import Route, Threshold, ThresholdHistory

__all__ = [
    "HISTORY_FIELDS",
    "THRESHOLD_FIELDS",
    "get_history",
    "get_route",
    "get_threshold",
    "history_row_dict",
    "list_routes",
    "list_thresholds",
    "newest_history_id",
    "resolve_model",
    "route_dict",
    "route_row",
    "threshold_dict",
]

#: The keys of a history row, in order (DESIGN.md "controller"; contracts.md).
HISTORY_FIELDS: tuple[str, ...] = (
    "computed_at", "route", "model", "previous_hedge_after_s", "hedge_after_s", "applied",
    "reason", "source", "window_s", "samples", "censored", "p50_s", "p75_s", "p90_s", "p95_s",
    "p99_s", "observed_hedge_rate", "backup_win_rate", "budget", "actor", "details", "repeats", "last_at",
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
        "repeats": row.repeats,
        "last_at": format_timestamp(row.last_at),
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
        "archived_at": None if route.archived_at is None else format_timestamp(route.archived_at),
        "archived_by": route.archived_by,
        "threshold": None if threshold is None else threshold_dict(threshold, route),
    }


async def list_thresholds(session: AsyncSession) -> list[dict[str, Any]]:
    """Every published threshold of a route not archived, ordered by (route, model)."""
    result = await session.execute(
        select(Threshold, Route)
        .join(Route, Route.id == Threshold.route_id)
        .where(Route.archived_at.is_(None))
        .order_by(Route.route, Route.model)
    )
    return [threshold_dict(t, r) for t, r in result.all()]


async def _route(session: AsyncSession, route: str, model: str) -> Route:
    row = await session.scalar(select(Route).where(Route.route == route, Route.model == model))
    if row is None:
        raise UnknownRoute(route, model)
    return row


async def route_row(session: AsyncSession, route: str, model: str) -> Route:
    """The ``routes`` row of (route, model).

    Raises:
        UnknownRoute: no such (route, model).
    """
    return await _route(session, route, model)


async def get_threshold(session: AsyncSession, route: str, model: str) -> dict[str, Any]:
    """The threshold published for (route, model).

    Raises:
        UnknownRoute: no such route, nothing published for it yet, or it is archived.
    """
    result = await session.execute(
        select(Threshold, Route)
        .join(Route, Route.id == Threshold.route_id)
        .where(Route.route == route, Route.model == model)
    )
    found = result.first()
    if found is not None and found[1].archived_at is None:
        return threshold_dict(*found)
    stored = (
        await session.execute(select(Route.id, Route.archived_at).where(Route.route == route, Route.model == model))
    ).first()
    if stored is not None and stored[1] is not None:
        raise UnknownRoute(
            route,
            model,
            f"route {route!r} with model {model!r} is archived: no threshold is published for it"
            " (clients use their own default policy)",
        )
    if stored is not None:
        raise UnknownRoute(
            route,
            model,
            f"route {route!r} with model {model!r} has no threshold yet: the controller publishes one at its next tick",
        )
    raise UnknownRoute(route, model)


async def list_routes(session: AsyncSession, *, archived: bool = False) -> list[dict[str, Any]]:
    """Every route with its configuration and published threshold, ordered by (route, model).

    Args:
        session: an open session.
        archived: False (default) for the routes in use, True for the archived ones only.
    """
    state = Route.archived_at.is_not(None) if archived else Route.archived_at.is_(None)
    result = await session.execute(
        select(Route, Threshold)
        .outerjoin(Threshold, Threshold.route_id == Route.id)
        .where(state)
        .order_by(Route.route, Route.model)
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


async def resolve_model(session: AsyncSession, route: str, model: str | None) -> str:
    """The model of ``route`` to use when the caller may leave it out.

    Args:
        route: the route's name.
        model: the model the caller named, or None.

    Returns:
        ``model`` when given; else the route's only model.

    Raises:
        UnknownRoute: no such route (with any model, when ``model`` is None).
        AmbiguousModel: ``model`` is None and the route has several models (listed).
    """
    if model is not None:
        return model
    models = list(await session.scalars(select(Route.model).where(Route.route == route).order_by(Route.model)))
    if not models:
        raise UnknownRoute(route, "", f"no route {route!r}")
    if len(models) > 1:
        raise AmbiguousModel(route, models)
    return models[0]


async def get_history(
    session: AsyncSession,
    route: str,
    model: str,
    *,
    limit: int = 100,
    since: datetime | None = None,
    until: datetime | None = None,
    applied: bool | None = None,
    reason: str | None = None,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """History rows of (route, model), newest first, ``offset`` rows skipped, at most ``limit``.

    Args:
        limit: most rows returned, >= 1.
        since: when given (aware), only rows whose latest tick (``last_at``) is at or after it.
        until: when given (aware), only rows first computed (``computed_at``) at or before it.
        applied: when given, only rows whose ``applied`` equals it.
        reason: when given, only rows with this reason code among their comma-separated codes.
        offset: rows skipped first (paging), >= 0.

    Raises:
        UnknownRoute: no such (route, model).
        ValueError: ``limit`` below 1 or ``offset`` below 0.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    row = await _route(session, route, model)
    query = select(ThresholdHistory).where(ThresholdHistory.route_id == row.id)
    if since is not None:
        query = query.where(ThresholdHistory.last_at >= since)
    if until is not None:
        query = query.where(ThresholdHistory.computed_at <= until)
    if applied is not None:
        query = query.where(ThresholdHistory.applied == applied)
    if reason is not None:
        codes = ThresholdHistory.reason
        query = query.where(
            or_(
                codes == reason,
                codes.startswith(f"{reason},", autoescape=True),
                codes.endswith(f",{reason}", autoescape=True),
                codes.contains(f",{reason},", autoescape=True),
            )
        )
    result = await session.scalars(
        query.order_by(ThresholdHistory.computed_at.desc(), ThresholdHistory.id.desc()).offset(offset).limit(limit)
    )
    return [history_row_dict(h, row) for h in result.all()]


def newest_history_id() -> ScalarSelect[int]:
    """The id of a route's newest history row (by ``computed_at``, then ``id``), as a scalar
    subquery correlated to :class:`Route`: use it in a statement that selects from ``routes``."""
    return (
        select(ThresholdHistory.id)
        .where(ThresholdHistory.route_id == Route.id)
        .order_by(ThresholdHistory.computed_at.desc(), ThresholdHistory.id.desc())
        .limit(1)
        .correlate(Route)
        .scalar_subquery()
    )
