"""Read every route's minute aggregates of a span at once, as numpy arrays (the tick's store side).

One query reads the ``minute_aggregates`` rows of all routes (or of the routes asked for) whose
minute starts in ``[since, until)`` (on PostgreSQL as one row of arrays); their histograms are decoded together
(:func:`hedgerow.controller.policy.minute_counts.decode_many`) and split per route. The cost is one
row per (route, minute) with data and one (key, count) pair per non-empty (kind, bucket) of
that minute: bounded by 5 x 330 pairs however many calls the minute had.

Minutes are read whole: with ``since`` and ``until`` on whole minutes the figures are exactly
those of the calls started in ``[since, until)`` (``jobs.window_records`` reads ``(since,
until]``: the same calls unless one started exactly on a bound); otherwise the minute holding
``until`` is in, the one holding ``since`` out (its start is before ``since``).

What the aggregates lose against the raw calls: counts are exact; a duration is known to its
bucket (``ttft_histogram``: 4.7 % wide) and a call's start to its minute. The tick
(:func:`tick_window`) reads every duration at its bucket's end (:func:`window_data` says why)
and each minute at its middle, so a window's edge is placed to within 30 s; the calls since
:func:`raw_since` it reads one by one, with their exact starts.

The bounded tick (``HEDGEROW_CONTROLLER_OBSERVE=bounded``) reads the aggregates of every minute of
the window up to the one holding ``now`` (the current partial minute included) and, one by one,
only each route's latest :data:`RECENT_CALLS` calls; :func:`without_records` takes those calls'
own counts out of their minutes, so every call is counted once, either in a minute or one by
one. Its cost per route is then the window's non-empty (minute, kind, bucket) entries plus 100
calls, however many calls the route has. It adds no error beyond the buckets': the estimates
are those of the same calls with durations at their bucket's end (at or above the raw sample's
quantiles by less than one bucket, 4.7 %), older starts placed at their minute's middle; what
it changes is which calls keep their exact start and arrival order (the latest 100 instead of
the last 60-120 s), and that the minute holding ``now`` is read whole (a call started after
``now`` in that minute is counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from hedgerow.controller.errors import StoreError
from hedgerow.controller.policy._policy_window import CallCounts, Samples, WindowData, WindowRecords, concat_window_data
from hedgerow.controller.policy.minute_counts import (
    BACKUP_CENSORED,
    BACKUP_OBSERVED,
    CALL_TTFT,
    KINDS,
    MINUTE_S,
    PRIMARY_CENSORED,
    PRIMARY_OBSERVED,
    count_groups,
    decode_many,
)
from hedgerow.controller.policy.ttft_histogram import BUCKET_ENDS_S, N_BUCKETS, bucket_indices
from hedgerow.controller.store.models import MinuteAggregate

__all__ = [
    "RECENT_CALLS",
    "RouteMinutes",
    "minutes_of",
    "raw_since",
    "read_minutes",
    "start_minutes",
    "tick_window",
    "window_data",
    "without_records",
]

#: Calls per route the bounded tick reads one by one (the latest). Their exact starts and
#: order are what the window rules need beyond the minute aggregates: the objective's bucket
#: replay ends on them (the clients' hedge bucket at the default budget 0.10 and burst 10
#: refills over burst / budget = 100 calls, so the state the replay ends in depends on about
#: that many latest calls), and windows shorter than a minute hold them exactly. A fixed count,
#: not a span, so a route's cost does not grow with its traffic; at 100 calls a route of 50
#: calls a minute keeps the 2 minutes the raw tick reads.
RECENT_CALLS = 100

_COUNTERS = ("calls", "hedged", "backup_wins", "denied", "wanted")
#: Distinct (kind, bucket) keys of one minute.
_KEYS_PER_MINUTE = len(KINDS) * N_BUCKETS


@dataclass(frozen=True, slots=True)
class RouteMinutes:
    """One route's minute aggregates of a span.

    Attributes:
        minutes: int64 (m,), the minutes with calls (whole minutes since 1970-01-01 UTC),
            ascending.
        calls, hedged, backup_wins, denied, wanted: int64 (m,), the counters of each minute
            (``minute_counts``).
        entry_minute: int64 (e,), position in ``minutes`` of each histogram entry.
        entry_kind: uint32 (e,), its kind (``minute_counts.KINDS``: 0 primary observed, 1 primary
            censored, 2 backup observed, 3 backup censored, 4 call TTFT).
        entry_bucket: uint32 (e,), its bucket (``ttft_histogram``, 0..329).
        entry_count: uint32 (e,), its count (> 0).
    """

    minutes: np.ndarray
    calls: np.ndarray
    hedged: np.ndarray
    backup_wins: np.ndarray
    denied: np.ndarray
    wanted: np.ndarray
    entry_minute: np.ndarray
    entry_kind: np.ndarray
    entry_bucket: np.ndarray
    entry_count: np.ndarray

    def histogram(self, kind: int | str, *, since_minute: int | None = None) -> np.ndarray:
        """Bucket counts of one kind summed over the minutes from ``since_minute`` on.

        Args:
            kind: a kind's number or name (``minute_counts.KINDS``).
            since_minute: first minute counted (None: all).

        Returns:
            int64 (330,), counts per bucket.

        Raises:
            ValueError: an unknown kind.
        """
        number = KINDS.index(kind) if isinstance(kind, str) else int(kind)
        if not 0 <= number < len(KINDS):
            raise ValueError(f"unknown histogram kind {kind!r}: one of {KINDS}")
        take = self.entry_kind == number
        if since_minute is not None:
            take &= self.minutes[self.entry_minute] >= since_minute
        return np.bincount(self.entry_bucket[take], weights=self.entry_count[take], minlength=N_BUCKETS).astype(
            np.int64
        )

    def totals(self, *, since_minute: int | None = None) -> dict[str, int]:
        """The counters summed over the minutes from ``since_minute`` on (None: all)."""
        take = slice(None) if since_minute is None else self.minutes >= since_minute
        return {name: int(getattr(self, name)[take].sum()) for name in _COUNTERS}


#: PostgreSQL: every column as one array (asyncpg decodes 8 arrays much faster than SQLAlchemy
#: builds a row object per (route, minute)).
_PG_READ = (
    "SELECT array_agg(route_id), array_agg(minute_index), "
    + ", ".join(f"array_agg({name})" for name in _COUNTERS)
    + ", array_agg(histograms) FROM minute_aggregates WHERE minute_index >= $1 AND minute_index < $2 "
    "AND ($3::bigint[] IS NULL OR route_id = ANY($3::bigint[]))"
)


async def _fetch_postgresql(conn: AsyncConnection, first: int, end: int, route_ids: list[int] | None) -> list[Any]:
    """The columns of the rows read, through the driver (one row of arrays)."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if driver is None:  # pragma: no cover - an open pooled connection always has its driver connection
        raise StoreError("the PostgreSQL connection has no driver connection")
    row = await driver.fetchrow(_PG_READ, first, end, route_ids)
    return [] if row is None or row[0] is None else list(row)


async def read_minutes(
    connection: AsyncSession | AsyncConnection,
    since: datetime,
    until: datetime,
    *,
    route_ids: list[int] | None = None,
) -> dict[int, RouteMinutes]:
    """Every route's aggregates of the minutes that start in ``[since, until)``, in one query.

    Args:
        connection: an open session or connection.
        since / until: the span (aware UTC).
        route_ids: only these routes (None: all).

    Returns:
        ``{route_id: RouteMinutes}`` for the routes with at least one minute in the span.
    """
    first = math.ceil(since.timestamp() / MINUTE_S)
    end = math.ceil(until.timestamp() / MINUTE_S)
    # a session, or anything that stands in for one (the route admin's joined session)
    conn = connection if isinstance(connection, AsyncConnection) else await connection.connection()
    if conn.dialect.name == "postgresql":
        columns = await _fetch_postgresql(conn, first, end, route_ids)
    else:
        table = MinuteAggregate.__table__
        query = select(
            table.c.route_id, table.c.minute_index, *(table.c[name] for name in _COUNTERS), table.c.histograms
        ).where(table.c.minute_index >= first, table.c.minute_index < end)
        if route_ids is not None:
            query = query.where(table.c.route_id.in_(route_ids))
        # no ORDER BY: the index on minute_index finds the rows, numpy sorts them
        columns = list(zip(*(await conn.execute(query)).all(), strict=True))
    if not columns or not columns[0]:
        return {}
    rows_read = len(columns[0])
    numbers = np.array(columns[:7], dtype=np.int64)  # route_id, minute_index, the counters
    order = np.lexsort((numbers[1], numbers[0]))  # by route, then minute
    numbers = numbers[:, order]
    blobs = columns[7]
    entry_row, keys, counts = decode_many([blobs[i] for i in order.tolist()])
    routes, starts = np.unique(numbers[0], return_index=True)
    stops = np.append(starts[1:], rows_read)
    entry_starts = np.searchsorted(entry_row, starts)
    entry_stops = np.searchsorted(entry_row, stops)
    out: dict[int, RouteMinutes] = {}
    for route_id, start, stop, e_start, e_stop in zip(
        routes.tolist(), starts.tolist(), stops.tolist(), entry_starts.tolist(), entry_stops.tolist(), strict=True
    ):
        entry_keys = keys[e_start:e_stop]
        out[route_id] = RouteMinutes(
            minutes=numbers[1, start:stop],
            calls=numbers[2, start:stop],
            hedged=numbers[3, start:stop],
            backup_wins=numbers[4, start:stop],
            denied=numbers[5, start:stop],
            wanted=numbers[6, start:stop],
            entry_minute=entry_row[e_start:e_stop] - start,
            entry_kind=entry_keys // N_BUCKETS,
            entry_bucket=entry_keys % N_BUCKETS,
            entry_count=counts[e_start:e_stop],
        )
    return out


def window_data(minutes: RouteMinutes, now: datetime) -> WindowData:
    """One route's minute aggregates as the weighted :class:`~._policy_window.WindowData` the
    window rules read (``_policy_window.observe_window``).

    Each non-empty (minute, kind, bucket) is one sample entry, its weight the count and its
    duration the bucket's upper edge (``ttft_histogram.bucket_bounds``; the overflow bucket's
    lower edge): every first token and censoring is read as late as its bucket allows, with the
    censorings tied to the first tokens of their bucket (still at risk for them). Kaplan-Meier
    over the entries then never falls below the raw samples' curve: both have the same ``n``
    at risk when a bucket starts, and the bucket's factor ``1 - d / n`` is at least the raw
    product of ``1 - 1 / n_i`` over its ``d`` first tokens (equal without censorings; every
    censoring before a first token shrinks a later ``n_i``); inside a bucket the curve is the
    previous end's. So every quantile of the estimate lies at or above the raw samples', by
    less than one bucket (4.7 %), and the budget target (an upper confidence bound on the same
    curve) and the predicted tails follow it: a value published within the budget on the
    buckets is within it on the calls. The bucket's midpoint would halve the error but make it
    two-sided (``docs/evaluation.md``, "Minute aggregates"). On the worked number of
    ``jobs`` (2,000 Exp(1 s) primaries hedged at 1.5 s, 324 censored) see there for the
    figures against the raw calls; ``tests/controller/test_jobs.py`` checks them.
    Each minute's counters are one :class:`CallCounts` entry.
    Every entry's age is that of the minute's middle, ``now - (minute start + 30 s)``, floored at
    0 (the minute holding ``now`` is as old as ``now``'s own calls): a window of ``span_s`` then
    holds the minutes whose middle lies within it, so its edge is placed to within 30 s.

    Args:
        minutes: the route's minutes (:func:`read_minutes`), none starting after ``now``.
        now: the tick's time (aware UTC).

    Returns:
        The route's ``WindowData``.
    """
    middle_age_s = now.timestamp() - (minutes.minutes * float(MINUTE_S) + MINUTE_S / 2.0)
    minute_age_s = np.maximum(middle_age_s, 0.0)
    entry_kinds = minutes.entry_kind
    entry_age_s = minute_age_s[minutes.entry_minute]
    values_s = BUCKET_ENDS_S[minutes.entry_bucket]
    weights = minutes.entry_count.astype(float)

    def samples(observed: int, censored: int | None) -> Samples:
        take = entry_kinds == observed if censored is None else (entry_kinds == observed) | (entry_kinds == censored)
        flags = np.zeros(int(take.sum()), dtype=bool) if censored is None else entry_kinds[take] == censored
        return Samples(entry_age_s[take], values_s[take], flags, weights[take])

    return WindowData(
        primary=samples(PRIMARY_OBSERVED, PRIMARY_CENSORED),
        backup=samples(BACKUP_OBSERVED, BACKUP_CENSORED),
        call_ttft=samples(CALL_TTFT, None),
        counts=CallCounts(
            minute_age_s, minutes.calls, minutes.hedged, minutes.backup_wins, minutes.denied, minutes.wanted
        ),
    )


def minutes_of(records: WindowRecords, now: datetime) -> RouteMinutes:
    """The minute aggregates that ingest would keep of one route's records (pure, no store).

    Each call goes to the minute holding its start (``now - age_s``) and each of its samples to
    its kind's bucket by the rule ingest counts with (``minute_counts.count_groups``); the virtual-time
    evaluation (``bench/controller_eval.py --minutes``) feeds the tick's rules through it what
    the live tick reads from the store.

    Args:
        records: the route's calls, one entry per call (ages from ``now``).
        now: the time the ages are measured from (aware UTC).

    Returns:
        A :class:`RouteMinutes` (minutes without calls left out).
    """
    started_s = now.timestamp() - records.age_s
    return _grouped(records, np.floor(started_s / MINUTE_S).astype(np.int64))


def start_minutes(records: WindowRecords, now: datetime) -> np.ndarray:
    """The minute (whole minutes since 1970-01-01 UTC) holding each record's start, as ingest
    placed it: the start ``now - age_s`` rounded to the microsecond first (the store's
    precision), so a call started on a minute's first microsecond is not put in the minute
    before by the float subtraction.

    Returns:
        int64 (n,).
    """
    started_s = np.round(now.timestamp() - records.age_s, 6)
    return np.floor(started_s / MINUTE_S).astype(np.int64)


def _grouped(records: WindowRecords, minute: np.ndarray) -> RouteMinutes:
    """:func:`minutes_of` with each record's minute given."""
    minutes, inverse = np.unique(minute, return_inverse=True)
    counters, entry_minute, keys, counts = count_groups(
        inverse.reshape(-1),
        minutes.size,
        (
            records.primary_s,
            records.primary_censored,
            records.hedged,
            records.backup_won,
            records.denied,
            records.backup_s,
            records.backup_censored,
            records.call_ttft_s,
        ),
    )
    return RouteMinutes(
        minutes=minutes,
        calls=counters[0],
        hedged=counters[1],
        backup_wins=counters[2],
        denied=counters[3],
        wanted=counters[4],
        entry_minute=entry_minute,
        entry_kind=(keys // N_BUCKETS).astype(np.uint32),
        entry_bucket=(keys % N_BUCKETS).astype(np.uint32),
        entry_count=counts.astype(np.uint32),
    )


def raw_since(now: datetime) -> datetime:
    """Where the tick's raw calls begin: the start of the minute before the one holding ``now``.

    The tick reads the calls started from there to ``now`` one by one (60-120 s of them) and
    the minute aggregates before: the recent calls keep their exact start (their durations are
    read at their bucket's end, as the older ones), so a window shorter than a minute (the
    seconds-long windows of ``hedgerow demo``) holds exactly its calls, the replay's latest
    calls keep their order, calls started after ``now`` are left out, and the cost stays
    bounded by two minutes of calls.

    Args:
        now: the tick's time (aware UTC).

    Returns:
        An aware UTC datetime on a whole minute.
    """
    minute = math.floor(now.timestamp() / MINUTE_S) - 1
    return datetime.fromtimestamp(minute * MINUTE_S, UTC)


def tick_window(minutes: RouteMinutes | None, recent: WindowRecords, now: datetime) -> WindowData:
    """What the tick's rules read of one route: the minutes before :func:`raw_since` (weighted
    entries, :func:`window_data`) and the calls since then one by one (ages from ``now``),
    every duration at its bucket's end.

    Args:
        minutes: the route's minutes before ``raw_since(now)`` (None: none).
        recent: the route's calls started in ``[raw_since(now), now]``.
        now: the tick's time (aware UTC).

    Returns:
        The route's ``WindowData``.
    """
    data = recent.data()
    # the recent durations read at their bucket's end too: one rule for the whole window (raw
    # values beside bucket ends would read as a 2 % speed-up to the drift tests)
    data = WindowData(
        primary=_at_bucket_end(data.primary),
        backup=_at_bucket_end(data.backup),
        call_ttft=_at_bucket_end(data.call_ttft),
        counts=data.counts,
    )
    if minutes is None:
        return data
    return concat_window_data(window_data(minutes, now), data)


def _at_bucket_end(samples: Samples) -> Samples:
    """``samples`` with each duration moved to its bucket's end (:func:`window_data`)."""
    return Samples(samples.age_s, BUCKET_ENDS_S[bucket_indices(samples.durations_s)], samples.censored, samples.weight)


def without_records(minutes: RouteMinutes | None, records: WindowRecords, now: datetime) -> RouteMinutes | None:
    """``minutes`` without the counts that ``records`` (calls ingest counted into them) added.

    Each call's counters and histogram entries (the rule of :func:`minutes_of`, which is
    ingest's) are subtracted from its minute; entries left at zero are dropped, a minute left
    without calls stays with zero counters. A call whose minute is not in ``minutes`` is
    skipped, and no count goes below zero (a call ingested after ``minutes`` were read).

    Args:
        minutes: a route's minutes (:func:`read_minutes`), or None.
        records: calls of that route counted in those minutes (ages from ``now``).
        now: the time the ages are measured from (aware UTC).

    Returns:
        The remaining :class:`RouteMinutes` (None when ``minutes`` is None).
    """
    if minutes is None or records.age_s.size == 0:
        return minutes
    taken = _grouped(records, start_minutes(records, now))
    size = minutes.minutes.size
    pos = np.searchsorted(minutes.minutes, taken.minutes)
    found = (pos < size) & (minutes.minutes[np.minimum(pos, size - 1)] == taken.minutes)
    counters = {}
    for name in _COUNTERS:
        left = getattr(minutes, name).astype(np.int64)
        np.subtract.at(left, pos[found], getattr(taken, name)[found])
        counters[name] = np.maximum(left, 0)
    keys = _KEYS_PER_MINUTE
    # only the entries of the minutes the records touch are recounted (the latest few)
    touched_minute = np.zeros(size, dtype=bool)
    touched_minute[pos[found]] = True
    touched = touched_minute[minutes.entry_minute]
    own = minutes.entry_minute[touched].astype(np.int64) * keys
    own += minutes.entry_kind[touched].astype(np.int64) * N_BUCKETS + minutes.entry_bucket[touched].astype(np.int64)
    in_read = found[taken.entry_minute]
    minus = pos[taken.entry_minute[in_read]].astype(np.int64) * keys
    minus += taken.entry_kind[in_read].astype(np.int64) * N_BUCKETS + taken.entry_bucket[in_read].astype(np.int64)
    flat, inverse = np.unique(np.concatenate((own, minus)), return_inverse=True)
    weights = np.concatenate(
        (minutes.entry_count[touched].astype(np.int64), -taken.entry_count[in_read].astype(np.int64))
    )
    left_counts = np.bincount(inverse.reshape(-1), weights=weights, minlength=flat.size).astype(np.int64)
    keep = left_counts > 0
    flat, left_counts = flat[keep], left_counts[keep]
    untouched = ~touched
    return RouteMinutes(
        minutes=minutes.minutes,
        **counters,
        entry_minute=np.concatenate((minutes.entry_minute[untouched].astype(np.int64), flat // keys)),
        entry_kind=np.concatenate((minutes.entry_kind[untouched], (flat % keys) // N_BUCKETS)).astype(np.uint32),
        entry_bucket=np.concatenate((minutes.entry_bucket[untouched], flat % N_BUCKETS)).astype(np.uint32),
        entry_count=np.concatenate((minutes.entry_count[untouched], left_counts)).astype(np.uint32),
    )
