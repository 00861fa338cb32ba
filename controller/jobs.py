"""The controller job: one tick sets every (route, model)'s published ``hedge_after_s``.

Per route, each tick (docs/DESIGN.md "controller"); steps 1-2 live in ``_observe``, step 4 in
``_publish``, and this module keeps the tick and run-once drivers and re-exports their names:

1. read every route's minute aggregates of the last ``window_s`` in one query and the calls
   of the last one to two minutes one by one in two more (:func:`observe_routes`; ingest keeps
   the aggregates in the calls' own transaction: per minute the counters and the log-bucketed
   histograms of the primary's and the backup's TTFT samples, observed and censored, and of the
   call-level TTFT, by the sample rules of :func:`window_records`); the routes whose primary
   samples are fewer than ``min_samples``, or too few for the budget's tail with no drift
   detected, are read again over ``max_window_s``. The cost grows with routes x minutes x
   non-empty buckets plus two minutes of calls, not with the window's calls; an older duration
   is known to its bucket (``_minute_window``). With ``HEDGEROW_CONTROLLER_OBSERVE=bounded``
   the aggregates are read up to ``now`` and only each route's latest 100 calls one by one
   (``_minute_window.RECENT_CALLS``), their counts taken out of their minutes: the cost no
   longer grows with the calls of the last minutes;
2. build the observation with ``_policy_window.observe_window``, the code the virtual-time
   benchmark runs too: the window doubles while samples are too few, shrinks to the data since
   a change the log-rank test detects (``_policy_drift``), and yields the Kaplan-Meier estimate
   with its curve and bounds, the backup's curve, the counts of the window and of the short
   window and the short window's primary samples;
3. :func:`hedgerow.controller.policy.policy.decide` (the ordered rules of ``_policy_rules``);
4. publish: a new threshold row gets version 1, a change of any field the api serves of it
   (value, enabled flag, source, budget) version + 1;
   and ALWAYS write a ``threshold_history`` row, applied or held, whose ``details`` JSON
   (:func:`history_details`) holds a one-sided lower bound for every quantile left null
   (``quantile_lower_bounds_s``), the KM target, the short-window figures, the binding
   constraint (``binding``) and the inputs of the rules that acted.

Worked number (the code's own output; ``tests/controller/test_jobs.py::
test_worked_number_in_module_docstring`` checks it): 2,000 calls in the last 50 minutes, primary
TTFT ~ Exp(mean 1 s) (true P90 = ln 10 = 2.303 s), hedged at 1.5 s with a backup TTFT ~ Exp(mean
0.5 s), ``random.Random(1)``. 479 calls hedged (23.95%); the backup won 324 of them, so 324
primaries are censored. The uncensored TTFTs alone give P90 = 1.465 s (far too low); the KM
estimate over the minute aggregates (each duration at its bucket's end, ``_minute_window``)
gives P50 0.724 s and P90 2.512 s, at or above the raw samples' 0.709 and 2.402 s by less than
a bucket; its curve does not reach 0.95, so P95 and P99 are null with one-sided 95% lower
bounds in ``details.quantile_lower_bounds_s`` of 2.630 s (the raw samples give a P95 of
2.754 s) and 3.631 s (the KM lower bound stays above 0.01 up to the longest duration seen; the
true P99 is 4.605 s). The target (upper 95% bound on S(t) <= 0.10) is 2.630 s (raw: 2.535 s),
where the true P(TTFT > t) = 7.2%. The objective (479 backup samples, the bucket replayed)
predicts a call P99 of 3.527 s there, the lowest of the search, and 3.595 s at 2.6985 s,
within the 2% tolerance with fewer hedges, so 2.6985 s is published (``cost_tie``). The short
window saw 20.1% of 199 calls hedged, but at 1.5 s: only 1 of its primaries is known to have
waited past 2.6985 s, no evidence against it. The call-level P99 (2.630 s) is under 0.95 x the
primary's P99 lower bound (3.631 s), so the hedges provably lowered the P99: no flag.

Reads and writes use separate short transactions, the write one starting with a write
(:func:`lock_routes` / :func:`lock_route`), so a SQLite writer never has to upgrade a stale read
snapshot. A tick (:func:`run_tick`) observes and decides every route first, then publishes every
decision in one transaction: it takes all the routes' publish locks, re-reads their configuration
and published value, and decides again, under the lock, any route whose values changed since
they were read. A single route's change (:func:`tick_route`, used by the route admin) publishes
optimistically in a transaction of its own and decides again when the values changed. Either way
a configuration change that lands between a tick's reads and its write is never overwritten, and
every history row's ``previous_hedge_after_s`` is the value the row before it published.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller._observe import (
    BackupSamples,
    WindowCounts,
    backup_samples,
    count_calls,
    latest_records,
    observe_route,
    observe_routes,
    routes_records,
    window_records,
)
from hedgerow.controller._publish import (
    Fence,
    StaleInputs,
    history_details,
    latest_history,
    lock_route,
    lock_routes,
    publish_decision,
    route_config,
    write_decision,
)
from hedgerow.controller.errors import ControllerError, LeaseHeld
from hedgerow.controller.events import log_threshold_change
from hedgerow.controller.lease import (
    CONTROLLER_LEASE,
    LeaseLost,
    acquire_lease,
    check_lease_held,
    lease_holder,
    make_holder_id,
    release_lease,
)
from hedgerow.controller.policy.policy import Decision, Observation, PolicyKnobs, decide
from hedgerow.controller.store.db import check_ready, make_engine, make_sessionmaker
from hedgerow.controller.store.models import Route, Threshold, ThresholdHistory, utc_now
from hedgerow.controller.store.queries import history_row_dict

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "PUBLISH_ATTEMPTS",
    "BackupSamples",
    "Fence",
    "WindowCounts",
    "backup_samples",
    "count_calls",
    "history_details",
    "latest_records",
    "lock_route",
    "lock_routes",
    "observe_route",
    "observe_routes",
    "routes_records",
    "run_once",
    "run_tick",
    "tick_route",
    "window_records",
]  # fmt: skip

log = logging.getLogger(__name__)

#: How many times :func:`tick_route` decides again when the route changed under it.
PUBLISH_ATTEMPTS = 5


@dataclass(slots=True)
class _Decided:
    """One route's decision of a tick, with what it was decided from."""

    route: Route
    current: float | None
    source: str | None
    observation: Observation
    decision: Decision
    details: dict[str, Any]


async def _decide_route(
    session: AsyncSession,
    settings: Settings,
    route: Route,
    current: float | None,
    source: str | None,
    now: datetime,
    knobs: PolicyKnobs,
    reason_prefix: str | None = None,
    extra_details: dict[str, Any] | None = None,
) -> _Decided:
    """Observe one route through ``session`` and decide."""
    observation = await observe_route(session, route, settings, now, knobs)
    # the objective replays the window's calls through the bucket: off the event loop
    return await asyncio.to_thread(
        _decided, settings, route, current, source, observation, knobs, reason_prefix, extra_details
    )


def _decided(
    settings: Settings,
    route: Route,
    current: float | None,
    source: str | None,
    observation: Observation,
    knobs: PolicyKnobs,
    reason_prefix: str | None = None,
    extra_details: dict[str, Any] | None = None,
) -> _Decided:
    """Decide one route from its observation (pure)."""
    decision = decide(route_config(route), current, observation, knobs, current_source=source)
    details = history_details(decision, observation, settings) | (extra_details or {})
    if reason_prefix:
        decision = replace(decision, reason=f"{reason_prefix},{decision.reason}")
    return _Decided(route, current, source, observation, decision, details)


def _decide_all(
    settings: Settings,
    routes: Sequence[tuple[Route, float | None, str | None]],
    observations: dict[int, Observation],
    knobs: PolicyKnobs,
) -> list[_Decided]:
    """Decide every observed route; a route whose decision fails is logged and left out."""
    decided = []
    for route, current, source in routes:
        if route.id not in observations:
            continue
        try:
            decided.append(_decided(settings, route, current, source, observations[route.id], knobs))
        except Exception:
            log.exception("controller tick failed for route %r model %r", route.route, route.model)
    return decided


async def run_tick(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    *,
    now: datetime | None = None,
    fence: Fence | None = None,
) -> list[dict[str, Any]]:
    """One controller tick over every (route, model).

    Every route is observed and decided first (reads only); then one transaction takes every
    route's publish lock (:func:`lock_routes`), checks that each route's configuration and
    published value are still those its decision was made from (a route changed in between,
    e.g. by a ``PATCH``, is observed and decided again under the lock, from the values as
    re-read), and writes every history row and threshold. A route whose observation or
    decision fails (e.g. a stored configuration out of range) is logged and skipped; the others
    go on. Should the shared write itself fail, each route is published in a transaction of its
    own instead (:func:`tick_route`), so that one bad row costs only its route.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings``.
        now: the tick's time (aware UTC; default: the current time). Calls started after the
            minute holding it are ignored (the minute aggregates place a call to its minute).
            This is the virtual-time entry point: ingest records with
            ``hedgerow.controller.ingest_calls`` (any ``started_at``) and call
            ``run_tick(sessionmaker, settings, now=t)`` for increasing ``t`` to replay a
            workload against a store; the decisions are those a live controller would make.
        fence: run inside every publishing transaction once its publish locks are taken,
            before it writes (the lease holder's check that it still holds the lease,
            :func:`hedgerow.controller.lease.check_lease_held`); when it raises
            :class:`~hedgerow.controller.lease.LeaseLost` the transaction rolls back and the
            tick ends with that error, nothing published. None: no check.

    Each applied change is logged as one ``threshold_changed`` line
    (:func:`hedgerow.controller.events.log_threshold_change`).

    Returns:
        The history rows written, one per route, as the api returns them
        (:func:`hedgerow.controller.store.queries.history_row_dict`), ordered by (route, model).

    Raises:
        ValueError: ``now`` is naive, or the settings give invalid policy knobs.
        LeaseLost: ``fence`` found the lease lost; nothing was published.
    """
    if now is None:
        now = utc_now()
    elif now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    now = now.astimezone(UTC)
    knobs = PolicyKnobs.from_settings(settings)
    async with sessionmaker() as session:
        result = await session.execute(
            select(Route, Threshold.hedge_after_s, Threshold.source)
            .outerjoin(Threshold, Threshold.route_id == Route.id)
            .where(Route.archived_at.is_(None))  # an archived route is not ticked
            .order_by(Route.route, Route.model)
        )
        routes = [(route, current, source) for route, current, source in result.all()]
    async with sessionmaker() as session:
        observations = await observe_routes(session, [route for route, _, _ in routes], settings, now, knobs)
    # the objective replays each window's latest calls through the bucket: off the event loop
    decided = await asyncio.to_thread(_decide_all, settings, routes, observations, knobs)
    try:
        written = await _publish_all(sessionmaker, settings, decided, now, knobs, fence)
    except LeaseLost:
        raise
    except Exception:
        log.exception("controller tick: the shared publish failed; publishing route by route")
        written = []
        for item in decided:
            try:
                written.append(
                    await tick_route(
                        sessionmaker,
                        settings,
                        item.route,
                        item.current,
                        now=now,
                        knobs=knobs,
                        current_source=item.source,
                        fence=fence,
                    )
                )
            except LeaseLost:
                raise
            except Exception:
                log.exception("controller tick failed for route %r model %r", item.route.route, item.route.model)
    for row in written:
        if row["applied"]:
            log_threshold_change(row)
    return written


async def _publish_all(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    decided: list[_Decided],
    now: datetime,
    knobs: PolicyKnobs,
    fence: Fence | None = None,
) -> list[dict[str, Any]]:
    """Write every decision of a tick in one transaction (see :func:`run_tick`)."""
    if not decided:
        return []
    ids = [item.route.id for item in decided]
    rows: list[tuple[ThresholdHistory, Route]] = []
    async with sessionmaker() as session, session.begin():
        locked = await lock_routes(session, ids)
        latest = await latest_history(session, ids)
        for item in decided:
            if item.route.id not in locked:
                log.info("route %r model %r was deleted during the tick", item.route.route, item.route.model)
                continue
            fresh, threshold = locked[item.route.id]
            if fresh.archived_at is not None:  # archived during the tick (routes_admin.archive_route)
                log.info("route %r model %r was archived during the tick", fresh.route, fresh.model)
                continue
            current = None if threshold is None else threshold.hedge_after_s
            chosen = item
            if route_config(fresh) != route_config(item.route) or current != item.current:
                source = None if threshold is None else threshold.source
                log.info("route %r model %r changed while deciding: deciding again", fresh.route, fresh.model)
                chosen = await _decide_route(session, settings, fresh, current, source, now, knobs)
            history = write_decision(
                session,
                fresh,
                threshold,
                latest.get(fresh.id),
                chosen.decision,
                chosen.observation,
                now,
                chosen.details,
                None,
            )
            rows.append((history, fresh))
        if fence is not None:  # last, so that the lease row is locked only for the flush and commit
            await fence(session)
        await session.flush()
        return [history_row_dict(history, route) for history, route in rows]


async def tick_route(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    route: Route,
    current_hedge_after_s: float | None,
    *,
    now: datetime,
    knobs: PolicyKnobs | None = None,
    actor: str | None = None,
    reason_prefix: str | None = None,
    extra_details: dict[str, Any] | None = None,
    current_source: str | None = None,
    fence: Fence | None = None,
) -> dict[str, Any]:
    """Observe, decide and publish for one route; returns the history row written.

    The observation and decision are read and computed outside the publishing transaction;
    the publish (:func:`lock_route`, then the write) re-reads the route's configuration and
    published value and, when either changed since (an operator's change landed in between),
    writes nothing and decides again from the values as re-read, up to
    :data:`PUBLISH_ATTEMPTS` times. So a tick never publishes a decision made from a stale
    value and never puts back a value that a configuration change replaced.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings``.
        route: the route row (its configuration as stored).
        current_hedge_after_s: the value published now, or None.
        now: the tick's time (aware UTC).
        knobs: policy knobs (default: from ``settings``).
        actor: who asked, for a manual change (stored in ``threshold_history.actor``).
        reason_prefix: a code put before the decision's reason codes (``"config"`` for a
            configuration change), or None.
        extra_details: merged into the row's ``details`` (e.g. ``{"changes": ...}``).
        current_source: the published value's source (``thresholds.source``), or None; passed
            to ``policy.decide`` (a ``pinned`` value on an unpinned route is not the
            controller's: the decision starts from the default).
        fence: a lease check run in the publishing transaction (see :func:`run_tick`), or None.

    Raises:
        ValueError: the stored route configuration is out of range (named in the message).
        ControllerError: the route changed under every one of :data:`PUBLISH_ATTEMPTS` attempts.
        LookupError: the route was deleted meanwhile.
        LeaseLost: ``fence`` found the lease lost; nothing was published.
    """
    knobs = knobs or PolicyKnobs.from_settings(settings)
    current = current_hedge_after_s
    for _ in range(PUBLISH_ATTEMPTS):
        async with sessionmaker() as session:
            item = await _decide_route(
                session, settings, route, current, current_source, now, knobs, reason_prefix, extra_details
            )
        try:
            return await publish_decision(
                sessionmaker,
                route,
                current,
                item.decision,
                item.observation,
                now,
                details=item.details,
                actor=actor,
                fence=fence,
            )
        except StaleInputs as stale:
            log.info("%s: deciding again from the values as re-read", stale)
            route, current, current_source = stale.route, stale.current, stale.current_source
    raise ControllerError(
        f"route {route.route!r} model {route.model!r} changed {PUBLISH_ATTEMPTS} times while its"
        " threshold was being decided; nothing published this tick"
    )


async def run_once(settings: Settings) -> list[dict[str, Any]]:
    """Open the store of ``settings.database_url``, take the controller lease, tick once, release it.

    A running ``hedgerow serve`` ticks every ``HEDGEROW_CONTROLLER_INTERVAL_S`` while it holds
    the ``controller`` lease (:mod:`hedgerow.controller.lease`); a tick from another process at
    the same time would publish between the scheduled ones with no ``serve`` process knowing.
    So this one-off tick (``hedgerow controller run-once``) takes the same lease first, for
    ``settings.lease_ttl_s`` (a tick takes well under that), and releases it at once after;
    while another process holds it nothing is ticked. Applied changes are logged as
    ``threshold_changed`` lines by :func:`run_tick`, as the scheduled tick's are.

    Args:
        settings: a ``hedgerow.settings.Settings`` (``database_url``, ``lease_ttl_s``, the policy's).

    Returns:
        The history rows written, one per route (see :func:`run_tick`).

    Raises:
        LeaseHeld: another process (a running ``serve``) holds the controller lease; nothing written.
        StoreError: bad database url.
        StoreNotReady: database unreachable or not migrated to head.
    """
    engine = make_engine(settings.database_url)
    try:
        await check_ready(engine)
        sessionmaker = make_sessionmaker(engine)
        holder = f"run-once:{make_holder_id()}"
        if not await acquire_lease(sessionmaker, CONTROLLER_LEASE, holder, settings.lease_ttl_s):
            current = await lease_holder(sessionmaker, CONTROLLER_LEASE)
            raise LeaseHeld(CONTROLLER_LEASE, *(current or (None, None)))
        try:
            fence = partial(check_lease_held, name=CONTROLLER_LEASE, holder=holder)
            return await run_tick(sessionmaker, settings, fence=fence)
        finally:
            await release_lease(sessionmaker, CONTROLLER_LEASE, holder)
    finally:
        await engine.dispose()
