"""The routes of ingest: a new route's configuration, the bounds on new routes, the route ids of a
batch (created when new, refused when archived) and the per-process :class:`RouteIdCache` of them.

Behind :mod:`hedgerow.controller.store.ingest` (which re-exports these names); its module
docstring says how a batch is written and why archived routes are refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.errors import RouteArchived, RouteLimitExceeded
from hedgerow.controller.policy.route_config import RouteConfig
from hedgerow.controller.store.db import dialect_insert
from hedgerow.controller.store.models import Route, utc_now

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "ROUTE_ID_MAX_AGE_S",
    "RouteIdCache",
    "check_route_limits",
    "ensure_routes",
    "route_defaults",
]

#: Rows per statement (keeps SQLite under its bound-parameter limit).
_CHUNK_ROWS = 200


def route_defaults(settings: Settings) -> RouteConfig:
    """The configuration a route gets when it is first seen, from ``hedgerow.settings.Settings``.

    Raises:
        ValueError: when a default is out of range (named in the message).
    """
    return RouteConfig(
        enabled=True,
        budget=settings.default_budget,
        default_hedge_after_s=settings.default_hedge_after_s,
        min_hedge_after_s=settings.min_hedge_after_s,
        max_hedge_after_s=settings.max_hedge_after_s,
        pinned_hedge_after_s=None,
    )


async def check_route_limits(
    session: AsyncSession, pairs: Sequence[tuple[str, str]], *, max_routes: int, max_models_per_route: int
) -> None:
    """Refuse (route, model) pairs that are not stored yet when creating them would pass a bound.

    Counts the rows already stored that are not archived plus the new pairs: at most
    ``max_routes`` (route, model) rows in all, at most ``max_models_per_route`` models per route
    name (an archived route counts against neither, and is not new: it exists). Two transactions
    creating routes at the same moment may each pass the check, so the bound can be passed by
    the new pairs of concurrent batches (at most one batch each), never more.

    Args:
        session: an open session.
        pairs: the (route, model) pairs about to be ensured.
        max_routes: the most (route, model) rows, >= 1.
        max_models_per_route: the most models of one route, >= 1.

    Raises:
        RouteLimitExceeded: for the first new pair (in sorted order) past a bound.
    """
    wanted = sorted(set(pairs))
    if not wanted:
        return
    existing: set[tuple[str, str]] = set()
    for start in range(0, len(wanted), _CHUNK_ROWS):
        chunk = wanted[start : start + _CHUNK_ROWS]
        result = await session.execute(
            select(Route.route, Route.model).where(tuple_(Route.route, Route.model).in_(chunk))
        )
        existing.update((r, m) for r, m in result.all())
    new = [pair for pair in wanted if pair not in existing]
    if not new:
        return
    active = Route.archived_at.is_(None)
    total = int(await session.scalar(select(func.count()).select_from(Route).where(active)) or 0)
    names = sorted({route for route, _model in new})
    per_route: dict[str, int] = {}
    for start in range(0, len(names), _CHUNK_ROWS):
        chunk_names = names[start : start + _CHUNK_ROWS]
        result = await session.execute(
            select(Route.route, func.count()).where(Route.route.in_(chunk_names), active).group_by(Route.route)
        )
        per_route.update({route: int(count) for route, count in result.all()})
    for route, model in new:
        if total >= max_routes:
            raise RouteLimitExceeded(route, model, "route", max_routes)
        if per_route.get(route, 0) >= max_models_per_route:
            raise RouteLimitExceeded(route, model, "model", max_models_per_route)
        total += 1
        per_route[route] = per_route.get(route, 0) + 1


async def ensure_routes(
    session: AsyncSession,
    pairs: Sequence[tuple[str, str]],
    defaults: RouteConfig,
    *,
    max_routes: int | None = None,
    max_models_per_route: int | None = None,
) -> dict[tuple[str, str], int]:
    """Create the missing (route, model) rows with ``defaults``; return every pair's route id.

    Args:
        session: an open session; the caller commits.
        pairs: (route, model) pairs, in any order, repeats allowed.
        defaults: configuration of a newly created route.
        max_routes, max_models_per_route: bounds checked by :func:`check_route_limits` before
            anything is created (None: unbounded).

    Raises:
        RouteLimitExceeded: a new pair would pass a bound; nothing was created.
        RouteArchived: a pair is an archived route (the first in (route, model) order); roll
            back (other pairs may have been created).
    """
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    if max_routes is not None or max_models_per_route is not None:
        await check_route_limits(
            session,
            wanted,
            max_routes=max_routes if max_routes is not None else 2**62,
            max_models_per_route=max_models_per_route if max_models_per_route is not None else 2**62,
        )
    now = utc_now()
    rows = [
        {
            "route": route,
            "model": model,
            "enabled": defaults.enabled,
            "budget": defaults.budget,
            "default_hedge_after_s": defaults.default_hedge_after_s,
            "min_hedge_after_s": defaults.min_hedge_after_s,
            "max_hedge_after_s": defaults.max_hedge_after_s,
            "pinned_hedge_after_s": defaults.pinned_hedge_after_s,
            "created_at": now,
            "updated_at": now,
        }
        for route, model in wanted
    ]
    for start in range(0, len(rows), _CHUNK_ROWS):
        stmt = dialect_insert(session, Route).on_conflict_do_nothing(index_elements=["route", "model"])
        await session.execute(stmt, rows[start : start + _CHUNK_ROWS])
    ids: dict[tuple[str, str], int] = {}
    archived: list[tuple[str, str, datetime]] = []
    for start in range(0, len(wanted), _CHUNK_ROWS):
        chunk = wanted[start : start + _CHUNK_ROWS]
        result = await session.execute(
            select(Route.route, Route.model, Route.id, Route.archived_at).where(
                tuple_(Route.route, Route.model).in_(chunk)
            )
        )
        for route, model, route_id, archived_at in result.all():
            ids[(route, model)] = route_id
            if archived_at is not None:
                archived.append((route, model, archived_at))
    if archived:
        raise RouteArchived(*min(archived))
    return ids


#: Seconds a :class:`RouteIdCache` trusts what it learnt before it starts again empty: the
#: longest a record of a route archived through another ``serve`` process may still be stored.
ROUTE_ID_MAX_AGE_S = 5.0


class RouteIdCache:
    """The ids of (route, model) rows known to exist and not archived, kept between batches of one process.

    A route row is never deleted while the store serves (routes are only created, changed and
    archived), so an id once committed stays right; the cache only learns ids after the
    transaction that read or created them committed (:meth:`add`). It holds at most
    ``max_entries`` pairs (the store's own bound is ``HEDGEROW_MAX_ROUTES``); past that it starts
    again empty. A pair archived through this process is forgotten at once (:meth:`forget`);
    one archived through another process is seen when this cache starts again empty, at most
    ``max_age_s`` after it learnt it: every pair is then read again (with its archive mark, see
    :func:`ensure_routes`) by the next batch naming it.

    Args:
        max_entries: most pairs kept, >= 1.
        max_age_s: seconds after which the cache starts again empty, > 0.
        clock: monotonic seconds (a fake clock in tests).
    """

    def __init__(
        self,
        max_entries: int = 100_000,
        *,
        max_age_s: float = ROUTE_ID_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be >= 1, got {max_entries!r}")
        if not (math.isfinite(max_age_s) and max_age_s > 0):
            raise ValueError(f"max_age_s: must be a finite number of seconds > 0, got {max_age_s!r}")
        self._ids: dict[tuple[str, str], int] = {}
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._clock = clock
        self._started_at = clock()

    def __len__(self) -> int:
        """Pairs known."""
        return len(self._ids)

    def lookup(self, pairs: Iterable[tuple[str, str]]) -> tuple[dict[tuple[str, str], int], list[tuple[str, str]]]:
        """Split ``pairs`` into ``({pair: id} known, [pairs not known])`` (every pair is not
        known once the cache is older than ``max_age_s``: it starts again empty)."""
        if self._clock() - self._started_at > self._max_age_s:
            self.clear()
        known: dict[tuple[str, str], int] = {}
        missing: list[tuple[str, str]] = []
        for pair in pairs:
            route_id = self._ids.get(pair)
            if route_id is None:
                missing.append(pair)
            else:
                known[pair] = route_id
        return known, missing

    def add(self, ids: Mapping[tuple[str, str], int]) -> None:
        """Remember committed ids (call only after the transaction that read them committed)."""
        if len(self._ids) + len(ids) > self._max_entries:
            self._ids.clear()
        self._ids.update(ids)

    def forget(self, route: str, model: str) -> None:
        """Forget one pair (archived: the next batch naming it reads it again, and is refused)."""
        self._ids.pop((route, model), None)

    def clear(self) -> None:
        """Forget every id; the ``max_age_s`` clock starts again."""
        self._ids.clear()
        self._started_at = self._clock()
