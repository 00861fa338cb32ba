"""The tick's observe step: what one tick sees of each route (steps 1 and 2 of ``jobs``).

:func:`observe_routes` reads every route's minute aggregates of the window in one query and the
calls of the last one to two minutes one by one in two more (:func:`routes_records`), builds each
route's ``WindowData`` (``store._minute_window.tick_window``) and runs
``policy._policy_window.observe_window`` on it, reading the routes that need it again over
``max_window_s``. The raw-call readers (:func:`window_records`, :func:`count_calls`,
:func:`backup_samples`) apply the same sample rules (``policy.minute_counts``) to any span.
The facade :mod:`hedgerow.controller.jobs` re-exports every public name.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import CompoundSelect, and_, bindparam, case, func, or_, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.policy._policy_window import WindowData, WindowRecords, observe_window
from hedgerow.controller.policy.minute_counts import MINUTE_S, call_samples, first_samples
from hedgerow.controller.policy.policy import Observation, PolicyKnobs
from hedgerow.controller.store._minute_window import (
    RECENT_CALLS,
    raw_since,
    read_minutes,
    start_minutes,
    tick_window,
    without_records,
)
from hedgerow.controller.store.models import Attempt, Call, Route

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "BackupSamples",
    "WindowCounts",
    "backup_samples",
    "count_calls",
    "latest_records",
    "observe_route",
    "observe_routes",
    "routes_records",
    "window_records",
]

log = logging.getLogger("hedgerow.controller.jobs")

#: What the tick reads of a call and of its attempts (:func:`_records`).
_CALL_COLUMNS = (
    Call.id, Call.route_id, Call.started_at, Call.hedge_reason, Call.hedge_denied, Call.winner, Call.ttft_s
)  # fmt: skip
_ATTEMPT_COLUMNS = (
    Attempt.call_id, Attempt.role, Attempt.start_s, Attempt.first_token_s, Attempt.end_s, Attempt.outcome
)  # fmt: skip
#: Routes per query of :func:`latest_records` (a ``UNION ALL`` of one limited select each; their
#: calls' ids then go to one ``IN`` list, well under the drivers' bound-parameter limits).
_ROUTES_PER_QUERY = 100


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
            select(*_CALL_COLUMNS).where(*in_window).order_by(Call.route_id, Call.started_at, Call.id)
        )
    ).all()
    attempts = await connection.execute(
        select(*_ATTEMPT_COLUMNS)
        .join(Call, Call.id == Attempt.call_id)
        .where(*in_window, Attempt.role.in_(("primary", "backup")))
        .order_by(Attempt.call_id, Attempt.attempt_index)
    )
    return _records(route_ids, calls, attempts.all(), until)


def _records(
    route_ids: list[int], calls: Sequence[Any], attempts: Sequence[Any], until: datetime
) -> dict[int, WindowRecords]:
    """Calls ``(id, route_id, started_at, hedge_reason, hedge_denied, winner, ttft_s)`` in start
    order and their attempts ``(call_id, role, start_s, first_token_s, end_s, outcome)`` in
    attempt order as each route's ``WindowRecords`` (ages from ``until``), by the sample rules
    of ``minute_counts`` (``first_samples``, ``call_samples``)."""
    by_call: dict[int, list[tuple[str, float, float | None, float, str]]] = {}
    for call_id, role, start_s, first_token_s, end_s, outcome in attempts:
        by_call.setdefault(call_id, []).append((role, start_s, first_token_s, end_s, outcome))
    rows: dict[int, list[tuple[Any, ...]]] = {route_id: [] for route_id in route_ids}
    for call_id, route_id, started_at, hedge_reason, hedge_denied, winner, ttft_s in calls:
        primary, backup = first_samples(by_call.get(call_id, ()))
        samples = call_samples(hedge_reason, hedge_denied, winner, ttft_s, primary, backup)
        rows[route_id].append(((until - started_at).total_seconds(), *samples))
    return {route_id: WindowRecords.from_rows(route_rows) for route_id, route_rows in rows.items()}


@functools.lru_cache(maxsize=16)
def _latest_union(routes: int, limit: int) -> CompoundSelect[Any]:
    """The ``UNION ALL`` of :func:`latest_records` for ``routes`` routes, built once per size: the
    route ids (``route_0`` ...) and the span (``since``, ``until``) are bound at each execution.
    Building it anew cost ~0.4 ms of SQLAlchemy constructs a route each tick."""
    parts = [
        select(*_CALL_COLUMNS)
        .where(
            Call.route_id == bindparam(f"route_{i}"),
            Call.started_at > bindparam("since"),
            Call.started_at <= bindparam("until"),
        )
        .order_by(Call.started_at.desc())
        .limit(limit)
        .subquery()
        for i in range(routes)
    ]
    return union_all(*(select(*part.c) for part in parts))


async def latest_records(
    session: AsyncSession, route_ids: list[int], since: datetime, until: datetime, *, limit: int = RECENT_CALLS
) -> dict[int, WindowRecords]:
    """Each route's latest ``limit`` calls started in ``(since, until]`` as ``WindowRecords``.

    One ``ORDER BY started_at DESC LIMIT`` per route on the ``(route_id, started_at)`` index,
    :data:`_ROUTES_PER_QUERY` routes to a ``UNION ALL`` query, then their attempts (by call id,
    within the calls' span of ``call_started_at``, the partition key on PostgreSQL): the rows
    read are at most ``limit`` calls per route however many calls it has. Calls of one start
    time at the limit are taken in the index's order.

    Args:
        session: an open session.
        route_ids: the ``routes.id`` values.
        since / until: the span (aware UTC).
        limit: calls per route, >= 1.

    Returns:
        ``{route_id: WindowRecords}`` for every route asked for, oldest call first (ages from
        ``until``).

    Raises:
        ValueError: ``limit`` below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1 call per route, got {limit!r}")
    connection = await session.connection()
    calls: list[Any] = []
    for first in range(0, len(route_ids), _ROUTES_PER_QUERY):
        ids = route_ids[first : first + _ROUTES_PER_QUERY]
        params = {f"route_{i}": route_id for i, route_id in enumerate(ids)} | {"since": since, "until": until}
        calls.extend((await connection.execute(_latest_union(len(ids), limit), params)).all())
    calls.sort(key=lambda row: (row[1], row[2], row[0]))  # route, start, id
    attempts: list[Any] = []
    for first in range(0, len(calls), _ROUTES_PER_QUERY * limit):
        chunk = calls[first : first + _ROUTES_PER_QUERY * limit]
        started = [row[2] for row in chunk]
        attempts.extend(
            (
                await connection.execute(
                    select(*_ATTEMPT_COLUMNS)
                    .where(
                        Attempt.call_id.in_([row[0] for row in chunk]),
                        Attempt.call_started_at >= min(started),
                        Attempt.call_started_at <= max(started),
                        Attempt.role.in_(("primary", "backup")),
                    )
                    .order_by(Attempt.call_id, Attempt.attempt_index)
                )
            ).all()
        )
    return _records(route_ids, calls, attempts, until)


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

    With ``settings.controller_observe == "bounded"`` the calls read one by one are each route's
    latest ``_minute_window.RECENT_CALLS`` (:func:`latest_records`, over the widest span), and
    the aggregates are read up to ``now`` (its partial minute included); each read takes the
    counts of those latest calls out of their minutes (``_minute_window.without_records``), so
    every call is counted once, and the calls read one by one no longer grow with the traffic.

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

    bounded = settings.controller_observe == "bounded"
    if bounded:  # the latest calls one by one, however old; the aggregates up to now
        oldest = now - timedelta(seconds=spans["wide"] + MINUTE_S / 2)
        recent = await latest_records(session, ids, oldest, now)
        cut = now
    else:  # the calls of the last one to two minutes one by one; the aggregates before them
        cut = raw_since(now)
        recent = await routes_records(session, ids, cut, now, since_included=True)

    async def read(span_s: float, route_ids: list[int]) -> dict[int, WindowData]:
        since = now - timedelta(seconds=span_s + MINUTE_S / 2)
        minutes = await read_minutes(session, since, cut, route_ids=route_ids) if since < cut else {}
        if not bounded:
            return {rid: tick_window(minutes.get(rid), recent[rid], now) for rid in route_ids}
        first_minute = math.ceil(since.timestamp() / MINUTE_S)
        data = {}
        for rid in route_ids:  # the latest calls of the minutes read, taken out of their minutes
            calls = recent[rid].select(start_minutes(recent[rid], now) >= first_minute)
            data[rid] = tick_window(without_records(minutes.get(rid), calls, now), calls, now)
        return data

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
