"""Read every route's minute aggregates of a span at once, as numpy arrays (the tick's store side).

One query reads the ``minute_aggregates`` rows of all routes (or of the routes asked for) whose
minute starts in ``[since, until)`` (on PostgreSQL as one row of arrays); their histograms are decoded together
(:func:`hedgerow.controller.minute_counts.decode_many`) and split per route. The cost is one
row per (route, minute) with data and one (key, count) pair per non-empty (kind, bucket) of
that minute: bounded by 5 x 330 pairs however many calls the minute had.

Minutes are read whole: with ``since`` and ``until`` on whole minutes the figures are exactly
those of the calls started in ``[since, until)`` (``jobs.window_records`` reads ``(since,
until]``: the same calls unless one started exactly on a bound); otherwise the minute holding
``until`` is in, the one holding ``since`` out (its start is before ``since``).

What the aggregates lose against the raw calls: counts are exact; a duration is known to its
bucket (``ttft_histogram``: 4.7 % wide, the midpoint within 2.33 % of any value in it) and a
call's start to its minute, so a window's edge is placed to within 60 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from hedgerow.controller.errors import StoreError
from hedgerow.controller.minute_counts import KINDS, MINUTE_S, decode_many
from hedgerow.controller.models import MinuteAggregate
from hedgerow.controller.ttft_histogram import N_BUCKETS

__all__ = ["RouteMinutes", "read_minutes"]

_COUNTERS = ("calls", "hedged", "backup_wins", "denied", "wanted")


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
    conn = await connection.connection() if isinstance(connection, AsyncSession) else connection
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
