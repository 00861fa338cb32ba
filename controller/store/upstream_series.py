"""Per-upstream TTFT over time: the lines of a route's latency chart.

:func:`upstream_ttft_series` reads the TTFT samples of one route and model that
:func:`hedgerow.controller.store.upstreams.upstream_stats` reads for its window (the same sample
rules and log buckets), per upstream (the busiest :data:`SERIES_UPSTREAMS`) and UTC time slot
(:func:`slot_width_s`), and gives the Kaplan-Meier P90 of each slot's histogram, or a one-sided
bound where the slot's samples do not reach it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, Integer, Select, and_, case, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.errors import UnknownRoute
from hedgerow.controller.policy.ttft_histogram import (
    N_BUCKETS,
    bucket_index,
    km_quantile,
)
from hedgerow.controller.store.models import Attempt, Call, Route
from hedgerow.controller.store.upstreams import (
    CHUNK_ROWS,
    MAX_UPSTREAMS,
    UpstreamWindowError,
    bucket_sql,
    has_sql_log,
    sample_columns,
    sparse_counts,
    window_error,
    zero_counts,
)

__all__ = [
    "SERIES_LEVEL",
    "SERIES_MAX_SLOTS",
    "SERIES_MIN_FIRST_TOKENS",
    "SERIES_MIN_SAMPLES",
    "SERIES_UPSTREAMS",
    "SLOT_WIDTHS_S",
    "slot_sql",
    "slot_width_s",
    "upstream_ttft_series",
]


#: The TTFT quantile drawn per upstream and time slot (P90: the level the primary's line and the
#: published threshold sit near at a 10 % budget, so the lines compare with them on one axis).
SERIES_LEVEL = 0.9
#: Most upstreams drawn on one chart (the ones with the most TTFT samples in the range).
SERIES_UPSTREAMS = 6
#: Fewest TTFT samples (first tokens plus censored) in a slot for it to give a point or a bound.
SERIES_MIN_SAMPLES = 10
#: Fewest first tokens (uncensored samples) in a slot for its P90 to be drawn as a value.
SERIES_MIN_FIRST_TOKENS = 5
#: Most time slots over a chart's range (the slot width is the smallest of :data:`SLOT_WIDTHS_S`
#: giving at most this many).
SERIES_MAX_SLOTS = 30
#: Slot widths, seconds: 10 s to one day, each a divisor of the next larger unit, so slots start
#: on round UTC times (on the hour for 1 h slots).
SLOT_WIDTHS_S: tuple[int, ...] = (
    10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
)  # fmt: skip


def slot_width_s(span_s: float) -> int:
    """The time slot of a chart's per-upstream lines: the smallest of :data:`SLOT_WIDTHS_S` that
    cuts ``span_s`` into at most :data:`SERIES_MAX_SLOTS` slots (one hour for a day, 15 min for
    6 h, 2 min for an hour, 6 h for a week, a day for 30 days).

    Args:
        span_s: the chart's range, seconds (> 0).

    Returns:
        The width, whole seconds (one day at most, however long the range).
    """
    return next((w for w in SLOT_WIDTHS_S if span_s / w <= SERIES_MAX_SLOTS), SLOT_WIDTHS_S[-1])


def slot_sql(dialect: str, width_s: int) -> Any:
    """The UTC time slot of a call's start: ``floor(unix time / width_s)``, exact on both databases.

    SQLite keeps times as UTC text; ``strftime('%s')`` gives its whole Unix seconds, and dropping
    the fraction never moves a time across a slot edge (edges are whole seconds). PostgreSQL's
    ``extract(epoch)`` is exact (numeric).
    """
    if dialect == "sqlite":
        return func.cast(func.strftime("%s", Call.started_at), Integer) // width_s
    return func.cast(func.floor(func.extract("epoch", Call.started_at) / width_s), BigInteger)


async def upstream_ttft_series(
    session: AsyncSession,
    *,
    route: str,
    model: str,
    since: datetime,
    until: datetime,
    limit: int = SERIES_UPSTREAMS,
) -> dict[str, Any]:
    """Each busy upstream's TTFT P90 per time slot over ``[since, until)``, for one route and model.

    The samples are the attempts' own TTFTs as in :func:`upstream_stats` (first tokens observed,
    attempts cancelled before one censored at their elapsed time, failures no sample), counted
    per log bucket and read with :func:`km_quantile` at :data:`SERIES_LEVEL`. One statement and
    one pass over the range's rows: grouped by ``(upstream, slot, censored, TTFT bucket)``, the
    groups ranked by their upstream's samples (window functions over the groups, not the rows)
    and those of the busiest ``limit + 1`` upstreams kept (most samples, then name), so the answer
    is at most ``limit + 1`` x :data:`SERIES_MAX_SLOTS` x 2 x 330 rows whatever the range holds.
    Calls are those started in the range (``call_started_at`` matched too, so PostgreSQL reads only
    the range's partitions). On a SQLite without math functions the samples are streamed and
    bucketed here instead (memory bounded by the slots, not the rows).

    A slot's point:

    - fewer than :data:`SERIES_MIN_SAMPLES` samples: none (``p90`` is None);
    - at least :data:`SERIES_MIN_FIRST_TOKENS` first tokens and the KM curve reaches 0.9:
      ``p90 = {"value_s", "low_s", "high_s"}`` (value set);
    - the curve never reaches 0.9 (so many attempts cancelled that the P90 is only known to be
      at least ``low_s``): ``p90`` with ``value_s`` None, a lower bound;
    - otherwise (the curve reaches 0.9 on fewer first tokens): none.

    Args:
        session: an open session (read only).
        route, model: the route.
        since, until: the range's ends (aware UTC), at most
            :data:`~hedgerow.controller.store.upstreams.MAX_WINDOW_S` apart.
        limit: most upstreams (1 to :data:`~hedgerow.controller.store.upstreams.MAX_UPSTREAMS`).

    Returns:
        ``{"since", "until", "slot_s", "upstreams": [{"upstream", "samples", "censored",
        "points": [{"start", "end", "samples", "censored", "p90"}...]}...], "truncated"}``:
        ``slot_s`` from :func:`slot_width_s`; upstreams busiest first; each upstream's slots
        oldest first, only those with a sample; ``start``/``end`` the slot's part inside the
        range; ``truncated`` when more upstreams had samples than ``limit``.

    Raises:
        UpstreamWindowError: a range :func:`window_error` refuses, or ``limit`` out of range.
        UnknownRoute: no such route and model is stored.
    """
    problem = window_error(since, until)
    if problem is not None:
        raise UpstreamWindowError(*problem)
    if not 1 <= limit <= MAX_UPSTREAMS:
        raise UpstreamWindowError("limit", f"must be from 1 to {MAX_UPSTREAMS}, got {limit}")
    route_id = await session.scalar(select(Route.id).where(Route.route == route, Route.model == model))
    if route_id is None:
        raise UnknownRoute(route, model, f"unknown route {route!r} with model {model!r}")
    width_s = slot_width_s((until - since).total_seconds())
    dialect = (await session.connection()).dialect.name
    duration, flag, has_sample = sample_columns()

    def window(query: Select[Any]) -> Select[Any]:
        return (
            query.select_from(Attempt)
            .join(Call, and_(Call.id == Attempt.call_id, Call.started_at == Attempt.call_started_at))
            .where(
                Call.route_id == route_id,
                Call.started_at >= since,
                Call.started_at < until,
                Attempt.call_started_at >= since,
                Attempt.call_started_at < until,
                has_sample,
            )
        )

    slot = slot_sql(dialect, width_s)
    observed: dict[str, dict[int, np.ndarray]] = defaultdict(lambda: defaultdict(zero_counts))
    censored: dict[str, dict[int, np.ndarray]] = defaultdict(lambda: defaultdict(zero_counts))
    if await has_sql_log(session):
        # one pass over the rows: grouped, each group given its upstream's total (a window over
        # the groups), the upstreams ranked by it, and only the first limit + 1 kept
        bucket = bucket_sql(duration)  # below 1 ms (so below 0) is bucket 0
        grouped = (
            window(
                select(
                    Attempt.upstream.label("upstream"),
                    slot.label("slot"),
                    flag.label("cut"),
                    bucket.label("bucket"),
                    func.count().label("n"),
                    func.sum(func.count()).over(partition_by=Attempt.upstream).label("total"),
                )
            )
            .group_by(Attempt.upstream, slot, flag, bucket)
            .subquery()
        )
        rank = func.dense_rank().over(order_by=(grouped.c.total.desc(), grouped.c.upstream))
        with_rank = select(grouped, rank.label("rank")).subquery()
        query = select(with_rank.c.upstream, with_rank.c.slot, with_rank.c.cut, with_rank.c.bucket, with_rank.c.n)
        query = query.where(with_rank.c.rank <= limit + 1)
        for name, at, cut, index, count in await session.execute(query):
            target = censored if cut else observed
            target[name][int(at)][min(max(int(index), 0), N_BUCKETS - 1)] += int(count)
    else:  # a SQLite without math functions: the samples streamed and bucketed here
        clamped = case((duration < 0, literal(0.0)), else_=duration)
        result = await session.stream(
            window(select(Attempt.upstream, slot, flag, clamped)).execution_options(yield_per=CHUNK_ROWS)
        )
        async for rows in result.partitions(CHUNK_ROWS):
            for name, at, cut, value_s in rows:
                target = censored if cut else observed
                target[name][int(at)][bucket_index(float(value_s))] += 1
    names = set(observed) | set(censored)

    def total(name: str) -> int:
        return int(sum(h.sum() for h in observed[name].values()) + sum(h.sum() for h in censored[name].values()))

    ranked = sorted(names, key=lambda name: (-total(name), name))
    upstreams = []
    for name in ranked[:limit]:
        points: list[dict[str, Any]] = []
        for at in sorted(set(observed[name]) | set(censored[name])):
            events = sparse_counts(observed[name].get(at))
            cut = sparse_counts(censored[name].get(at))
            first_tokens, n_cut = sum(events.values()), sum(cut.values())
            start = max(since, datetime.fromtimestamp(at * width_s, tz=since.tzinfo))
            end = min(until, datetime.fromtimestamp((at + 1) * width_s, tz=since.tzinfo))
            points.append(
                {
                    "start": start,
                    "end": end,
                    "samples": first_tokens + n_cut,
                    "censored": n_cut,
                    "p90": _series_point(events, cut, first_tokens, n_cut),
                }
            )
        upstreams.append(
            {
                "upstream": name,
                "samples": sum(p["samples"] for p in points),
                "censored": sum(p["censored"] for p in points),
                "points": points,
            }
        )
    return {"since": since, "until": until, "slot_s": width_s, "upstreams": upstreams, "truncated": len(ranked) > limit}


def _series_point(
    events: dict[int, int], cut: dict[int, int], first_tokens: int, n_cut: int
) -> dict[str, float | None] | None:
    """A slot's P90 by the rule of :func:`upstream_ttft_series` (a value, a lower bound, or None)."""
    if first_tokens + n_cut < SERIES_MIN_SAMPLES:
        return None
    found = km_quantile(events, cut, SERIES_LEVEL)
    if found is None:
        return None
    if found.value_s is None:
        return {"value_s": None, "low_s": found.low_s, "high_s": None}
    if first_tokens < SERIES_MIN_FIRST_TOKENS:
        return None
    return {"value_s": found.value_s, "low_s": found.low_s, "high_s": found.high_s}
