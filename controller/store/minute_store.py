"""Writes of ``minute_aggregates``: ingest's additions, retention's deletes (I/O over :mod:`minute_counts`).

Ingest (:func:`add_records`) adds the calls a batch inserted, in the batch's transaction, so a
call is counted exactly when it is stored (a re-posted record inserts nothing and adds nothing;
a batch rolled back leaves no count). Each (route, minute) row is read, summed in Python and
written back, which two writers may not do at once:

- SQLite: ingest has already written the calls, so the transaction holds the database's write
  lock: one read of the rows the batch touches, then one ``executemany`` upsert with the sums;
- PostgreSQL: (1) ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` of every (route, minute) in
  sorted order with this batch's counts: the rows it creates are done (a key another transaction
  is inserting waits for it); (2) the others are locked ``SELECT ... FOR UPDATE`` in the same
  sorted order, (3) summed and updated. Every writer takes row locks in one order, so two ingest
  processes wait for each other instead of deadlocking, and none overwrites another's sum. A
  row deleted between (1) and (2) (retention, for a call older than ``max_window_s``) goes
  round again.

Retention (:func:`prune_minutes`) deletes the rows older than the tick's widest window.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from hedgerow.controller.errors import StoreError
from hedgerow.controller.policy.minute_counts import (
    CallSamples,
    MinuteCounts,
    call_samples,
    count_minutes,
    first_samples,
    merge_many,
    minute_index,
)
from hedgerow.controller.store.cpu_turns import CpuTurns, cpu_turn, pause
from hedgerow.controller.store.db import WriteFence, rowcount
from hedgerow.controller.store.models import MinuteAggregate

__all__ = ["COLUMNS", "add_minutes", "add_records", "merged_rows", "prune_minutes", "record_samples"]

#: Columns of ``minute_aggregates``, in the order of the rows written.
COLUMNS: tuple[str, ...] = (
    "route_id", "minute_index", "calls", "hedged", "backup_wins", "denied", "wanted", "histograms",
)  # fmt: skip
#: Keys per SQLite read (two bound parameters each).
_KEYS_PER_READ = 400
#: PostgreSQL rounds of insert-then-lock before giving up (only a concurrent delete makes two).
_PG_ROUNDS = 5

_SQLITE_READ = (
    f"SELECT {', '.join(COLUMNS)} FROM minute_aggregates WHERE (route_id, minute_index) IN (VALUES {{values}})"
)
_SQLITE_UPSERT = (
    f"INSERT INTO minute_aggregates ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    "ON CONFLICT (route_id, minute_index) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in COLUMNS[2:])
)
_PG_TYPES = ("bigint", "bigint", "int", "int", "int", "int", "int", "bytea")
_PG_INSERT = (
    f"INSERT INTO minute_aggregates ({', '.join(COLUMNS)}) "
    f"SELECT * FROM unnest({', '.join(f'${i + 1}::{t}[]' for i, t in enumerate(_PG_TYPES))}) ORDER BY 1, 2 "
    "ON CONFLICT (route_id, minute_index) DO NOTHING RETURNING route_id, minute_index"
)
_PG_LOCK = (
    f"SELECT {', '.join('m.' + name for name in COLUMNS)} FROM minute_aggregates m "
    "JOIN unnest($1::bigint[], $2::bigint[]) AS k(route_id, minute_index) USING (route_id, minute_index) "
    "ORDER BY m.route_id, m.minute_index FOR UPDATE OF m"
)
_PG_UPDATE = (
    "UPDATE minute_aggregates m SET "
    + ", ".join(f"{name} = u.{name}" for name in COLUMNS[2:])
    + f" FROM unnest({', '.join(f'${i + 1}::{t}[]' for i, t in enumerate(_PG_TYPES))}) AS u({', '.join(COLUMNS)}) "
    "WHERE m.route_id = u.route_id AND m.minute_index = u.minute_index"
)

Key = tuple[int, int]


def record_samples(record: Any) -> CallSamples:
    """The :class:`~hedgerow.controller.policy.minute_counts.CallSamples` of a call record (wire fields:
    ``hedge_reason``, ``hedge_denied``, ``winner``, ``ttft_s``, ``attempts`` in order)."""
    primary, backup = first_samples([(a.role, a.start_s, a.first_token_s, a.end_s, a.outcome) for a in record.attempts])
    return call_samples(record.hedge_reason, record.hedge_denied, record.winner, record.ttft_s, primary, backup)


def merged_rows(counts: dict[Key, MinuteCounts], stored: dict[Key, Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The rows to write: each key's stored row (in :data:`COLUMNS` order) plus its counts, sorted.

    Args:
        counts: what to add, per (route_id, minute_index).
        stored: the rows stored now of those keys (missing: none yet).

    Returns:
        Rows in :data:`COLUMNS` order, sorted by key.
    """
    keys = sorted(counts)
    blobs = merge_many(
        [None if (old := stored.get(key)) is None else old[7] for key in keys],
        [(counts[key].keys, counts[key].counts) for key in keys],
    )
    rows: list[tuple[Any, ...]] = []
    for key, blob in zip(keys, blobs, strict=True):
        added = counts[key].counters()
        old = stored.get(key)
        sums = added if old is None else tuple(int(a) + b for a, b in zip(old[2:7], added, strict=True))
        rows.append((*key, *sums, blob))
    return rows


async def _add_sqlite(connection: AsyncConnection, counts: dict[Key, MinuteCounts]) -> None:
    keys = sorted(counts)
    stored: dict[Key, Sequence[Any]] = {}
    for start in range(0, len(keys), _KEYS_PER_READ):
        chunk = keys[start : start + _KEYS_PER_READ]
        sql = _SQLITE_READ.format(values=", ".join(["(?, ?)"] * len(chunk)))
        result = await connection.exec_driver_sql(sql, tuple(v for key in chunk for v in key))
        fetched: list[Any] = list(result.all())
        stored.update({(row[0], row[1]): tuple(row) for row in fetched})
    await connection.exec_driver_sql(_SQLITE_UPSERT, merged_rows(counts, stored))


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)]


async def _add_postgresql(connection: AsyncConnection, counts: dict[Key, MinuteCounts]) -> None:
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    if driver is None:  # pragma: no cover - an open pooled connection always has its driver connection
        raise StoreError("the PostgreSQL connection has no driver connection")
    pending = dict(counts)
    for _ in range(_PG_ROUNDS):
        created = await driver.fetch(_PG_INSERT, *_columns(merged_rows(pending, {})))
        for row in created:
            del pending[(row[0], row[1])]
        if not pending:
            return
        keys = sorted(pending)
        locked = await driver.fetch(_PG_LOCK, [k[0] for k in keys], [k[1] for k in keys])
        stored: dict[Key, Sequence[Any]] = {(row[0], row[1]): tuple(row) for row in locked}
        found = {key: pending.pop(key) for key in keys if key in stored}
        await driver.execute(_PG_UPDATE, *_columns(merged_rows(found, stored)))
        if not pending:
            return
    raise StoreError(f"minute aggregates: {len(pending)} row(s) deleted under every one of {_PG_ROUNDS} rounds")


async def add_minutes(connection: AsyncConnection, counts: dict[Key, MinuteCounts]) -> None:
    """Add counts to their (route, minute) rows in the connection's open transaction.

    Args:
        connection: the ingest transaction's connection (SQLite: its write lock already held).
        counts: ``{(route_id, minute_index): MinuteCounts}``.

    Raises:
        StoreError: a dialect other than SQLite and PostgreSQL.
    """
    if not counts:
        return
    dialect = connection.dialect.name
    if dialect == "postgresql":
        await _add_postgresql(connection, counts)
    elif dialect == "sqlite":
        await _add_sqlite(connection, counts)
    else:
        raise StoreError(f"unsupported database dialect {dialect!r}: use SQLite or PostgreSQL")


#: Records per slice of :func:`add_records`'s counting when it runs within CPU turns.
SAMPLES_SLICE = 200


async def add_records(
    connection: AsyncConnection, records: Iterable[tuple[int, Any]], *, turns: CpuTurns | None = None
) -> None:
    """Count stored call records into their minutes (see the module docstring).

    Args:
        connection: the ingest transaction's connection.
        records: ``(route_id, record)`` of each call the transaction inserted (wire fields).
        turns: when given, the counting runs within one of its turns, the records' samples
            taken :data:`SAMPLES_SLICE` at a time with a pause to the event loop between slices
            (:mod:`hedgerow.controller.store.cpu_turns`); None: in one go.

    Raises:
        ValueError: a negative, NaN or infinite duration (roll the transaction back).
    """
    pairs = list(records)
    async with cpu_turn(turns):
        if turns is None:
            samples = [record_samples(r) for _, r in pairs]
        else:
            samples = []
            for start in range(0, len(pairs), SAMPLES_SLICE):
                await pause()
                samples.extend(record_samples(r) for _, r in pairs[start : start + SAMPLES_SLICE])
        counts = count_minutes([route_id for route_id, _ in pairs], [r.started_at for _, r in pairs], samples)
    await add_minutes(connection, counts)


async def prune_minutes(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    now: datetime,
    max_window_s: float,
    fence: WriteFence | None = None,
) -> int:
    """Delete the aggregates no tick can read any more: minutes that start before ``now -
    max_window_s`` less one minute (the tick reads at most ``max_window_s`` back).

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        now: the run's time (aware UTC).
        max_window_s: the controller's widest window, seconds (``Settings.max_window_s``).
        fence: run last in the deleting transaction (:data:`~hedgerow.controller.store.db.WriteFence`).

    Returns:
        The rows deleted.
    """
    cutoff = minute_index(now - timedelta(seconds=max_window_s)) - 1
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            delete(MinuteAggregate)
            .where(MinuteAggregate.minute_index < cutoff)
            .execution_options(synchronize_session=False)
        )
        if fence is not None:
            await fence(session)
    return rowcount(result)
