"""Manual changes of a route's configuration, applied at once and audited in the history.

An operator may change ``enabled``, ``budget``, ``default_hedge_after_s``, the bounds, or pin a
value (``pinned_hedge_after_s``; None unpins). The new configuration is validated as a
:class:`~hedgerow.controller.policy.RouteConfig`, stored, and the route is ticked right away so the
published threshold follows; that history row carries the operator's name in ``actor``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.jobs import tick_route
from hedgerow.controller.models import Route, Threshold, utc_now
from hedgerow.controller.policy import RouteConfig
from hedgerow.controller.queries import route_dict

__all__ = ["ROUTE_CONFIG_FIELDS", "update_route"]

#: The fields an operator may change.
ROUTE_CONFIG_FIELDS: tuple[str, ...] = (
    "enabled", "budget", "default_hedge_after_s", "min_hedge_after_s", "max_hedge_after_s",
    "pinned_hedge_after_s",
)  # fmt: skip


async def update_route(
    sessionmaker: async_sessionmaker,
    settings: Any,
    route: str,
    model: str,
    changes: dict[str, Any],
    *,
    actor: str,
    now: datetime | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Change a route's configuration, re-decide its threshold at once, audit it in the history.

    Args:
        sessionmaker: from :func:`hedgerow.controller.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings``.
        route, model: which route.
        changes: a subset of :data:`ROUTE_CONFIG_FIELDS` with new values.
        actor: who made the change (stored in ``threshold_history.actor``).
        now: the time of the change (aware UTC; default: the clock).

    Returns:
        ``(route, history_row)`` as the api returns them.

    Raises:
        UnknownRoute: no such (route, model).
        ValueError: an unknown field, or a value out of range (named in the message).
    """
    unknown = sorted(set(changes) - set(ROUTE_CONFIG_FIELDS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a route setting ({', '.join(ROUTE_CONFIG_FIELDS)})")
    now = now or utc_now()
    async with sessionmaker() as session, session.begin():
        row = await session.scalar(
            select(Route).where(Route.route == route, Route.model == model).with_for_update()
        )
        if row is None:
            raise UnknownRoute(route, model)
        merged = {name: getattr(row, name) for name in ROUTE_CONFIG_FIELDS} | changes
        RouteConfig(**merged)  # raises ValueError naming the bad field
        for name, value in merged.items():
            setattr(row, name, value)
        row.updated_at = now
    async with sessionmaker() as session:
        threshold = await session.get(Threshold, row.id)
    current = None if threshold is None else threshold.hedge_after_s
    history = await tick_route(sessionmaker, settings, row, current, now=now, actor=actor)
    async with sessionmaker() as session:
        threshold = await session.get(Threshold, row.id)
    return route_dict(row, threshold), history
