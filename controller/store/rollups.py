"""Hourly rollups: fold raw calls into per-(route, model) hours, merge hours, read weekly figures.

What a rollup holds
-------------------
One ``hourly_rollups`` row per (route, model) and UTC hour ``[hour_start, hour_start + 1 h)`` of
``calls.started_at``: calls and calls per status, hedges (``hedge_reason = ttft_timeout``), hedges
the budget refused, hedges won by the backup, failovers (``primary_error``), prompt, completion
and wasted completion tokens, and three sparse log-bucketed TTFT histograms
(:mod:`hedgerow.controller.policy.ttft_histogram`, 50 buckets per decade, 1 ms to 1 h):

* ``primary_ttft_hist`` / ``primary_censored_hist``: the primary's TTFT as the controller reads it
  (:mod:`hedgerow.controller.jobs`): the call's first ``primary`` attempt; with a first token its
  TTFT ``first_token_s - start_s`` is an observed sample; cancelled before one, it is censored at
  ``end_s - start_s``; a failed attempt is no sample;
* ``call_ttft_hist``: the call's ``ttft_s``, what the app saw with hedging (calls with a TTFT).

Since revision 0004 (``FOLD_VERSION`` 2) a rollup also holds the cost of its attempts: prompt and
completion tokens of the primary attempts, of the backup attempts and of the *extra* attempts
(every attempt that did not win, in a call with more than one attempt: what hedging and
failover spent on losers), cached and estimated prompt tokens, the same per upstream
(``upstream_tokens``, what prices apply to), and histograms of the calls' TPOT and e2e (same
bucket scheme; TPOT under 1 ms falls in the underflow bucket, an absolute error < 1 ms). An
attempt's prompt tokens follow :func:`hedgerow.client.records.estimate_prompt_tokens`.

Every field is a sum over calls, so the rollup of any set of hours and routes is the element-wise
sum of theirs (:meth:`Rollup.merged`), and weekly figures need no raw data.

Folding: recompute whole hours, seal before deleting
----------------------------------------------------
:func:`fold_hours` runs regularly (the retention job calls it first) over every complete hour that
*may have changed*: the hours of the calls it has not looked at yet (see "Which hours a fold looks
at" below), or, at a process's first fold, every complete hour that still has raw calls. A grouped
query counts the raw calls of those (route, hour)s and their largest ``calls.id``; an hour is

* **folded** when it has no rollup yet, and **re-folded** when its raw count or largest id differ
  from the rollup's ``calls`` / ``max_call_id`` (late exporter batches): the hour is recomputed
  from its raw rows and upserted (``INSERT ... ON CONFLICT (route_id, hour_start) DO UPDATE``).
  Recomputing, rather than adding, is what makes a re-run harmless: folding an hour twice writes
  the same row twice, never double counts, and a half-done or raced fold heals at the next run;
* left alone when the rollup matches its raw rows (the usual case: each run touches only the
  hours that changed).

Retention (:mod:`hedgerow.controller.store.retention`) first **seals** an hour (``sealed_at``, set only
while the rollup still matches the raw rows, in one conditional UPDATE), then deletes its raw calls
with ``id <= max_call_id`` in batches. A sealed rollup is never recomputed (its raw rows may be
partly gone, and a recompute would undercount; the upsert's ``WHERE sealed_at IS NULL`` enforces
it). A call that arrives after the seal in an hour that old (``id > max_call_id``) is *added* to
the sealed rollup (``UPDATE ... WHERE max_call_id = <old>``, so two runs cannot both add it) and
only then becomes deletable. So a raw call is never deleted before it is counted in a rollup, and
never counted twice.

Which hours a fold looks at
---------------------------
Each process keeps, per sessionmaker, a *cursor*: a call id such that every call with an id at
or below it was committed, and in a complete hour, when a fold that succeeded looked at it. The
next fold reads only the calls above the cursor (a range of the primary key, on every day
partition), so a run costs in proportion to the calls that arrived since the last one, not to
the ``retention_s`` of raw calls kept; a late record is above the cursor (ids only grow) and
brings its old hour back. The first fold of a process (and ``full=True``) looks at every hour,
which also recomputes rollups of an older :data:`FOLD_VERSION`.

The new cursor is the smaller of

* the largest id committed when the fold began: on PostgreSQL read while holding
  :data:`hedgerow.controller.store.ingest.INGEST_LOCK` exclusively (every ingest batch holds it shared
  to its commit, and draws its ids after taking it), so every id at or below it is committed and
  every call not yet visible gets a larger one; on SQLite the visible ``max(id)`` (one writer at a
  time: a writer in flight gives its rows ids above it). If the lock is not granted within
  :data:`CURSOR_LOCK_TIMEOUT_S` the cursor stays where it was;
* one below the smallest id of a call in the current hour or later (not folded yet),

and never below the old cursor. A fold that fails leaves it where it was, so a re-run looks at
the same calls again (and recomputing is harmless).

Weekly figures
--------------
:func:`merge_rollups` sums the rollups of whole hours ``[since, until)`` per (route, model) into a
:class:`RouteRollup`; its :class:`Rollup` gives hedge rate, backup win rate, tokens and TTFT
quantiles (:meth:`Rollup.figures`). A weekly report calls
``merge_rollups(session, since=monday, until=monday + 7 days)`` (and :meth:`Rollup.merged` over
the routes for a total). The quantile error is that of the bucket scheme: under 2.33 % for the
call-level TTFT; for the censored primary TTFT (Kaplan-Meier over the merged buckets) the interval
``[low_s, high_s]`` holds the exact KM quantile (see :mod:`hedgerow.controller.policy.ttft_histogram`).
The current, incomplete hour is never in a rollup.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Integer, and_, cast, func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from hedgerow.controller.errors import StoreError
from hedgerow.controller.policy.ttft_histogram import (
    HISTOGRAM_SCHEME,
    counts_from_json,
    counts_to_json,
)
from hedgerow.controller.store._rollup_fold import (
    ATTEMPT_TOKEN_FIELDS,
    CALL_STATUSES,
    COUNTER_FIELDS,
    HISTOGRAM_COLUMNS,
    HOUR_S,
    UPSTREAM_TOKEN_KEYS,
    FoldedHour,
    Rollup,
    RouteRollup,
    floor_hour,
    fold_rows,
    hour_of_index,
    merge_upstream_tokens,
)
from hedgerow.controller.store.db import WriteFence, dialect_insert, rowcount
from hedgerow.controller.store.ingest import INGEST_LOCK
from hedgerow.controller.store.models import Attempt, Call, HourlyRollup, Route, utc_now

__all__ = [
    "ATTEMPT_TOKEN_FIELDS",
    "CALL_STATUSES",
    "COUNTER_FIELDS",
    "CURSOR_LOCK_TIMEOUT_S",
    "FOLD_ATTEMPT_COLUMNS",
    "FOLD_CALL_COLUMNS",
    "FOLD_VERSION",
    "HISTOGRAM_COLUMNS",
    "HOUR_S",
    "UPSTREAM_TOKEN_KEYS",
    "FoldedHour",
    "Rollup",
    "RouteRollup",
    "aggregate_hour",
    "floor_hour",
    "fold_hours",
    "fold_rows",
    "hour_index_sql",
    "hour_of_index",
    "merge_rollups",
    "merge_upstream_tokens",
    "rollup_from_row",
    "scan_raw_hours",
]

log = logging.getLogger(__name__)


#: Version of the fold rules; an unsealed rollup of an older version is recomputed by a full fold.
FOLD_VERSION = 2
#: The ``calls`` columns :func:`fold_rows` reads, in its order (its ``call_rows``).
FOLD_CALL_COLUMNS = (
    Call.id, Call.status, Call.hedge_reason, Call.hedge_denied, Call.winner, Call.ttft_s, Call.prompt_tokens,
    Call.completion_tokens, Call.wasted_completion_tokens, Call.tpot_s, Call.e2e_s,
)  # fmt: skip
#: The ``attempts`` columns :func:`fold_rows` reads, in its order (its ``attempt_rows``; to be
#: ordered by call id and attempt index).
FOLD_ATTEMPT_COLUMNS = (
    Attempt.call_id, Attempt.role, Attempt.upstream, Attempt.start_s, Attempt.first_token_s, Attempt.end_s,
    Attempt.outcome, Attempt.status_code, Attempt.completion_tokens, Attempt.prompt_tokens,
    Attempt.prompt_tokens_estimated, Attempt.cached_prompt_tokens,
)  # fmt: skip
#: PostgreSQL: longest wait, seconds, for the ingest lock when a fold reads its cursor.
CURSOR_LOCK_TIMEOUT_S = 5.0
#: Per sessionmaker (so per store) of this process: the fold cursor (see "Which hours a fold
#: looks at" in the module docstring).
_cursors: weakref.WeakKeyDictionary[async_sessionmaker[AsyncSession], int] = weakref.WeakKeyDictionary()


def hour_index_sql(dialect_name: str) -> ColumnElement[int]:
    """SQL for ``floor(epoch seconds of calls.started_at / 3600)`` on SQLite or PostgreSQL."""
    if dialect_name == "sqlite":  # naive UTC text; strftime('%s') reads it as UTC
        return cast(func.strftime("%s", Call.started_at), Integer) // HOUR_S
    return cast(func.floor(func.extract("epoch", Call.started_at) / HOUR_S), BigInteger)


async def scan_raw_hours(
    session: AsyncSession, *, before: datetime, route_id: int | None = None
) -> dict[tuple[int, datetime], tuple[int, int]]:
    """Count the raw calls per (route, hour), for hours starting before ``before``.

    Args:
        session: an open session.
        before: only calls with ``started_at < before`` (aware UTC; a whole hour).
        route_id: only this route (default: every route).

    Returns:
        ``{(route_id, hour_start): (calls, largest calls.id)}``.
    """
    hour = hour_index_sql(session.get_bind().dialect.name).label("hour")
    query = (
        select(Call.route_id, hour, func.count(), func.max(Call.id))
        .where(Call.started_at < before)
        .group_by(Call.route_id, hour)
    )
    if route_id is not None:
        query = query.where(Call.route_id == route_id)
    rows = await session.execute(query)
    return {(int(rid), hour_of_index(index)): (int(count), int(max_id)) for rid, index, count, max_id in rows.all()}


async def aggregate_hour(
    session: AsyncSession, route_id: int, hour_start: datetime, *, after_call_id: int | None = None
) -> tuple[Rollup, int | None]:
    """Fold the raw calls of one (route, hour) (optionally only those with ``id > after_call_id``).

    Returns:
        The rollup and the largest call id folded (None when there was no call).
    """
    hour_end = hour_start + timedelta(seconds=HOUR_S)
    where = [Call.route_id == route_id, Call.started_at >= hour_start, Call.started_at < hour_end]
    if after_call_id is not None:
        where.append(Call.id > after_call_id)
    call_rows = await session.execute(select(*FOLD_CALL_COLUMNS).where(*where))
    attempt_rows = await session.execute(
        select(*FOLD_ATTEMPT_COLUMNS)
        .join(Call, Call.id == Attempt.call_id)
        .where(*where)
        .order_by(Attempt.call_id, Attempt.attempt_index)
    )
    return fold_rows(call_rows.all(), attempt_rows.all())


def rollup_from_row(row: HourlyRollup) -> Rollup:
    """The :class:`Rollup` stored in an ``hourly_rollups`` row.

    Raises:
        StoreError: the row uses another histogram scheme, or holds a malformed histogram.
    """
    if row.histogram_scheme != HISTOGRAM_SCHEME:
        raise StoreError(
            f"hourly rollup {row.id} uses histogram scheme {row.histogram_scheme!r}; this version "
            f"reads {HISTOGRAM_SCHEME!r} only"
        )
    try:
        values: dict[str, Any] = {
            name: counts_from_json(getattr(row, column), name=column) for name, column in HISTOGRAM_COLUMNS.items()
        }
        values["upstream_tokens"] = _upstream_tokens_from_json(row.upstream_tokens)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"hourly rollup {row.id}: {exc}") from None
    values.update({name: getattr(row, name) or 0 for name in (*COUNTER_FIELDS, *ATTEMPT_TOKEN_FIELDS)})
    return Rollup(**values)


def _upstream_tokens_from_json(value: Any) -> dict[str, dict[str, int]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"upstream_tokens must be a JSON object, got {type(value).__name__}")
    out: dict[str, dict[str, int]] = {}
    for upstream, counts in value.items():
        if not isinstance(counts, Mapping):
            raise TypeError(f"upstream_tokens[{upstream!r}] must be a JSON object")
        entry = dict.fromkeys(UPSTREAM_TOKEN_KEYS, 0)
        for key, count in counts.items():
            if key not in UPSTREAM_TOKEN_KEYS or isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"upstream_tokens[{upstream!r}][{key!r}] = {count!r} is not a token count")
            entry[key] = count
        out[str(upstream)] = entry
    return out


def _row_values(rollup: Rollup) -> dict[str, Any]:
    return {
        **{name: getattr(rollup, name) for name in (*COUNTER_FIELDS, *ATTEMPT_TOKEN_FIELDS)},
        "primary_samples": rollup.primary_samples,
        "primary_censored": rollup.primary_censored_count,
        "histogram_scheme": HISTOGRAM_SCHEME,
        **{column: counts_to_json(getattr(rollup, name)) for name, column in HISTOGRAM_COLUMNS.items()},
        "upstream_tokens": {name: dict(counts) for name, counts in rollup.upstream_tokens.items()},
        "fold_version": FOLD_VERSION,
    }


async def _upsert(
    sessionmaker: async_sessionmaker[AsyncSession], route_id: int, hour_start: datetime, rollup: Rollup,
    max_call_id: int, now: datetime, fence: WriteFence | None,
) -> None:  # fmt: skip
    """Insert the rollup of an hour, or overwrite it unless it is sealed (one write transaction,
    checked by ``fence`` last)."""
    values = {"route_id": route_id, "hour_start": hour_start, "folded_at": now, "sealed_at": None,
              "max_call_id": max_call_id, **_row_values(rollup)}  # fmt: skip
    async with sessionmaker() as session, session.begin():
        stmt = dialect_insert(session, HourlyRollup).values(values)
        keep = {"id", "route_id", "hour_start", "sealed_at"}
        stmt = stmt.on_conflict_do_update(
            index_elements=["route_id", "hour_start"],
            set_={name: stmt.excluded[name] for name in values if name not in keep},
            where=HourlyRollup.sealed_at.is_(None),
        )
        await session.execute(stmt)
        if fence is not None:
            await fence(session)


async def _add_late(
    sessionmaker: async_sessionmaker[AsyncSession], row: HourlyRollup, late: Rollup, max_call_id: int, now: datetime,
    fence: WriteFence | None,
) -> bool:  # fmt: skip
    """Add late calls to a sealed rollup, unless another run already did (checked by ``fence``
    last); True when added."""
    total = rollup_from_row(row).merged(late)
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            update(HourlyRollup)
            .where(HourlyRollup.id == row.id, HourlyRollup.max_call_id == row.max_call_id)
            .values(folded_at=now, max_call_id=max_call_id, **_row_values(total))
            .execution_options(synchronize_session=False)
        )
        if fence is not None:
            await fence(session)
    return rowcount(result) == 1


async def _committed_max_id(sessionmaker: async_sessionmaker[AsyncSession]) -> int | None:
    """The largest call id such that every call at or below it is committed (0: no call), or
    None when PostgreSQL's ingest lock was not granted in time (see the module docstring)."""
    async with sessionmaker() as session, session.begin():
        connection = await session.connection()
        if connection.dialect.name == "postgresql":
            await connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(CURSOR_LOCK_TIMEOUT_S * 1000)}ms'")
            try:
                await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": INGEST_LOCK})
            except DBAPIError as exc:
                log.warning("fold: the ingest lock was not granted; the cursor stays: %s",
                            str(exc.orig).splitlines()[0])  # fmt: skip
                return None
        return int(await session.scalar(select(func.max(Call.id))) or 0)


async def _hours_after(
    session: AsyncSession, cursor: int, current_hour: datetime
) -> tuple[set[tuple[int, datetime]], int | None]:
    """The (route, hour)s before ``current_hour`` of the calls with ``id > cursor``, and the
    smallest such id of a call in ``current_hour`` or later (None: no such call)."""
    hour = hour_index_sql(session.get_bind().dialect.name).label("hour")
    rows = await session.execute(
        select(Call.route_id, hour, func.min(Call.id)).where(Call.id > cursor).group_by(Call.route_id, hour)
    )
    hours: set[tuple[int, datetime]] = set()
    first_open: int | None = None
    for rid, index, min_id in rows.all():
        start = hour_of_index(index)
        if start < current_hour:
            hours.add((int(rid), start))
        else:
            first_open = int(min_id) if first_open is None else min(first_open, int(min_id))
    return hours, first_open


async def _count_hours(
    session: AsyncSession, hours: set[tuple[int, datetime]]
) -> dict[tuple[int, datetime], tuple[int, int]]:
    """``{(route_id, hour_start): (calls, largest calls.id)}`` of the given hours (one query per
    distinct hour, each an index range of ``(route_id, started_at)``)."""
    by_hour: dict[datetime, list[int]] = {}
    for rid, start in hours:
        by_hour.setdefault(start, []).append(rid)
    counts: dict[tuple[int, datetime], tuple[int, int]] = {}
    for start, rids in sorted(by_hour.items()):
        rows = await session.execute(
            select(Call.route_id, func.count(), func.max(Call.id))
            .where(Call.route_id.in_(sorted(rids)), Call.started_at >= start,
                   Call.started_at < start + timedelta(seconds=HOUR_S))
            .group_by(Call.route_id)
        )  # fmt: skip
        counts.update({(int(rid), start): (int(count), int(max_id)) for rid, count, max_id in rows.all()})
    return counts


async def fold_hours(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    now: datetime | None = None,
    route_id: int | None = None,
    full: bool = False,
    fence: WriteFence | None = None,
) -> list[FoldedHour]:
    """Fold every complete hour whose raw calls are not (or no longer) matched by its rollup.

    Looks only at the hours of calls that arrived since this process's last fold of the same
    store (its cursor), or at every hour on its first fold, with ``full``, or for one
    ``route_id`` (see the module docstring). Idempotent: a second run right after the first
    writes nothing. Each hour is read in one short transaction and written in another, which
    starts with its write (no SQLite snapshot upgrade).

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`; the cursor is kept
            per sessionmaker.
        now: the current time (aware UTC; default: now). Hours ending after it are left out.
        route_id: only this route (default: every route); looks at all its hours and leaves
            the cursor as it is.
        full: look at every hour even when a cursor is known.
        fence: run last in each writing transaction (the lease holder's check,
            :data:`~hedgerow.controller.store.db.WriteFence`); None: no check.

    Returns:
        The hours written, ordered by (route, model, hour).

    Raises:
        ValueError: ``now`` is naive.
        StoreError: a stored rollup uses another histogram scheme.
        Exception: what ``fence`` raises (e.g. ``LeaseLost``); that hour's write is rolled back,
            the hours written before it stand (each is right on its own) and the cursor stays.
    """
    now = utc_now() if now is None else now
    current_hour = floor_hour(now)
    cursor = None if full or route_id is not None else _cursors.get(sessionmaker)
    committed = None if route_id is not None else await _committed_max_id(sessionmaker)
    async with sessionmaker() as session:
        if cursor is None:
            raw = await scan_raw_hours(session, before=current_hour, route_id=route_id)
            first_open = await session.scalar(select(func.min(Call.id)).where(Call.started_at >= current_hour))
        else:
            hours, first_open = await _hours_after(session, cursor, current_hour)
            raw = await _count_hours(session, hours)
        existing: dict[tuple[int, datetime], HourlyRollup] = {}
        if raw:
            query = select(HourlyRollup).where(HourlyRollup.hour_start >= min(hour for _, hour in raw))
            if route_id is not None:
                query = query.where(HourlyRollup.route_id == route_id)
            elif cursor is not None:  # the rollups of those hours only (their count is bounded by routes x hours)
                query = query.where(HourlyRollup.hour_start.in_(sorted({hour for _, hour in raw})))
            existing = {(r.route_id, r.hour_start): r for r in (await session.scalars(query)).all()}
            names = {rid: (route, model) for rid, route, model in
                     (await session.execute(select(Route.id, Route.route, Route.model))).all()}  # fmt: skip
    written: list[FoldedHour] = []
    for (rid, hour), (count, max_id) in sorted(raw.items(), key=lambda kv: (names[kv[0][0]], kv[0][1])):
        row = existing.get((rid, hour))
        route, model = names[rid]
        if row is not None and row.sealed_at is not None:
            if max_id <= row.max_call_id:
                continue  # leftovers that retention is still deleting: already counted
            async with sessionmaker() as session:
                late, late_max = await aggregate_hour(session, rid, hour, after_call_id=row.max_call_id)
            if late_max is not None and await _add_late(sessionmaker, row, late, late_max, now, fence):
                written.append(FoldedHour(route, model, hour, "late", row.calls + late.calls))
            continue
        if row is not None and (row.calls, row.max_call_id, row.fold_version) == (count, max_id, FOLD_VERSION):
            continue  # up to date
        async with sessionmaker() as session:
            rollup, folded_max = await aggregate_hour(session, rid, hour)
        if folded_max is None:
            continue  # the raw rows vanished meanwhile
        await _upsert(sessionmaker, rid, hour, rollup, folded_max, now, fence)
        written.append(FoldedHour(route, model, hour, "new" if row is None else "refolded", rollup.calls))
    if committed is not None:
        bound = committed if first_open is None else min(committed, int(first_open) - 1)
        _cursors[sessionmaker] = max(bound, _cursors.get(sessionmaker, 0))
    if written:
        log.info("folded %d hour(s) into hourly rollups", len(written))
    return written


def _check_period(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    for name, value in (("since", since), ("until", until)):
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise ValueError(f"{name} must be a timezone-aware (UTC) datetime, got {value!r}")
        if floor_hour(value) != value:
            raise ValueError(f"{name} = {value.isoformat()} is not a whole UTC hour (rollups are hourly)")
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    if since >= until:
        raise ValueError(f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
    return since, until


async def merge_rollups(
    session: AsyncSession,
    *,
    since: datetime,
    until: datetime,
    route: str | None = None,
    model: str | None = None,
) -> list[RouteRollup]:
    """Merge the hourly rollups of ``[since, until)`` per (route, model): what a weekly report reads.

    Example (the week 2026-W48)::

        monday = datetime(2026, 11, 23, tzinfo=timezone.utc)
        async with sessionmaker() as session:
            per_route = await merge_rollups(session, since=monday, until=monday + timedelta(days=7))
        total = Rollup().merged(*(r.rollup for r in per_route))
        total.figures()  # calls, hedge_rate, backup_win_rate, tokens, ttft_p50_s/p90/p99 ...

    Args:
        session: an open session.
        since, until: the period, aware datetimes on whole UTC hours, ``since < until``.
        route, model: only this route / model (default: all).

    Returns:
        One :class:`RouteRollup` per (route, model) with at least one rollup in the period,
        ordered by (route, model). Hours not yet folded (the current one) are not included.

    Raises:
        ValueError: a naive or not hour-aligned bound, or ``since >= until``.
        StoreError: a stored rollup uses another histogram scheme or is malformed.
    """
    since, until = _check_period(since, until)
    query = (
        select(Route.route, Route.model, HourlyRollup)
        .join(Route, Route.id == HourlyRollup.route_id)
        .where(and_(HourlyRollup.hour_start >= since, HourlyRollup.hour_start < until))
        .order_by(Route.route, Route.model, HourlyRollup.hour_start)
    )
    if route is not None:
        query = query.where(Route.route == route)
    if model is not None:
        query = query.where(Route.model == model)
    grouped: dict[tuple[str, str], list[Rollup]] = {}
    for name, model_name, row in (await session.execute(query)).all():
        grouped.setdefault((name, model_name), []).append(rollup_from_row(row))
    return [
        RouteRollup(name, model_name, since, until, len(rollups), Rollup().merged(*rollups))
        for (name, model_name), rollups in grouped.items()
    ]
