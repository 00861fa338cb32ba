"""Ingest of call records: a batch of records becomes rows of ``calls`` and ``attempts``.

Idempotent by ``request_id``: a record whose id is already stored (or appears earlier in the same
batch) is counted as a duplicate and not written. Correct under concurrent batches on both SQLite
and PostgreSQL: every insert of a call is ``INSERT ... ON CONFLICT DO NOTHING``, so two batches
racing on the same id or on a new route never fail and never double count. Rows are written in a
sorted order (routes by (route, model), calls by request_id) so that concurrent PostgreSQL
transactions wait on each other instead of deadlocking.

Each table is written with one statement per batch, compiled once per process:

- SQLite: one driver-level ``executemany`` of ``INSERT ... ON CONFLICT (request_id) DO
  NOTHING`` for the calls, one read of the ids it created (the newest rowids: only the largest
  when every call was new, see :func:`_write_sqlite`), one ``executemany`` for their attempts;
  the rows are built with their timestamps already in the text SQLite stores (one pass, no
  second copy of the rows);
- PostgreSQL: binary ``COPY`` of the calls into a session-local staging table, one statement
  that moves them out of it, inserts their ``request_id`` into ``call_request_ids`` (``ON
  CONFLICT DO NOTHING RETURNING``: the unique key, ``calls`` being partitioned by day) and
  inserts into ``calls`` the records whose id it inserted, returning their ids; then ``COPY`` of
  the new calls' attempts straight into ``attempts``. A batch with a day that has no partition
  yet creates it first, in the batch's transaction before anything else is written
  (:mod:`hedgerow.controller.store.partitions`); with a :class:`DayPartitionCache` only the days it
  does not trust are looked up in the catalog. Every batch holds :data:`INGEST_LOCK` shared to
  its commit, so that the fold can wait for the calls in flight
  (:func:`hedgerow.controller.store.rollups.fold_hours`).

Last, in the same transaction, the calls inserted are counted into the per-(route, minute)
aggregates the controller's tick reads (:mod:`hedgerow.controller.store.minute_store`): only those
inserted, so a re-posted record is counted once; a rolled-back batch counts nothing.

A batch naming an archived route (``routes.archived_at`` set by an operator,
:mod:`hedgerow.controller.routes_admin`) is refused whole (:class:`RouteArchived`), so a client
still sending it does not bring it back; archived routes do not count against ``max_routes``.
The mark is read with the route ids (:func:`ensure_routes`), so a batch whose pairs are all in
the :class:`RouteIdCache` reads no route: a route archived through another process is refused
once this process's cache has started again (:data:`ROUTE_ID_MAX_AGE_S`).

Records are any objects with the wire format's attributes (:class:`RecordFields`): the client's
:class:`~hedgerow.client.records.CallRecord`, or the api's validated pydantic schema as it is,
so a batch posted to the api is never copied into a second object per record. Route ids are
looked up in a :class:`RouteIdCache` first; only pairs it does not know are read (or created).

With :class:`~hedgerow.controller.store.cpu_turns.CpuTurns` (the api's ingest gate on
PostgreSQL), the CPU-heavy steps (building the rows, counting the minutes) run within its turns
in slices of :data:`ROW_SLICE` records, and each ``COPY`` pauses every :data:`COPY_SLICE` rows,
with the event loop free between slices; without, each step runs in one go.

Measured by ``bench/ingest.py``; the figures are in the README's "Benchmarks".
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from hedgerow.client.records import estimate_prompt_tokens
from hedgerow.controller.errors import StoreError
from hedgerow.controller.policy.route_config import RouteConfig
from hedgerow.controller.store._ingest_routes import (
    ROUTE_ID_MAX_AGE_S,
    RouteIdCache,
    check_route_limits,
    ensure_routes,
    route_defaults,
)
from hedgerow.controller.store.cpu_turns import CpuTurns, cpu_turn, pause
from hedgerow.controller.store.minute_store import add_records
from hedgerow.controller.store.models import Call, utc_now
from hedgerow.controller.store.partitions import (
    DayPartitionCache,
    DayPartitionMissing,
    day_of,
    ensure_day_partitions,
    missing_days,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "ATTEMPT_COLUMNS",
    "CALL_COLUMNS",
    "INGEST_LOCK",
    "ROUTE_ID_MAX_AGE_S",
    "AttemptFields",
    "RecordFields",
    "RouteIdCache",
    "check_route_limits",
    "ensure_routes",
    "ingest_calls",
    "route_defaults",
]

#: Records per slice of a CPU-heavy step run with :class:`CpuTurns` (a millisecond or two).
ROW_SLICE = 200
#: PostgreSQL, with :class:`CpuTurns`: rows a ``COPY`` encodes between two pauses (see :func:`_copy`).
COPY_SLICE = 250
#: PostgreSQL: key of the transaction-scoped advisory lock every ingest batch holds shared
#: ("hedgeing"); the fold takes it exclusively for a moment to learn which call ids are committed.
INGEST_LOCK = 0x6865646765696E67 & 0x7FFFFFFFFFFFFFFF


class AttemptFields(Protocol):
    """What ingest reads of one attempt (the wire format's names; seconds from the call's start)."""

    @property
    def upstream(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def start_s(self) -> float: ...
    @property
    def first_token_s(self) -> float | None: ...
    @property
    def end_s(self) -> float: ...
    @property
    def outcome(self) -> str: ...
    @property
    def status_code(self) -> int | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def prompt_tokens_estimated(self) -> bool: ...
    @property
    def cached_prompt_tokens(self) -> int | None: ...


class RecordFields(Protocol):
    """What ingest reads of one call record: every field of the wire format (docs/DESIGN.md "CallRecord").

    Satisfied by :class:`hedgerow.client.records.CallRecord` and by the api's
    ``CallRecordIn``; ``started_at`` is an aware UTC datetime.
    """

    @property
    def request_id(self) -> str: ...
    @property
    def route(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def started_at(self) -> datetime: ...
    @property
    def client(self) -> str | None: ...
    @property
    def hedge_after_s(self) -> float | None: ...
    @property
    def threshold_version(self) -> int | None: ...
    @property
    def hedged(self) -> bool: ...
    @property
    def hedge_reason(self) -> str | None: ...
    @property
    def hedge_denied(self) -> bool: ...
    @property
    def failover_denied(self) -> bool: ...
    @property
    def winner(self) -> str | None: ...
    @property
    def status(self) -> str: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def ttfo_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float | None: ...
    @property
    def max_itl_s(self) -> float | None: ...
    @property
    def prompt_tokens(self) -> int | None: ...
    @property
    def completion_tokens(self) -> int | None: ...
    @property
    def wasted_completion_tokens(self) -> int: ...
    @property
    def api(self) -> str: ...
    @property
    def attempts(self) -> Sequence[AttemptFields]: ...


#: Columns of ``calls`` written by ingest, in the order of the rows built for them.
CALL_COLUMNS: tuple[str, ...] = (
    "request_id", "route_id", "started_at", "received_at", "client", "hedge_after_s",
    "threshold_version", "hedged", "hedge_reason", "hedge_denied", "failover_denied", "winner",
    "status", "error_type", "ttft_s", "ttfo_s", "tpot_s", "e2e_s", "max_itl_s", "prompt_tokens",
    "completion_tokens", "wasted_completion_tokens", "api",
)  # fmt: skip
#: Where a ``calls`` row holds its ``started_at``.
_STARTED_AT = CALL_COLUMNS.index("started_at")
#: Columns of ``attempts`` written by ingest, in the order of the rows built for them.
ATTEMPT_COLUMNS: tuple[str, ...] = (
    "call_id", "attempt_index", "upstream", "role", "start_s", "first_token_s", "end_s", "outcome",
    "status_code", "error_type", "completion_tokens", "prompt_tokens", "prompt_tokens_estimated",
    "cached_prompt_tokens", "call_started_at",
)  # fmt: skip

_CALLS = Call.metadata.tables["calls"]
#: The SQLite statements (driver-level ``executemany``: the rows are bound as they are; their
#: timestamps were converted when the rows were built, see :func:`_sqlite_stamp`).
_SQLITE_INSERT_CALLS = (
    f"INSERT INTO calls ({', '.join(CALL_COLUMNS)}) VALUES ({', '.join('?' * len(CALL_COLUMNS))}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
_SQLITE_NEW_CALLS = "SELECT request_id, id FROM calls WHERE id > (SELECT max(id) FROM calls) - ?"
_SQLITE_LAST_CALL = "SELECT max(id) FROM calls"
_SQLITE_INSERT_ATTEMPTS = (
    f"INSERT INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})"
)

_PG_LOCK = f"SELECT pg_advisory_xact_lock_shared({INGEST_LOCK})"
#: The PostgreSQL staging table: session-local, the columns of ``calls`` that ingest writes.
_PG_STAGE = "hedgerow_ingest_calls"
_PG_STAGE_DDL = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_PG_STAGE} AS SELECT {', '.join(CALL_COLUMNS)} FROM calls WITH NO DATA"
)
#: One statement: empty the staging table, claim each request id in ``call_request_ids`` (in
#: sorted order: concurrent batches wait for each other instead of deadlocking; an id claimed by
#: a transaction still in flight waits for it, then counts as a duplicate), insert the calls
#: whose id this batch claimed, return their ids.
_PG_MERGE = (
    f"WITH staged AS (DELETE FROM {_PG_STAGE} RETURNING *), "
    "claimed AS (INSERT INTO call_request_ids (request_id, started_at) "
    "SELECT request_id, started_at FROM staged ORDER BY request_id "
    "ON CONFLICT (request_id) DO NOTHING RETURNING request_id), "
    f"written AS (INSERT INTO calls ({', '.join(CALL_COLUMNS)}) "
    f"SELECT {', '.join('s.' + name for name in CALL_COLUMNS)} FROM staged s JOIN claimed USING (request_id) "
    "ORDER BY s.request_id RETURNING request_id, id) "
    "SELECT request_id, id FROM written"
)


#: How a timestamp is bound: as it is (PostgreSQL), or as the text SQLite stores.
_Stamp = Callable[[datetime], Any]


def _as_is(moment: datetime) -> datetime:
    return moment


def _call_row(record: RecordFields, route_id: int, received_at: Any, stamp: _Stamp) -> tuple[Any, ...]:
    """The ``calls`` row of a record, in :data:`CALL_COLUMNS` order (``received_at`` already stamped)."""
    return (
        record.request_id,
        route_id,
        stamp(record.started_at),
        received_at,
        record.client,
        record.hedge_after_s,
        record.threshold_version,
        record.hedged,
        record.hedge_reason,
        record.hedge_denied,
        record.failover_denied,
        record.winner,
        record.status,
        record.error_type,
        record.ttft_s,
        record.ttfo_s,
        record.tpot_s,
        record.e2e_s,
        record.max_itl_s,
        record.prompt_tokens,
        record.completion_tokens,
        record.wasted_completion_tokens,
        record.api,
    )


def _attempt_rows(
    batch: Sequence[RecordFields], call_rows: Sequence[tuple[Any, ...]], call_ids: Mapping[str, int]
) -> list[tuple[Any, ...]]:
    """The ``attempts`` rows of the records written, in :data:`ATTEMPT_COLUMNS` order.

    An attempt without ``prompt_tokens`` (a version 1 record) gets the one estimate rule,
    :func:`hedgerow.client.records.estimate_prompt_tokens`. ``call_rows`` are the batch's
    ``calls`` rows (:func:`_call_row`, in the order of ``batch``): each attempt's
    ``call_started_at`` is its call's ``started_at`` as already bound there.
    """
    rows: list[tuple[Any, ...]] = []
    for record, call_row in zip(batch, call_rows, strict=True):
        call_id = call_ids.get(record.request_id)
        if call_id is None:
            continue
        started_at = call_row[_STARTED_AT]
        for index, attempt in enumerate(record.attempts):
            tokens, estimated = estimate_prompt_tokens(
                attempt.prompt_tokens, attempt.prompt_tokens_estimated, attempt.status_code, record.prompt_tokens
            )
            rows.append(
                (
                    call_id,
                    index,
                    attempt.upstream,
                    attempt.role,
                    attempt.start_s,
                    attempt.first_token_s,
                    attempt.end_s,
                    attempt.outcome,
                    attempt.status_code,
                    attempt.error_type,
                    attempt.completion_tokens,
                    tokens,
                    estimated,
                    attempt.cached_prompt_tokens,
                    started_at,
                )
            )
    return rows


def _sqlite_stamp(connection: AsyncConnection) -> _Stamp:
    """How a timestamp is bound on SQLite: the column type's own bind processing.

    The dialect's implementation of the column type (the zone check and conversion to naive UTC,
    then SQLite's rendering) gives the text SQLite stores, always with microseconds, as every
    other writer of the column does.
    """
    dialect = connection.dialect
    to_text = _CALLS.c.started_at.type.dialect_impl(dialect).bind_processor(dialect)
    if to_text is None:  # pragma: no cover - UTCDateTime always has one on SQLite
        raise StoreError("SQLite: the timestamp column has no bind processor")
    return to_text


async def _write_sqlite(
    connection: AsyncConnection,
    batch: Sequence[RecordFields],
    call_rows: list[tuple[Any, ...]],
) -> dict[str, int]:
    """Write calls and attempts with one ``executemany`` each; returns the new calls' ids.

    SQLite's ``executemany`` cannot return rows, so the new ids are known from their rowids:
    the insert of the calls takes the database's write lock (one writer at a time, held to the
    commit), and while it is held a table with an ``INTEGER PRIMARY KEY`` gives each new row
    ``max(id) + 1`` (SQLite "ROWIDs and the INTEGER PRIMARY KEY"), so the ``n`` rows the
    statement inserted (its row count; conflicts insert nothing) are exactly the ``n`` largest
    ids, given in the order of ``call_rows``. When every row was inserted (no duplicate, the
    usual case) only the largest id is read; otherwise the ``n`` newest rows are.
    """
    result = await connection.exec_driver_sql(_SQLITE_INSERT_CALLS, call_rows)
    inserted = int(result.rowcount)
    if inserted <= 0:
        return {}
    if inserted == len(call_rows):
        last = int((await connection.exec_driver_sql(_SQLITE_LAST_CALL)).scalar_one())
        call_ids = {
            row[0]: call_id for row, call_id in zip(call_rows, range(last - inserted + 1, last + 1), strict=True)
        }
    else:
        rows = await connection.exec_driver_sql(_SQLITE_NEW_CALLS, (inserted,))
        fetched: list[Any] = list(rows.all())
        call_ids = {row[0]: row[1] for row in fetched}
        if len(call_ids) != inserted:  # pragma: no cover - would mean another writer inside our lock
            raise StoreError(f"ingest: {inserted} calls inserted but {len(call_ids)} new ids read back")
    attempt_rows = _attempt_rows(batch, call_rows, call_ids)
    if attempt_rows:
        await connection.exec_driver_sql(_SQLITE_INSERT_ATTEMPTS, attempt_rows)
    return call_ids


async def _rows_in_slices(
    turns: CpuTurns | None, build: Callable[[int, int], list[tuple[Any, ...]]], count: int
) -> list[tuple[Any, ...]]:
    """``build(0, count)`` in one go without ``turns``; with them, within a turn, a slice of
    :data:`ROW_SLICE` records at a time with a pause between slices."""
    if turns is None:
        return build(0, count)
    rows: list[tuple[Any, ...]] = []
    async with cpu_turn(turns):
        for start in range(0, count, ROW_SLICE):
            await pause()
            rows.extend(build(start, min(count, start + ROW_SLICE)))
    return rows


async def _copy(
    driver: Any, table: str, rows: list[tuple[Any, ...]], columns: Sequence[str], turns: CpuTurns | None
) -> None:
    """Binary ``COPY`` of ``rows`` into ``table``, one statement. Without ``turns`` the driver
    encodes every row in one go; with them it takes the rows from an async iterator that pauses
    to the event loop every :data:`COPY_SLICE` rows (:func:`_paced`)."""
    records: Any = rows if turns is None else _paced(rows, COPY_SLICE)
    await driver.copy_records_to_table(table, records=records, columns=columns)


async def _paced(rows: list[tuple[Any, ...]], step: int) -> AsyncIterator[tuple[Any, ...]]:
    """``rows`` one by one, with a pause to the event loop before each further ``step`` of them."""
    for start in range(0, len(rows), step):
        if start:
            await pause()
        for row in rows[start : start + step]:
            yield row


async def _write_postgresql(
    connection: AsyncConnection,
    batch: Sequence[RecordFields],
    call_rows: list[tuple[Any, ...]],
    turns: CpuTurns | None = None,
) -> dict[str, int]:
    """Write calls through a COPY to the staging table and one merge, attempts by COPY; returns new ids.

    The lock and the DDL go through SQLAlchemy first, which opens the session's transaction on
    the connection, so the driver-level COPYs run inside it (a rollback leaves nothing behind).

    Raises:
        DayPartitionMissing: a row's day has no partition (dropped since it was checked or
            cached); roll the transaction back.
    """
    await connection.exec_driver_sql(_PG_LOCK)
    await connection.exec_driver_sql(_PG_STAGE_DDL)
    raw = await connection.get_raw_connection()
    driver = raw.driver_connection
    if driver is None:  # pragma: no cover - an open pooled connection always has its driver connection
        raise StoreError("the PostgreSQL connection has no driver connection")
    await _copy(driver, _PG_STAGE, call_rows, CALL_COLUMNS, turns)
    try:
        call_ids = {row[0]: row[1] for row in await driver.fetch(_PG_MERGE)}
        attempt_rows = await _rows_in_slices(
            turns, lambda i, j: _attempt_rows(batch[i:j], call_rows[i:j], call_ids), len(batch)
        )
        if attempt_rows:
            await _copy(driver, "attempts", attempt_rows, ATTEMPT_COLUMNS, turns)
    except Exception as exc:
        if _is_missing_partition(exc):
            raise DayPartitionMissing(f"ingest: {str(exc).splitlines()[0]}") from exc
        raise
    return call_ids


def _is_missing_partition(exc: BaseException) -> bool:
    """Whether a driver error is PostgreSQL refusing a row no partition takes (SQLSTATE 23514)."""
    return getattr(exc, "sqlstate", None) == "23514" and "no partition" in str(exc)


async def ingest_calls(
    session: AsyncSession,
    records: Sequence[RecordFields],
    *,
    defaults: RouteConfig,
    stored: list[Any] | None = None,
    max_routes: int | None = None,
    max_models_per_route: int | None = None,
    route_ids: RouteIdCache | None = None,
    resolved: dict[tuple[str, str], int] | None = None,
    partition_days: DayPartitionCache | None = None,
    checked_days: set[date] | None = None,
    turns: CpuTurns | None = None,
) -> tuple[int, int]:
    """Write a batch of call records (and their attempts) into the store.

    Everything happens inside the session's transaction; the caller commits (or rolls back), so
    the batch is stored entirely or not at all. Routes seen for the first time are created with
    ``defaults``.

    Args:
        session: an open :class:`AsyncSession`.
        records: the batch (:class:`RecordFields`: a ``CallRecord`` or the api's validated
            ``CallRecordIn``), any length (0 is fine).
        defaults: configuration of routes created by this batch (see :func:`route_defaults`).
        stored: when given, the records written (not the duplicates) are appended to it (e.g. for
            the api's metrics, which count each record once).
        max_routes, max_models_per_route: bounds on the routes a batch may create (None:
            unbounded; see :func:`check_route_limits`).
        route_ids: ids known from earlier batches; pairs found there are neither read nor
            checked against the bounds (they exist). Not changed here.
        resolved: when given, receives every (route, model) id of the batch; hand it to
            ``route_ids.add`` once the transaction committed.
        partition_days: PostgreSQL: days known to have partitions; the days it trusts are not
            looked up (without it every day of the batch is). Not changed here.
        checked_days: when given, receives the days looked up (and made if missing) in this
            transaction; hand them to ``partition_days.add`` once it committed.
        turns: when given, the CPU-heavy steps (building rows, minute counts) run within its
            turns, in slices of :data:`ROW_SLICE` records with a pause to the event loop
            between them (:mod:`hedgerow.controller.store.cpu_turns`); None: each in one go.

    Returns:
        ``(accepted, duplicates)``: records written, and records skipped because their
        ``request_id`` was already stored or repeated earlier in the batch.

    Raises:
        RouteLimitExceeded: the batch would create a route past a bound; nothing was written.
        RouteArchived: a record names an archived route (the first such pair in (route, model)
            order); nothing was written.
        DayPartitionMissing: PostgreSQL: a day of the batch had no partition when written (one
            trusted from ``partition_days`` and dropped since); roll back, forget the cached
            days and run the batch again.
        StoreError: a dialect other than SQLite and PostgreSQL.
    """
    unique: dict[str, RecordFields] = {}
    for record in records:
        unique.setdefault(record.request_id, record)
    duplicates = len(records) - len(unique)
    if not unique:
        return 0, duplicates
    batch = [unique[key] for key in sorted(unique)]
    connection = await session.connection()
    dialect = connection.dialect.name
    if dialect == "postgresql":
        # before any route is written: see "Deadlocks" in hedgerow.controller.store.partitions
        days = {day_of(r.started_at) for r in batch}
        look_up = sorted(days) if partition_days is None else partition_days.unknown(days, now=utc_now())
        if look_up and await missing_days(connection, look_up):
            await ensure_day_partitions(connection, look_up)
        if checked_days is not None:
            checked_days.update(look_up)
    pairs = {(r.route, r.model) for r in batch}
    ids, missing = route_ids.lookup(pairs) if route_ids is not None else ({}, list(pairs))
    if missing:
        ids.update(
            await ensure_routes(
                session, missing, defaults, max_routes=max_routes, max_models_per_route=max_models_per_route
            )
        )
    if resolved is not None:
        resolved.update(ids)
    if dialect not in ("postgresql", "sqlite"):
        raise StoreError(f"unsupported database dialect {dialect!r}: use SQLite or PostgreSQL")
    stamp = _as_is if dialect == "postgresql" else _sqlite_stamp(connection)
    received_at = stamp(utc_now())
    call_rows = await _rows_in_slices(
        turns,
        lambda i, j: [_call_row(r, ids[(r.route, r.model)], received_at, stamp) for r in batch[i:j]],
        len(batch),
    )
    if dialect == "postgresql":
        call_ids = await _write_postgresql(connection, batch, call_rows, turns)
    else:
        call_ids = await _write_sqlite(connection, batch, call_rows)
    if call_ids:  # the calls this batch inserted, into the tick's minute aggregates
        inserted = [(ids[(r.route, r.model)], r) for r in batch if r.request_id in call_ids]
        await add_records(connection, inserted, turns=turns)
    accepted = len(call_ids)
    if stored is not None:
        stored.extend(record for record in batch if record.request_id in call_ids)
    return accepted, duplicates + (len(batch) - accepted)
