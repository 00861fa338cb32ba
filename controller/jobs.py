"""The controller job: one tick sets every (route, model)'s published ``hedge_after_s``.

Per route, each tick (docs/DESIGN.md "controller"):

1. read every route's minute aggregates of the last ``window_s`` in one query and the calls
   of the last one to two minutes one by one in two more (:func:`observe_routes`; ingest keeps
   the aggregates in the calls' own transaction: per minute the counters and the log-bucketed
   histograms of the primary's and the backup's TTFT samples, observed and censored, and of the
   call-level TTFT, by the sample rules of :func:`window_records`); the routes whose primary
   samples are fewer than ``min_samples``, or too few for the budget's tail with no drift
   detected, are read again over ``max_window_s``. The cost grows with routes x minutes x
   non-empty buckets plus two minutes of calls, not with the window's calls; an older duration
   is known to its bucket (``_minute_window``);
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

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
from hedgerow.controller.policy._policy_window import WindowData, WindowRecords, observe_window
from hedgerow.controller.policy.estimation import QUANTILE_LEVELS
from hedgerow.controller.policy.minute_counts import MINUTE_S, call_samples, first_samples
from hedgerow.controller.policy.policy import (
    Decision,
    Observation,
    PolicyKnobs,
    RouteConfig,
    decide,
)
from hedgerow.controller.store._minute_window import raw_since, read_minutes, tick_window
from hedgerow.controller.store.db import check_ready, make_engine, make_sessionmaker
from hedgerow.controller.store.models import (
    Attempt,
    Call,
    Route,
    Threshold,
    ThresholdHistory,
    utc_now,
)
from hedgerow.controller.store.queries import history_row_dict, newest_history_id

if TYPE_CHECKING:
    from hedgerow.settings import Settings

#: ``await fence(session)`` inside a publishing transaction, after its publish locks: raises
#: :class:`~hedgerow.controller.lease.LeaseLost` when the publisher no longer holds its lease.
Fence = Callable[[AsyncSession], Awaitable[None]]

__all__ = [
    "PUBLISH_ATTEMPTS",
    "BackupSamples",
    "Fence",
    "WindowCounts",
    "backup_samples",
    "count_calls",
    "history_details",
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


@dataclass(frozen=True, slots=True)
class BackupSamples:
    """The backup TTFT samples of the hedges of one window, measured from the backup's send.

    Attributes:
        durations_s: the backup's TTFT (uncensored) or the time it was cancelled at (censored,
            the primary won), seconds, one per hedged call; failed backups are left out.
        censored: True where the duration is a right-censored lower bound.
    """

    durations_s: tuple[float, ...]
    censored: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """Call counts of one window: calls, hedged (``ttft_timeout``) calls, hedges won by the
    backup, and wanted hedges (hedged, or denied by the client's budget bucket)."""

    calls: int
    hedges: int
    backup_wins: int
    wanted: int = 0


async def count_calls(session: AsyncSession, route_id: int, since: datetime, until: datetime) -> WindowCounts:
    """Count a route's calls started in ``(since, until]``, its hedges, the backup's wins and the
    wanted hedges (hedged, or ``hedge_denied`` by the client's budget bucket)."""
    hedged = Call.hedge_reason == "ttft_timeout"
    wanted = or_(hedged, Call.hedge_denied.is_(True))
    row = (
        await session.execute(
            select(
                func.count(),
                func.coalesce(func.sum(case((hedged, 1), else_=0)), 0),
                func.coalesce(func.sum(case((and_(hedged, Call.winner == "backup"), 1), else_=0)), 0),
                func.coalesce(func.sum(case((wanted, 1), else_=0)), 0),
            ).where(Call.route_id == route_id, Call.started_at > since, Call.started_at <= until)
        )
    ).one()
    return WindowCounts(int(row[0]), int(row[1]), int(row[2]), int(row[3]))


async def window_records(session: AsyncSession, route_id: int, since: datetime, until: datetime) -> WindowRecords:
    """A route's calls started in ``(since, until]`` as ``WindowRecords`` (ages from ``until``).

    Per call: its first ``primary`` attempt as a TTFT sample and, for a hedge (``hedge_reason ==
    "ttft_timeout"``), its first ``backup`` attempt measured from the backup's own send, both by
    ``_policy_window.ttft_sample`` (the one sample rule); the call-level TTFT (failovers left
    out: they measure the failover, not the hedge); hedged, backup won, denied. The rules are
    ``minute_counts.first_samples`` and ``minute_counts.call_samples``, which ingest's minute
    aggregates use too.

    Args:
        session: an open session.
        route_id: the ``routes.id``.
        since / until: the window (aware UTC).
    """
    return (await routes_records(session, [route_id], since, until))[route_id]


async def routes_records(
    session: AsyncSession, route_ids: list[int], since: datetime, until: datetime, *, since_included: bool = False
) -> dict[int, WindowRecords]:
    """:func:`window_records` of several routes in two queries (calls, then their attempts).

    Args:
        session: an open session.
        route_ids: the ``routes.id`` values.
        since / until: the span (aware UTC): calls started in ``(since, until]``, or in
            ``[since, until]`` with ``since_included``.

    Returns:
        ``{route_id: WindowRecords}`` for every route asked for (empty records for a route
        without calls in the span).
    """
    start = Call.started_at >= since if since_included else Call.started_at > since
    in_window = (Call.route_id.in_(route_ids), start, Call.started_at <= until)
    # plain rows through the session's connection: the ORM's result machinery cost ~3 us a row
    connection = await session.connection()
    calls = (
        await connection.execute(
            select(
                Call.id, Call.route_id, Call.started_at, Call.hedge_reason, Call.hedge_denied, Call.winner, Call.ttft_s
            )
            .where(*in_window)
            .order_by(Call.route_id, Call.started_at, Call.id)
        )
    ).all()
    attempts = await connection.execute(
        select(Attempt.call_id, Attempt.role, Attempt.start_s, Attempt.first_token_s, Attempt.end_s, Attempt.outcome)
        .join(Call, Call.id == Attempt.call_id)
        .where(*in_window, Attempt.role.in_(("primary", "backup")))
        .order_by(Attempt.call_id, Attempt.attempt_index)
    )
    by_call: dict[int, list[tuple[str, float, float | None, float, str]]] = {}
    for call_id, role, start_s, first_token_s, end_s, outcome in attempts.all():
        by_call.setdefault(call_id, []).append((role, start_s, first_token_s, end_s, outcome))
    rows: dict[int, list[tuple[Any, ...]]] = {route_id: [] for route_id in route_ids}
    for call_id, route_id, started_at, hedge_reason, hedge_denied, winner, ttft_s in calls:
        primary, backup = first_samples(by_call.get(call_id, ()))
        samples = call_samples(hedge_reason, hedge_denied, winner, ttft_s, primary, backup)
        rows[route_id].append(((until - started_at).total_seconds(), *samples))
    return {route_id: WindowRecords.from_rows(route_rows) for route_id, route_rows in rows.items()}


async def backup_samples(session: AsyncSession, route_id: int, since: datetime, until: datetime) -> BackupSamples:
    """The backup TTFT samples of the hedges of calls started in ``(since, until]``.

    Read through :func:`window_records` (one backup per hedged call, from its own send,
    censored at its cancellation when the primary won, failed backups left out).
    """
    records = await window_records(session, route_id, since, until)
    has = records.hedged & ~np.isnan(records.backup_s)
    return BackupSamples(tuple(records.backup_s[has].tolist()), tuple(records.backup_censored[has].tolist()))


def _needs_wide(observation: Observation, settings: Settings) -> bool:
    """Whether the route's observation of ``window_s`` asks for the ``max_window_s`` span: too
    few primary samples, or too few for the budget's tail and no change detected."""
    estimate = observation.estimate
    if estimate is None or estimate.samples < settings.min_samples:
        return True
    return observation.drift is None and estimate.too_few_for_budget


async def observe_routes(
    session: AsyncSession, routes: list[Route], settings: Settings, now: datetime, knobs: PolicyKnobs | None = None
) -> dict[int, Observation]:
    """Everything one tick sees of each route, from the minute aggregates and two minutes of calls.

    The calls started since ``_minute_window.raw_since(now)`` (the start of the minute before
    ``now``'s) are read one by one for every route in two queries (:func:`routes_records`), the
    minutes before it from the aggregates in one more (``_minute_window.read_minutes``); each
    route's become ``WindowData`` (``_minute_window.tick_window``: a (minute, bucket) entry per
    count at the minute's middle, then the recent calls at their own starts; every duration read
    at its bucket's end) and go through ``_policy_window.observe_window``. The routes whose samples are fewer than
    ``min_samples``, or too few for the budget's tail with no drift detected, are read again
    over ``max_window_s`` (one more query for all of them) and observed again. The cost is one
    entry per non-empty (minute, kind, bucket), bounded per minute, plus two minutes of calls;
    what bucketing changes against the raw calls is stated in ``_minute_window.window_data``.

    Args:
        session: an open session.
        routes: the route rows.
        settings: a ``hedgerow.settings.Settings``.
        now: the tick's time (aware UTC); calls started after it are left out.
        knobs: the policy knobs (default: from ``settings``).

    Returns:
        ``{route id: Observation}`` for every route given, but those whose observation failed
        (logged with their traceback).
    """
    knobs = knobs or PolicyKnobs.from_settings(settings)
    ids = [route.id for route in routes]
    # a minute belongs to a window when its middle does: read half a minute beyond the span
    spans = {"short": float(settings.window_s), "wide": max(float(settings.max_window_s), float(settings.window_s))}

    cut = raw_since(now)
    recent = await routes_records(session, ids, cut, now, since_included=True)

    async def read(span_s: float, route_ids: list[int]) -> dict[int, WindowData]:
        since = now - timedelta(seconds=span_s + MINUTE_S / 2)
        minutes = await read_minutes(session, since, cut, route_ids=route_ids) if since < cut else {}
        return {rid: tick_window(minutes.get(rid), recent[rid], now) for rid in route_ids}

    def observe(items: list[tuple[Route, WindowData]]) -> dict[int, Observation]:
        out = {}
        for route, window in items:
            try:
                out[route.id] = observe_window(window, settings=settings, budget=_budget(route), knobs=knobs)
            except Exception:
                log.exception("controller tick failed to observe route %r model %r", route.route, route.model)
        return out

    by_id = {route.id: route for route in routes}
    data = await read(spans["short"], ids)
    observations = await asyncio.to_thread(observe, [(by_id[rid], data[rid]) for rid in ids])
    if spans["wide"] > spans["short"]:
        wide = [rid for rid in ids if rid in observations and _needs_wide(observations[rid], settings)]
        if wide:
            data = await read(spans["wide"], wide)
            observations |= await asyncio.to_thread(observe, [(by_id[rid], data[rid]) for rid in wide])
    return observations


def _budget(route: Route) -> float | None:
    return route.budget if 0.0 < route.budget < 1.0 else None


async def observe_route(
    session: AsyncSession, route: Route, settings: Settings, now: datetime, knobs: PolicyKnobs | None = None
) -> Observation:
    """Everything one tick sees of one route: :func:`observe_routes` of that route alone.

    Args:
        session: an open session.
        route: the route row.
        settings: a ``hedgerow.settings.Settings``.
        now: end of the windows (aware UTC).
        knobs: the policy knobs (default: from ``settings``).

    Returns:
        The :class:`Observation` for :func:`decide`.
    """
    return (await observe_routes(session, [route], settings, now, knobs))[route.id]


def _config(route: Route) -> RouteConfig:
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


class _StaleInputs(Exception):
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

    Every writer of a route's published threshold (the controller's :func:`tick_route` and
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


async def _latest_history(session: AsyncSession, route_ids: list[int]) -> dict[int, ThresholdHistory]:
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
        latest: the route's latest history row (:func:`_latest_history`), or None.
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


async def _publish(
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

    ``fence`` (a lease check, see :func:`run_tick`) runs under the route's publish lock, before
    anything is written.

    The decision was made from ``route``'s configuration and the published value
    ``previous``, read earlier in other transactions. Here, under :func:`lock_route`, both are
    re-read; if either changed in the meantime (an operator's change, another tick), nothing is
    written and :class:`_StaleInputs` carries the values as re-read so that the caller decides
    again. Otherwise the history row's ``previous_hedge_after_s`` is the value as re-read, so
    each history row's ``previous_hedge_after_s`` equals the value the row before it published.
    """
    async with sessionmaker() as session, session.begin():
        fresh, threshold = await lock_route(session, route.id)
        if fence is not None:
            await fence(session)
        fresh_current = None if threshold is None else threshold.hedge_after_s
        if _config(fresh) != _config(route) or fresh_current != previous:
            raise _StaleInputs(_detached_route(fresh), fresh_current, None if threshold is None else threshold.source)
        latest = (await _latest_history(session, [fresh.id])).get(fresh.id)
        row = _write_decision(session, fresh, threshold, latest, decision, observation, now, details, actor)
        await session.flush()
    return history_row_dict(row, fresh)


def _write_decision(
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
    decision = decide(_config(route), current, observation, knobs, current_source=source)
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
        latest = await _latest_history(session, ids)
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
            if _config(fresh) != _config(item.route) or current != item.current:
                source = None if threshold is None else threshold.source
                log.info("route %r model %r changed while deciding: deciding again", fresh.route, fresh.model)
                chosen = await _decide_route(session, settings, fresh, current, source, now, knobs)
            history = _write_decision(
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
            return await _publish(
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
        except _StaleInputs as stale:
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
