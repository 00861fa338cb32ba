"""Retention: delete raw calls and attempts older than ``retention_s``, once their hour is rolled up.

One run (:func:`run_retention`, scheduled every ``rollup_interval_s`` on the lease holder, or
``hedgerow db retention``):

1. :func:`hedgerow.controller.rollups.fold_hours`: fold every complete hour that changed, old or
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

Re-running is safe at every step: folding recomputes, sealing is conditional, deleting a batch
twice deletes nothing the second time, and an interrupted run resumes where it stopped. Rollups
are kept forever (one row per route and hour: about 9,000 a year per route).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.db import check_ready, make_engine, make_sessionmaker, rowcount
from hedgerow.controller.models import Attempt, Call, HourlyRollup, Route, utc_now
from hedgerow.controller.rollups import (
    HOUR_S,
    FoldedHour,
    floor_hour,
    fold_hours,
    scan_raw_hours,
)

__all__ = ["DeletedHour", "RetentionReport", "delete_folded_raw", "run_retention", "run_retention_once"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeletedHour:
    """Raw rows deleted for one (route, hour), or why none were.

    Attributes:
        route, model: the pair.
        hour_start: start of the hour (aware UTC).
        calls, attempts: rows deleted by this run.
        skipped: None when deleted; else why the hour was kept (``not_folded``: no rollup;
            ``stale_rollup``: raw rows changed since the fold).
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
    """

    now: datetime
    cutoff: datetime
    folded: list[FoldedHour] = field(default_factory=list)
    deleted: list[DeletedHour] = field(default_factory=list)

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
            "folded": [h.to_dict() for h in self.folded],
            "deleted": [h.to_dict() for h in self.deleted],
        }


def _in_hour(route_id: int, hour_start: datetime) -> list[Any]:
    return [Call.route_id == route_id, Call.started_at >= hour_start,
            Call.started_at < hour_start + timedelta(seconds=HOUR_S)]  # fmt: skip


async def _seal(
    sessionmaker: async_sessionmaker[AsyncSession], route_id: int, hour_start: datetime, now: datetime
) -> int | None:
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
        attempts += rowcount(gone_attempts)
        calls += rowcount(gone_calls)
        if len(ids) < batch_rows:
            return calls, attempts


async def delete_folded_raw(
    sessionmaker: async_sessionmaker[AsyncSession], *, cutoff: datetime, batch_rows: int, now: datetime | None = None
) -> list[DeletedHour]:
    """Delete the raw calls and attempts of every whole hour before ``cutoff`` that is rolled up.

    Args:
        sessionmaker: from :func:`hedgerow.controller.db.make_sessionmaker`.
        cutoff: a whole UTC hour (aware); hours starting before it are eligible.
        batch_rows: most calls deleted per transaction (>= 1).
        now: stored as the rollups' ``sealed_at`` (default: now).

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
        max_call_id = await _seal(sessionmaker, rid, hour, now)
        if max_call_id is None:
            async with sessionmaker() as session:
                exists = await session.scalar(
                    select(func.count()).where(HourlyRollup.route_id == rid, HourlyRollup.hour_start == hour)
                )
            done.append(DeletedHour(route, model, hour, 0, 0, "stale_rollup" if exists else "not_folded"))
            continue
        calls, attempts = await _delete_sealed(sessionmaker, rid, hour, max_call_id, batch_rows)
        done.append(DeletedHour(route, model, hour, calls, attempts))
    return done


async def run_retention(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Any,
    *,
    now: datetime | None = None,
    delete_raw: bool = True,
) -> RetentionReport:
    """Fold every changed complete hour, then delete raw rows older than ``settings.retention_s``.

    Args:
        sessionmaker: from :func:`hedgerow.controller.db.make_sessionmaker`.
        settings: a ``hedgerow.settings.Settings`` (``retention_s``, ``retention_batch_rows``).
        now: the run's time (aware UTC; default: now).
        delete_raw: False folds only.

    Returns:
        A :class:`RetentionReport`.

    Raises:
        ValueError: ``now`` is naive.
        StoreError: a stored rollup uses another histogram scheme.
    """
    now = utc_now() if now is None else now
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    now = now.astimezone(UTC)
    cutoff = floor_hour(now - timedelta(seconds=settings.retention_s))
    folded = await fold_hours(sessionmaker, now=now)
    deleted: list[DeletedHour] = []
    if delete_raw:
        deleted = await delete_folded_raw(
            sessionmaker, cutoff=cutoff, batch_rows=settings.retention_batch_rows, now=now
        )
    report = RetentionReport(now=now, cutoff=cutoff, folded=folded, deleted=deleted)
    if folded or deleted:
        log.info("retention: folded %d hour(s), deleted %d call(s) and %d attempt(s) before %s",
                 len(folded), report.deleted_calls, report.deleted_attempts, cutoff.isoformat())  # fmt: skip
    return report


async def run_retention_once(settings: Any, *, delete_raw: bool = True) -> RetentionReport:
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
