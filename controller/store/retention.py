"""Retention: delete raw calls and attempts older than ``retention_s``, once their hour is rolled up.

One run (:func:`run_retention`, scheduled every ``rollup_interval_s`` on the lease holder, or
``hedgerow db retention``):

1. :func:`hedgerow.controller.store.rollups.fold_hours`: fold every complete hour that changed, old or
   new, so that an hour is in a rollup long before it is old enough to delete;
2. ``cutoff = floor_hour(now - retention_s)``; only whole hours ending at or before it are touched
   (an hour straddling the cutoff waits for the next run);
3. per (route, hour) before the cutoff that still has raw calls: **seal** its rollup with one
   conditional UPDATE that succeeds only if the rollup matches the raw rows right now (same count
   and largest ``calls.id``); a rollup that is missing or stale is skipped and reported, and
   the next run folds it first;
4. delete the sealed hour's calls with ``id <= max_call_id`` (those the rollup counted) in batches
   of ``retention_batch_rows``: each batch deletes the attempts of those calls, then the calls, in
   one short transaction (attempts are deleted explicitly, not left to ``ON DELETE CASCADE``, so
   it does not depend on SQLite's ``PRAGMA foreign_keys``). A backlog of many days is so deleted
   in many small transactions, never one that holds the database.

Ids must only grow for step 4 to be right (a late call is told from a counted one by ``id >
max_call_id``). PostgreSQL sequences never go back; SQLite gives a new row ``max(id) + 1``, so it
would reuse ids once the newest rows were deleted. Retention therefore never deletes the call with
the largest id in the table: it is counted already, and goes at the first run after a newer call
arrives. (On PostgreSQL a transaction that took an id before the fold and commits after the seal,
in an hour older than the retention age, could still be missed: not a case that happens.)

On PostgreSQL (``calls`` and ``attempts`` partitioned by day, :mod:`hedgerow.controller.store.partitions`)
step 3 and 4 are replaced by dropping whole days (:func:`drop_folded_days`): a day whose end is at
least ``retention_s`` + :data:`~hedgerow.controller.store.partitions.DROP_GRACE_S` old is dropped, in one
transaction, once every (route, hour) of it is counted by its rollup: its two partitions are
locked against writes (``SHARE``), every hour with raw calls is checked against its rollup (an
unsealed rollup must match the hour's count and largest id; a sealed one must have counted the
largest id), the day's rollups are sealed, and ``attempts_pD`` then ``calls_pD`` are dropped (after
``ACCESS EXCLUSIVE`` locks on the parents, ``calls`` first, the order ingest writes in, each
waited for at most :data:`LOCK_TIMEOUT_S`). A day with an hour not folded is kept, and listed
with the reason, until a later run has folded it. Raw rows therefore stay up to a day longer than
``retention_s`` (a day goes whole). Then the ``call_request_ids`` rows older than the oldest day
still stored are deleted in batches (:func:`prune_request_ids`), and every run makes sure today's
and the next :data:`~hedgerow.controller.store.partitions.DAYS_AHEAD` days' partitions exist.

Re-running is safe at every step: folding recomputes, sealing is conditional, deleting a batch
twice deletes nothing the second time, and an interrupted run resumes where it stopped. Rollups
are kept forever (one row per route and hour: about 9,000 a year per route).

Each run also deletes the ``minute_aggregates`` rows no tick can read any more (minutes older
than ``max_window_s`` and one minute; at most 1,441 rows per route stay).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from hedgerow.controller.store.db import WriteFence, check_ready, make_engine, make_sessionmaker, rowcount
from hedgerow.controller.store.minute_store import prune_minutes
from hedgerow.controller.store.models import Attempt, Call, HourlyRollup, Route, ThresholdHistory, utc_now
from hedgerow.controller.store.partitions import (
    DAYS_AHEAD,
    DROP_GRACE_S,
    day_bounds,
    day_of,
    ensure_day_partitions,
    partition_days,
    partition_name,
)
from hedgerow.controller.store.rollups import (
    HOUR_S,
    FoldedHour,
    floor_hour,
    fold_hours,
    hour_of_index,
    scan_raw_hours,
)

if TYPE_CHECKING:
    from hedgerow.settings import Settings

__all__ = [
    "DeletedHour",
    "RetentionReport",
    "delete_folded_raw",
    "drop_folded_days",
    "ensure_days_ahead",
    "prune_history",
    "prune_request_ids",
    "run_retention",
    "run_retention_once",
]

log = logging.getLogger(__name__)

#: Longest wait for a lock when dropping a day (PostgreSQL), seconds; past it the day waits a run.
LOCK_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class DeletedHour:
    """Raw rows deleted for one (route, hour), or why none were.

    Attributes:
        route, model: the pair.
        hour_start: start of the hour (aware UTC).
        calls, attempts: rows deleted by this run.
        skipped: None when deleted; else why the hour was kept (``not_folded``: no rollup;
            ``stale_rollup``: raw rows changed since the fold; PostgreSQL: ``day_not_folded``:
            another hour of its day is not folded, ``locked``: a lock was not granted in time).
    """

    route: str
    model: str
    hour_start: datetime
    calls: int
    attempts: int
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``hour_start`` as ISO 8601)."""
        return {"route": self.route, "model": self.model, "hour_start": self.hour_start.isoformat(),
                "calls": self.calls, "attempts": self.attempts, "skipped": self.skipped}  # fmt: skip


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one run folded and deleted.

    Attributes:
        now: the run's time (aware UTC).
        cutoff: raw calls started before it were eligible for deletion (a whole UTC hour).
        folded: hours folded into rollups.
        deleted: hours whose raw rows were deleted (or skipped, with the reason).
        pruned_history: threshold history rows deleted (:func:`prune_history`).
        dropped_days: PostgreSQL: days whose ``calls`` / ``attempts`` partitions were dropped.
        pruned_request_ids: PostgreSQL: ``call_request_ids`` rows deleted.
        created_days: PostgreSQL: days whose partitions this run created ahead of need.
        pruned_minutes: ``minute_aggregates`` rows deleted (older than the tick's widest window,
            :func:`hedgerow.controller.store.minute_store.prune_minutes`).
    """

    now: datetime
    cutoff: datetime
    folded: list[FoldedHour] = field(default_factory=list)
    deleted: list[DeletedHour] = field(default_factory=list)
    pruned_history: int = 0
    dropped_days: list[date] = field(default_factory=list)
    pruned_request_ids: int = 0
    created_days: list[date] = field(default_factory=list)
    pruned_minutes: int = 0

    @property
    def deleted_calls(self) -> int:
        """Calls deleted by the run."""
        return sum(h.calls for h in self.deleted)

    @property
    def deleted_attempts(self) -> int:
        """Attempts deleted by the run."""
        return sum(h.attempts for h in self.deleted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary and details (what ``hedgerow db retention --json`` prints)."""
        return {
            "now": self.now.isoformat(),
            "cutoff": self.cutoff.isoformat(),
            "folded_hours": len(self.folded),
            "deleted_calls": self.deleted_calls,
            "deleted_attempts": self.deleted_attempts,
            "skipped_hours": sum(1 for h in self.deleted if h.skipped),
            "pruned_history": self.pruned_history,
            "dropped_days": [day.isoformat() for day in self.dropped_days],
            "pruned_request_ids": self.pruned_request_ids,
            "created_days": [day.isoformat() for day in self.created_days],
            "pruned_minutes": self.pruned_minutes,
            "folded": [h.to_dict() for h in self.folded],
            "deleted": [h.to_dict() for h in self.deleted],
        }


def _in_hour(route_id: int, hour_start: datetime) -> list[Any]:
    return [Call.route_id == route_id, Call.started_at >= hour_start,
            Call.started_at < hour_start + timedelta(seconds=HOUR_S)]  # fmt: skip


async def _seal(
    sessionmaker: async_sessionmaker[AsyncSession], route_id: int, hour_start: datetime, now: datetime,
    fence: WriteFence | None,
) -> int | None:  # fmt: skip
    """Seal the hour's rollup if it matches the raw rows now; return its ``max_call_id`` if sealed."""
    in_hour = _in_hour(route_id, hour_start)
    raw_count = select(func.count()).where(*in_hour).scalar_subquery()
    raw_max = select(func.max(Call.id)).where(*in_hour).scalar_subquery()
    async with sessionmaker() as session, session.begin():
        await session.execute(
            update(HourlyRollup)
            .where(
                HourlyRollup.route_id == route_id,
                HourlyRollup.hour_start == hour_start,
                HourlyRollup.sealed_at.is_(None),
                HourlyRollup.calls == raw_count,
                HourlyRollup.max_call_id == raw_max,
            )
            .values(sealed_at=now)
            .execution_options(synchronize_session=False)
        )
        if fence is not None:
            await fence(session)
        row = (
            await session.execute(
                select(HourlyRollup.sealed_at, HourlyRollup.max_call_id).where(
                    HourlyRollup.route_id == route_id, HourlyRollup.hour_start == hour_start
                )
            )
        ).one_or_none()
    if row is None or row.sealed_at is None:
        return None
    return int(row.max_call_id)


async def _delete_sealed(
    sessionmaker: async_sessionmaker[AsyncSession],
    route_id: int,
    hour_start: datetime,
    max_call_id: int,
    batch_rows: int,
    fence: WriteFence | None,
) -> tuple[int, int]:
    """Delete the hour's calls with ``id <= max_call_id`` and their attempts, in batches.

    The call with the largest id in the whole table is kept (see the module docstring).
    """
    calls = attempts = 0
    newest = select(func.max(Call.id)).scalar_subquery()
    while True:
        async with sessionmaker() as session:
            ids = list(
                (
                    await session.scalars(
                        select(Call.id)
                        .where(*_in_hour(route_id, hour_start), Call.id <= max_call_id, Call.id < newest)
                        .order_by(Call.id)
                        .limit(batch_rows)
                    )
                ).all()
            )
        if not ids:
            return calls, attempts
        # a separate transaction whose first statement writes (no SQLite snapshot upgrade)
        async with sessionmaker() as session, session.begin():
            gone_attempts = await session.execute(
                delete(Attempt).where(Attempt.call_id.in_(ids)).execution_options(synchronize_session=False)
            )
            gone_calls = await session.execute(
                delete(Call).where(Call.id.in_(ids)).execution_options(synchronize_session=False)
            )
            if fence is not None:
                await fence(session)
        attempts += rowcount(gone_attempts)
        calls += rowcount(gone_calls)
        if len(ids) < batch_rows:
            return calls, attempts


async def delete_folded_raw(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    cutoff: datetime,
    batch_rows: int,
    now: datetime | None = None,
    fence: WriteFence | None = None,
) -> list[DeletedHour]:
    """Delete the raw calls and attempts of every whole hour before ``cutoff`` that is rolled up.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        cutoff: a whole UTC hour (aware); hours starting before it are eligible.
        batch_rows: most calls deleted per transaction (>= 1).
        now: stored as the rollups' ``sealed_at`` (default: now).
        fence: run last in each writing transaction (:data:`~hedgerow.controller.store.db.WriteFence`).

    Returns:
        One entry per eligible hour that had raw rows, ordered by (route, model, hour).

    Raises:
        ValueError: naive or not hour-aligned ``cutoff``, or ``batch_rows < 1``.
    """
    if cutoff.tzinfo is None or floor_hour(cutoff) != cutoff:
        raise ValueError(f"cutoff must be an aware datetime on a whole UTC hour, got {cutoff!r}")
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be an integer >= 1, got {batch_rows!r}")
    now = utc_now() if now is None else now
    async with sessionmaker() as session:
        raw = await scan_raw_hours(session, before=cutoff)
        names = {rid: (route, model) for rid, route, model in
                 (await session.execute(select(Route.id, Route.route, Route.model))).all()}  # fmt: skip
    done: list[DeletedHour] = []
    for rid, hour in sorted(raw, key=lambda key: (names[key[0]], key[1])):
        route, model = names[rid]
        max_call_id = await _seal(sessionmaker, rid, hour, now, fence)
        if max_call_id is None:
            async with sessionmaker() as session:
                exists = await session.scalar(
                    select(func.count()).where(HourlyRollup.route_id == rid, HourlyRollup.hour_start == hour)
                )
            done.append(DeletedHour(route, model, hour, 0, 0, "stale_rollup" if exists else "not_folded"))
            continue
        calls, attempts = await _delete_sealed(sessionmaker, rid, hour, max_call_id, batch_rows, fence)
        done.append(DeletedHour(route, model, hour, calls, attempts))
    return done


async def ensure_days_ahead(
    sessionmaker: async_sessionmaker[AsyncSession], *, now: datetime, fence: WriteFence | None = None
) -> list[date]:
    """PostgreSQL: make sure today and the next :data:`DAYS_AHEAD` days have partitions (``fence``,
    when given, is run last in the creating transaction).

    Returns:
        The days created (empty when all existed, and on SQLite).
    """
    today = day_of(now)
    async with sessionmaker() as session, session.begin():
        connection = await session.connection()
        if connection.dialect.name != "postgresql":
            return []
        created = await ensure_day_partitions(connection, [today + timedelta(days=n) for n in range(DAYS_AHEAD + 1)])
        if created and fence is not None:
            await fence(session)
        return created


_HOUR_OF_CALL = "floor(extract(epoch FROM {col}) / 3600)::bigint"


async def _fetch(connection: AsyncConnection, sql: str) -> list[Any]:
    """The rows of a literal SQL query."""
    return list((await connection.exec_driver_sql(sql)).all())


async def _drop_day(
    sessionmaker: async_sessionmaker[AsyncSession],
    day: date,
    names: dict[int, tuple[str, str]],
    now: datetime,
    fence: WriteFence | None,
) -> tuple[bool, list[DeletedHour]]:
    """Drop one day's partitions if every hour of it is counted by its rollup (one transaction).

    Returns:
        ``(dropped, hours)``: the hours with raw calls, deleted or skipped with the reason.
    """
    calls_p, attempts_p = partition_name("calls", day), partition_name("attempts", day)
    start, end = day_bounds(day)
    hour = _HOUR_OF_CALL.format(col="started_at")
    async with sessionmaker() as session, session.begin():
        connection = await session.connection()
        await connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT_S * 1000)}ms'")
        await connection.exec_driver_sql(f"LOCK TABLE {calls_p}, {attempts_p} IN SHARE MODE")
        raw = {
            (int(rid), hour_of_index(index)): (int(count), int(max_id))
            for rid, index, count, max_id in await _fetch(
                connection, f"SELECT route_id, {hour}, count(*), max(id) FROM {calls_p} GROUP BY 1, 2"
            )
        }
        rollups = {
            (r.route_id, r.hour_start): r
            for r in (
                await session.execute(
                    select(
                        HourlyRollup.route_id, HourlyRollup.hour_start, HourlyRollup.calls,
                        HourlyRollup.max_call_id, HourlyRollup.sealed_at,
                    ).where(HourlyRollup.hour_start >= start, HourlyRollup.hour_start < end)
                )
            ).all()
        }  # fmt: skip
        problems: dict[tuple[int, datetime], str] = {}
        for key, (count, max_id) in raw.items():
            row = rollups.get(key)
            if row is None:
                problems[key] = "not_folded"
            elif (row.calls, row.max_call_id) != (count, max_id) if row.sealed_at is None else max_id > row.max_call_id:
                problems[key] = "stale_rollup"  # unsealed: must match; sealed: must have counted them
        if problems:
            return False, [
                DeletedHour(*names[rid], hour_start, 0, 0, problems.get((rid, hour_start), "day_not_folded"))
                for rid, hour_start in sorted(raw, key=lambda key: (names[key[0]], key[1]))
            ]
        attempts = {
            (int(rid), hour_of_index(index)): int(count)
            for rid, index, count in await _fetch(
                connection,
                f"SELECT c.route_id, {_HOUR_OF_CALL.format(col='c.started_at')}, count(*) "
                f"FROM {attempts_p} a JOIN {calls_p} c ON c.id = a.call_id GROUP BY 1, 2",
            )
        }
        await session.execute(
            update(HourlyRollup)
            .where(HourlyRollup.hour_start >= start, HourlyRollup.hour_start < end, HourlyRollup.sealed_at.is_(None))
            .values(sealed_at=now)
            .execution_options(synchronize_session=False)
        )
        # the parents in ingest's order (calls, then attempts), then the partitions
        await connection.exec_driver_sql("LOCK TABLE ONLY calls IN ACCESS EXCLUSIVE MODE")
        await connection.exec_driver_sql("LOCK TABLE ONLY attempts IN ACCESS EXCLUSIVE MODE")
        await connection.exec_driver_sql(f"DROP TABLE {attempts_p}")
        await connection.exec_driver_sql(f"DROP TABLE {calls_p}")
        if fence is not None:
            await fence(session)
    return True, [
        DeletedHour(*names[rid], hour_start, count, attempts.get((rid, hour_start), 0))
        for (rid, hour_start), (count, _max_id) in sorted(raw.items(), key=lambda kv: (names[kv[0][0]], kv[0][1]))
    ]


async def drop_folded_days(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    cutoff: datetime,
    now: datetime | None = None,
    fence: WriteFence | None = None,
) -> tuple[list[date], list[DeletedHour]]:
    """PostgreSQL: drop the day partitions that ended :data:`DROP_GRACE_S` before ``cutoff`` and
    are folded (see the module docstring); each day in a transaction of its own.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker` (PostgreSQL).
        cutoff: a whole UTC hour (aware): ``floor_hour(now - retention_s)``.
        now: stored as the day's rollups' ``sealed_at`` (default: now).
        fence: run last in each day's transaction (:data:`~hedgerow.controller.store.db.WriteFence`).

    Returns:
        ``(days dropped, hours)``: every hour with raw calls of the days looked at, deleted or
        skipped with the reason (a day that could not be locked in time: ``locked``).

    Raises:
        ValueError: naive or not hour-aligned ``cutoff``.
    """
    if cutoff.tzinfo is None or floor_hour(cutoff) != cutoff:
        raise ValueError(f"cutoff must be an aware datetime on a whole UTC hour, got {cutoff!r}")
    now = utc_now() if now is None else now
    drop_before = cutoff - timedelta(seconds=DROP_GRACE_S)
    async with sessionmaker() as session:
        days = await partition_days(await session.connection())
        names = {rid: (route, model) for rid, route, model in
                 (await session.execute(select(Route.id, Route.route, Route.model))).all()}  # fmt: skip
    dropped: list[date] = []
    hours: list[DeletedHour] = []
    for day in days:
        if day_bounds(day)[1] > drop_before:
            break
        try:
            done, day_hours = await _drop_day(sessionmaker, day, names, now, fence)
        except DBAPIError as exc:  # lock_timeout, or a deadlock PostgreSQL broke: try at the next run
            log.warning("retention: day %s kept for now: %s", day.isoformat(), str(exc.orig).splitlines()[0])
            hours.append(DeletedHour("", "", day_bounds(day)[0], 0, 0, "locked"))
            continue
        hours.extend(day_hours)
        if done:
            dropped.append(day)
    return dropped, hours


async def prune_request_ids(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    batch_rows: int,
    before: datetime | None = None,
    fence: WriteFence | None = None,
) -> int:
    """PostgreSQL: delete the ``call_request_ids`` rows of calls no longer stored, in batches.

    Rows whose ``started_at`` is before the oldest day that still has a partition (or before
    ``before`` when no day has one) name calls that are gone with their day.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker` (PostgreSQL).
        batch_rows: most rows per transaction, >= 1.
        before: the bound when no partition exists (default: keep everything).
        fence: run last in each writing transaction (:data:`~hedgerow.controller.store.db.WriteFence`).

    Returns:
        Rows deleted.
    """
    async with sessionmaker() as session:
        days = await partition_days(await session.connection())
    bound = day_bounds(days[0])[0] if days else before
    if bound is None:
        return 0
    total = 0
    while True:
        async with sessionmaker() as session, session.begin():
            result = await session.execute(
                text(
                    "DELETE FROM call_request_ids WHERE request_id IN (SELECT request_id FROM call_request_ids "
                    "WHERE started_at < :bound LIMIT :n)"
                ),
                {"bound": bound, "n": batch_rows},
            )
            if fence is not None:
                await fence(session)
        gone = rowcount(result)
        total += gone
        if gone < batch_rows:
            return total


async def prune_history(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    held_before: datetime,
    applied_before: datetime,
    batch_rows: int,
    fence: WriteFence | None = None,
) -> int:
    """Delete old threshold history: held decisions last seen before ``held_before``, applied
    changes (published values and audited configuration changes) before ``applied_before``.

    The newest row of every route is always kept (it is the route's last decision). Deletes run
    in transactions of at most ``batch_rows`` rows.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        held_before: cutoff of rows with ``applied`` false (aware UTC).
        applied_before: cutoff of rows with ``applied`` true (aware UTC; earlier: kept longer).
        batch_rows: most rows per transaction, >= 1.
        fence: run last in each deleting transaction (:data:`~hedgerow.controller.store.db.WriteFence`).

    Returns:
        The rows deleted.
    """
    newest = select(func.max(ThresholdHistory.id)).group_by(ThresholdHistory.route_id)
    # a merged hold (repeats > 1) was last seen at last_at: its age counts from then
    seen = func.coalesce(ThresholdHistory.last_at, ThresholdHistory.computed_at)
    old = (ThresholdHistory.applied.is_(False) & (seen < held_before)) | (
        ThresholdHistory.applied.is_(True) & (seen < applied_before)
    )
    total = 0
    while True:
        async with sessionmaker() as session, session.begin():
            ids = list(
                (
                    await session.scalars(
                        select(ThresholdHistory.id)
                        .where(old, ThresholdHistory.id.not_in(newest))
                        .order_by(ThresholdHistory.id)
                        .limit(batch_rows)
                    )
                ).all()
            )
            if not ids:
                return total
            await session.execute(delete(ThresholdHistory).where(ThresholdHistory.id.in_(ids)))
            if fence is not None:
                await fence(session)
            total += len(ids)


async def run_retention(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    *,
    now: datetime | None = None,
    delete_raw: bool = True,
    fence: WriteFence | None = None,
) -> RetentionReport:
    """Fold every changed complete hour, then delete raw rows older than ``settings.retention_s``,
    minute aggregates older than ``settings.max_window_s`` (:func:`prune_minutes`) and threshold
    history older than ``settings.history_retention_s`` (held decisions) or
    ``settings.applied_history_retention_s`` (applied changes), see :func:`prune_history`.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings`` (``retention_s``, ``retention_batch_rows``,
            ``max_window_s``, the history retentions).
        now: the run's time (aware UTC; default: now).
        delete_raw: False folds only.
        fence: run last in every writing transaction of the run (the scheduler passes the lease
            holder's check, so a process that lost the lease writes nothing more); None: no check.

    Returns:
        A :class:`RetentionReport`.

    Raises:
        ValueError: ``now`` is naive.
        StoreError: a stored rollup uses another histogram scheme.
        Exception: what ``fence`` raises (``LeaseLost``): the run stops, its open transaction
            rolled back (what it committed before is right on its own; the next run resumes).
    """
    now = utc_now() if now is None else now
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    now = now.astimezone(UTC)
    cutoff = floor_hour(now - timedelta(seconds=settings.retention_s))
    created = await ensure_days_ahead(sessionmaker, now=now, fence=fence)
    async with sessionmaker() as session:
        partitioned = session.get_bind().dialect.name == "postgresql"
    folded = await fold_hours(sessionmaker, now=now, fence=fence)
    deleted: list[DeletedHour] = []
    dropped: list[date] = []
    pruned_ids = 0
    if delete_raw and partitioned:
        dropped, deleted = await drop_folded_days(sessionmaker, cutoff=cutoff, now=now, fence=fence)
        pruned_ids = await prune_request_ids(
            sessionmaker,
            batch_rows=settings.retention_batch_rows,
            before=cutoff - timedelta(seconds=DROP_GRACE_S),
            fence=fence,
        )
    elif delete_raw:
        deleted = await delete_folded_raw(
            sessionmaker, cutoff=cutoff, batch_rows=settings.retention_batch_rows, now=now, fence=fence
        )
    pruned = pruned_minutes = 0
    if delete_raw:
        pruned_minutes = await prune_minutes(sessionmaker, now=now, max_window_s=settings.max_window_s, fence=fence)
        pruned = await prune_history(
            sessionmaker,
            held_before=now - timedelta(seconds=settings.history_retention_s),
            applied_before=now - timedelta(seconds=settings.applied_history_retention_s),
            batch_rows=settings.retention_batch_rows,
            fence=fence,
        )
    report = RetentionReport(
        now=now, cutoff=cutoff, folded=folded, deleted=deleted, pruned_history=pruned,
        dropped_days=dropped, pruned_request_ids=pruned_ids, created_days=created, pruned_minutes=pruned_minutes,
    )  # fmt: skip
    if dropped:
        log.info("retention: dropped the partitions of %d day(s): %s", len(dropped),
                 ", ".join(day.isoformat() for day in dropped))  # fmt: skip
    if pruned:
        log.info("retention: deleted %d threshold history row(s)", pruned)
    if folded or deleted:
        log.info("retention: folded %d hour(s), deleted %d call(s) and %d attempt(s) before %s",
                 len(folded), report.deleted_calls, report.deleted_attempts, cutoff.isoformat())  # fmt: skip
    return report


async def run_retention_once(settings: Settings, *, delete_raw: bool = True) -> RetentionReport:
    """Open the store of ``settings.database_url``, run :func:`run_retention` once, close it.

    Raises:
        StoreError: bad database url.
        StoreNotReady: database unreachable or not migrated to head.
    """
    engine = make_engine(settings.database_url)
    try:
        await check_ready(engine)
        return await run_retention(make_sessionmaker(engine), settings, delete_raw=delete_raw)
    finally:
        await engine.dispose()
