"""A route change made through this server, and what it changes in this process at once: the one
copy for the JSON api (:mod:`hedgerow.api.routes`) and the console (:mod:`hedgerow.api.pages`).

Every change (settings, archive, restore) empties the poll cache of ``GET /v1/thresholds``
(:meth:`hedgerow.api._threshold_cache.ThresholdCache.invalidate`), so a client's next poll sees
the new threshold without waiting for the cache's next check of the store. An archive also drops
the route from ingest's route-id cache (``RouteIdCache.forget``), so this process refuses the
route's records at once. The store's rules are :mod:`hedgerow.controller.routes_admin`'s; the
errors it raises pass through unchanged (nothing is invalidated when one is raised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hedgerow.controller.routes_admin import archive_route, configure_route, restore_route

if TYPE_CHECKING:
    from hedgerow.api._state import AppState
    from hedgerow.controller.routes_admin import RouteArchive, RouteChange

__all__ = ["archive", "change_settings", "restore"]


async def change_settings(
    state: AppState, route: str, model: str, fields: dict[str, Any], *, replace: bool, actor: str
) -> RouteChange:
    """Patch (``replace=False``) or replace a route's settings
    (:func:`~hedgerow.controller.routes_admin.configure_route`), then empty the poll cache.

    Args:
        state: the app's state (its sessionmaker, settings and caches).
        route, model: the route.
        fields: the settings given (names of ``ROUTE_CONFIG_FIELDS``).
        replace: True for a ``PUT`` (omitted fields take the defaults of a new route).
        actor: who makes the change (audited).

    Returns:
        The change, as ``configure_route`` gives it.

    Raises:
        RouteConfigInvalid, RouteLimitExceeded, RouteArchived, UnknownRoute, ValueError: as
            ``configure_route`` raises them.
    """
    result = await configure_route(
        state.sessionmaker, state.settings, route, model, fields, replace=replace, actor=actor
    )
    state.thresholds.invalidate()
    return result


async def archive(state: AppState, route: str, model: str, *, actor: str) -> RouteArchive:
    """Archive the route (:func:`~hedgerow.controller.routes_admin.archive_route`); this process
    then refuses its records and its poll cache is emptied.

    Raises:
        UnknownRoute, ValueError: as ``archive_route`` raises them.
    """
    result = await archive_route(state.sessionmaker, route, model, actor=actor)
    state.route_ids.forget(route, model)
    state.thresholds.invalidate()
    return result


async def restore(state: AppState, route: str, model: str, *, actor: str) -> RouteArchive:
    """Restore an archived route (:func:`~hedgerow.controller.routes_admin.restore_route`), then
    empty the poll cache.

    Raises:
        UnknownRoute, RouteLimitExceeded, ValueError: as ``restore_route`` raises them.
    """
    result = await restore_route(state.sessionmaker, state.settings, route, model, actor=actor)
    state.thresholds.invalidate()
    return result
