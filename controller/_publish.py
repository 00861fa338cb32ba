"""The tick's publish step: publish locks, the history row and the threshold (step 4 of ``jobs``).

Every writer of a route's published threshold takes the route's publish lock first
(:func:`lock_route`, or :func:`lock_routes` for a whole tick), re-reads the route and its
threshold, and writes only when they are still what its decision was made from
(:func:`publish_decision` raises :class:`StaleInputs` otherwise). :func:`write_decision` stages
one decision's ``threshold_history`` row (a repeat of the latest hold counts it again) and its
threshold (version + 1 on any change of a served field); :func:`history_details` is the row's
``details`` JSON. The facade :mod:`hedgerow.controller.jobs` re-exports the public names.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.policy.estimation import QUANTILE_LEVELS
from hedgerow.controller.policy.policy import Decision, Observation, RouteConfig
from hedgerow.controller.store.db import WriteFence
from hedgerow.controller.store.models import Route, Threshold, ThresholdHistory
from hedgerow.controller.store.queries import history_row_dict, newest_history_id

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "Fence",
    "StaleInputs",
    "history_details",
    "latest_history",
    "lock_route",
    "lock_routes",
    "publish_decision",
    "route_config",
    "write_decision",
]

#: ``await fence(session)`` inside a publishing transaction, after its publish locks: raises
#: :class:`~hedgerow.controller.lease.LeaseLost` when the publisher no longer holds its lease.
#: The same check every writing job runs (:data:`~hedgerow.controller.store.db.WriteFence`).
Fence = WriteFence


def route_config(route: Route) -> RouteConfig:
    return RouteConfig(
        enabled=route.enabled,
        budget=route.budget,
        default_hedge_after_s=route.default_hedge_after_s,
        min_hedge_after_s=route.min_hedge_after_s,
        max_hedge_after_s=route.max_hedge_after_s,
        pinned_hedge_after_s=route.pinned_hedge_after_s,
    )


def history_details(decision: Decision, observation: Observation, settings: Settings) -> dict[str, Any]:
    """The ``threshold_history.details`` JSON of one decision.

    Keys (each only when it applies):

    - ``quantile_lower_bounds_s``: ``{"p99_s": 4.2, ...}`` for every quantile left null because
      the KM curve never reached its level; the bound is a one-sided confidence lower bound
      (``TTFTEstimate.quantile_lower_bound_s``, at most the largest observed duration);
    - ``target_s``: the KM budget target (null when no observed time qualified);
    - ``wanted_hedge_rate``: (hedged + denied) / calls of the window (``observed_hedge_rate``
      in the row stays the rate of hedges actually sent);
    - ``short_window``: ``{"window_s", "calls", "hedge_rate", "wanted_rate", "target_s"}``, the
      inputs of rule 4 (``window_s`` no longer than the window after a detected change);
    - ``objective``, ``censored``, ``small_sample_test``, ``over_budget_test``, ``drift``,
      ``binding``: the inputs of the policy's rules and the constraint that set the value
      (see ``policy``);
    - ``p99_check``: the inputs of the ``hedges_did_not_lower_p99`` flag (see ``policy``).
    """
    details: dict[str, Any] = {}
    estimate = observation.estimate
    if estimate is not None:
        bounds = {
            name: estimate.quantile_lower_bound_s(level)
            for name, level in QUANTILE_LEVELS.items()
            if getattr(estimate, name) is None
        }
        if bounds:
            details["quantile_lower_bounds_s"] = bounds
        details["target_s"] = estimate.target_s
    details["wanted_hedge_rate"] = observation.wanted_hedge_rate
    details["short_window"] = {
        # after a detected change the short window holds only the data since it
        "window_s": min(float(settings.short_window_s), observation.window_s)
        if observation.drift is not None
        else float(settings.short_window_s),
        "calls": observation.short_window_calls,
        "hedge_rate": observation.short_window_hedge_rate,
        "wanted_rate": observation.short_window_wanted_rate,
        "target_s": observation.short_window_target_s,
    }
    details.update(decision.details)
    return details


class StaleInputs(Exception):
    """The route's configuration or published value changed between a decision's reads and its
    publish (e.g. a ``PATCH`` landed in between); carries the values as re-read."""

    def __init__(self, route: Route, current: float | None, current_source: str | None) -> None:
        super().__init__(f"route {route.route!r} model {route.model!r} changed while deciding")
        self.route = route
        self.current = current
        self.current_source = current_source


def _detached_route(route: Route) -> Route:
    """A transient copy of a route row (column values only), safe to read after its session
    rolled back or closed."""
    return Route(**{column.key: getattr(route, column.key) for column in Route.__table__.columns})


async def lock_route(session: AsyncSession, route_id: int) -> tuple[Route, Threshold | None]:
    """Take a route's publish lock in the session's open transaction; re-read route and threshold.

    Every writer of a route's published threshold (the controller's :func:`~hedgerow.controller.jobs.tick_route` and
    ``routes_admin.configure_route``) calls this inside its write transaction **before** it
    reads the values it decides from, so that read-decide-write is atomic:

    - the first statement is a no-op ``UPDATE routes SET budget = budget WHERE id = ?``: on
      SQLite it takes the database's write lock at once (a later writer waits on the busy
      timeout, and nothing can commit between this read and our write); on PostgreSQL it
      locks the route row (``FOR NO KEY UPDATE`` strength, which conflicts with another
      publisher's lock and with ``SELECT ... FOR UPDATE`` but not with inserts of calls that
      reference the route);
    - then the route and its threshold are re-read (``populate_existing``: objects already in
      the session are refreshed, not served stale from its identity map), the threshold
      ``FOR UPDATE`` on PostgreSQL (ignored on SQLite).

    Args:
        session: a session whose transaction is open (``session.begin()``).
        route_id: the ``routes.id``.

    Returns:
        ``(route, threshold)`` as stored now; ``threshold`` is None when nothing was published.

    Raises:
        LookupError: no route with that id (deleted in the meantime).
    """
    await session.execute(
        update(Route)
        .where(Route.id == route_id)
        .values(budget=Route.budget)
        .execution_options(synchronize_session=False)
    )
    route = await session.scalar(select(Route).where(Route.id == route_id).execution_options(populate_existing=True))
    if route is None:
        raise LookupError(f"route id {route_id} no longer exists")
    threshold = await session.scalar(
        select(Threshold)
        .where(Threshold.route_id == route_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return route, threshold


async def latest_history(session: AsyncSession, route_ids: list[int]) -> dict[int, ThresholdHistory]:
    """Each route's latest history row (by ``computed_at``, then ``id``), one query for all.

    Args:
        session: an open session.
        route_ids: the ``routes.id`` values.

    Returns:
        ``{route_id: row}`` for the routes with any history.
    """
    if not route_ids:
        return {}
    ids = select(newest_history_id()).select_from(Route).where(Route.id.in_(route_ids))
    rows = await session.scalars(select(ThresholdHistory).where(ThresholdHistory.id.in_(ids)))
    return {row.route_id: row for row in rows}


def _merge_repeat(
    latest: ThresholdHistory | None,
    route: Route,
    current: float | None,
    decision: Decision,
    actor: str | None,
    now: datetime,
) -> ThresholdHistory | None:
    """The route's latest history row, counted once more, when this decision repeats it.

    A decision repeats the latest row when both are holds of the controller job (not applied, no
    actor) with the same published value before and after, the same reason and the same source.
    Then that row gets ``repeats + 1`` and ``last_at = now`` (the caller refreshes its figures)
    instead of a new row being added: history grows with decisions, not ticks. Applied changes,
    manual changes and every change of reason stay rows of their own.

    Args:
        latest: the route's latest history row (:func:`latest_history`), or None.
        route: the route as re-read under the lock.
        current: the value published now (before this decision), seconds, or None.
        decision: this tick's decision.
        actor: who asked (None for the controller job).
        now: the tick's time.

    Returns:
        The updated row, or None when a new row must be written.
    """
    if decision.applied or actor is not None or current is None:
        return None
    if latest is None or latest.applied or latest.actor is not None:
        return None
    same = (
        latest.reason == decision.reason
        and latest.source == decision.source
        and latest.hedge_after_s == decision.hedge_after_s
        and latest.previous_hedge_after_s == current
        and latest.budget == route.budget
        and latest.last_at <= now
    )
    if not same:
        return None
    latest.repeats += 1
    latest.last_at = now
    return latest


async def publish_decision(
    sessionmaker: async_sessionmaker[AsyncSession],
    route: Route,
    previous: float | None,
    decision: Decision,
    observation: Observation,
    now: datetime,
    *,
    details: dict[str, Any],
    actor: str | None = None,
    fence: Fence | None = None,
) -> dict[str, Any]:
    """Write the history row and the threshold of one decision (one transaction).

    ``fence`` (a lease check, see :func:`~hedgerow.controller.jobs.run_tick`) runs under the route's
    publish lock, before anything is written.

    The decision was made from ``route``'s configuration and the published value
    ``previous``, read earlier in other transactions. Here, under :func:`lock_route`, both are
    re-read; if either changed in the meantime (an operator's change, another tick), nothing is
    written and :class:`StaleInputs` carries the values as re-read so that the caller decides
    again. Otherwise the history row's ``previous_hedge_after_s`` is the value as re-read, so
    each history row's ``previous_hedge_after_s`` equals the value the row before it published.
    """
    async with sessionmaker() as session, session.begin():
        fresh, threshold = await lock_route(session, route.id)
        if fence is not None:
            await fence(session)
        fresh_current = None if threshold is None else threshold.hedge_after_s
        if route_config(fresh) != route_config(route) or fresh_current != previous:
            raise StaleInputs(_detached_route(fresh), fresh_current, None if threshold is None else threshold.source)
        latest = (await latest_history(session, [fresh.id])).get(fresh.id)
        row = write_decision(session, fresh, threshold, latest, decision, observation, now, details, actor)
        await session.flush()
    return history_row_dict(row, fresh)


def write_decision(
    session: AsyncSession,
    fresh: Route,
    threshold: Threshold | None,
    latest: ThresholdHistory | None,
    decision: Decision,
    observation: Observation,
    now: datetime,
    details: dict[str, Any],
    actor: str | None,
) -> ThresholdHistory:
    """Stage one decision's history row (new, or the latest one counted again) and threshold.

    The caller holds the route's publish lock (:func:`lock_route` or :func:`lock_routes`) and
    has checked that ``fresh`` and ``threshold`` are what the decision was made from; it
    flushes. Returns the history row written or updated.
    """
    estimate = observation.estimate
    fresh_current = None if threshold is None else threshold.hedge_after_s
    samples = 0 if estimate is None else estimate.samples
    censored = 0 if estimate is None else estimate.censored
    merged = _merge_repeat(latest, fresh, fresh_current, decision, actor, now)
    if merged is not None:
        merged.window_s = observation.window_s
        merged.samples, merged.censored = samples, censored
        if estimate is not None:
            merged.p50_s, merged.p75_s, merged.p90_s = estimate.p50_s, estimate.p75_s, estimate.p90_s
            merged.p95_s, merged.p99_s = estimate.p95_s, estimate.p99_s
        else:
            merged.p50_s = merged.p75_s = merged.p90_s = merged.p95_s = merged.p99_s = None
        merged.observed_hedge_rate = observation.observed_hedge_rate
        merged.backup_win_rate = observation.backup_win_rate
        merged.details = details or None
        return merged
    history = ThresholdHistory(
        route_id=fresh.id,
        computed_at=now,
        last_at=now,
        repeats=1,
        previous_hedge_after_s=fresh_current,
        hedge_after_s=decision.hedge_after_s,
        applied=decision.applied,
        reason=decision.reason,
        source=decision.source,
        window_s=observation.window_s,
        samples=samples,
        censored=censored,
        p50_s=None if estimate is None else estimate.p50_s,
        p75_s=None if estimate is None else estimate.p75_s,
        p90_s=None if estimate is None else estimate.p90_s,
        p95_s=None if estimate is None else estimate.p95_s,
        p99_s=None if estimate is None else estimate.p99_s,
        observed_hedge_rate=observation.observed_hedge_rate,
        backup_win_rate=observation.backup_win_rate,
        budget=fresh.budget,
        actor=actor,
        details=details or None,
    )
    session.add(history)
    if threshold is None:
        session.add(
            Threshold(
                route_id=fresh.id,
                hedge_after_s=decision.hedge_after_s,
                enabled=fresh.enabled,
                source=decision.source,
                version=1,
                updated_at=now,
            )
        )
    else:
        # every field the api serves of a published row (value, enabled, source, the route's
        # budget as of the latest decision) bumps the version when it changes
        budget_changed = latest is not None and latest.budget != fresh.budget
        if (
            threshold.hedge_after_s != decision.hedge_after_s
            or threshold.enabled != fresh.enabled
            or threshold.source != decision.source
            or budget_changed
        ):
            threshold.version += 1
            threshold.hedge_after_s = decision.hedge_after_s
            threshold.enabled = fresh.enabled
            threshold.source = decision.source
            threshold.updated_at = now
    return history


async def lock_routes(session: AsyncSession, route_ids: list[int]) -> dict[int, tuple[Route, Threshold | None]]:
    """:func:`lock_route` for many routes at once: take their publish locks, re-read them.

    The first statement takes the locks: on SQLite the no-op ``UPDATE`` of :func:`lock_route`
    (the database's write lock), on PostgreSQL ``SELECT ... ORDER BY id FOR NO KEY UPDATE``
    (the strength of that ``UPDATE``), in ``id`` order so that two writers of overlapping sets
    wait for each other instead of deadlocking. Then the routes and their thresholds are re-read
    (``populate_existing``), the thresholds ``FOR UPDATE`` on PostgreSQL.

    Args:
        session: a session whose transaction is open.
        route_ids: the ``routes.id`` values.

    Returns:
        ``{route_id: (route, threshold)}`` for the routes that still exist.
    """
    if not route_ids:
        return {}
    if (await session.connection()).dialect.name == "postgresql":
        await session.execute(
            select(Route.id).where(Route.id.in_(route_ids)).order_by(Route.id).with_for_update(key_share=True)
        )
    else:
        await session.execute(
            update(Route)
            .where(Route.id.in_(route_ids))
            .values(budget=Route.budget)
            .execution_options(synchronize_session=False)
        )
    routes = await session.scalars(
        select(Route).where(Route.id.in_(route_ids)).execution_options(populate_existing=True)
    )
    thresholds = await session.scalars(
        select(Threshold)
        .where(Threshold.route_id.in_(route_ids))
        .order_by(Threshold.route_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    by_route = {threshold.route_id: threshold for threshold in thresholds}
    return {route.id: (route, by_route.get(route.id)) for route in routes}
