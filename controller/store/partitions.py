"""Day partitions of ``calls`` and ``attempts`` on PostgreSQL, and why ingest dedups the way it does.

SQLite keeps plain tables; everything here is PostgreSQL only (migration 0010 converts a store).

Layout
------
``calls`` is partitioned by range of ``started_at`` and ``attempts`` by range of
``call_started_at`` (the call's ``started_at``, copied into each attempt), one partition per UTC
day: ``calls_p20261202`` holds ``[2026-12-02 00:00Z, 2026-12-03 00:00Z)``. A call and its
attempts are always in the same day, so retention drops a day of both with two ``DROP TABLE``\\ s
instead of deleting rows one by one (no dead tuples, no vacuum debt, no long delete transaction).

Foreign keys
------------
PostgreSQL can point a foreign key at a partitioned table only through a unique constraint that
includes the partition key, and detaching or dropping a partition of the referenced table then
checks the whole referencing table (measured: 3.3 s for a 1M-row day against 1M other rows,
under an ``ACCESS EXCLUSIVE`` lock on the parent, i.e. every ingest stalled). Attaching a
partition to either side of such a key also takes a lock that waits for every ingest in flight.
So the key is made **per day**: each ``attempts_pD`` has ``FOREIGN KEY (call_id) REFERENCES
calls_pD (id) ON DELETE CASCADE``, and each ``calls_pD`` its own primary key ``(id)``. It is as
strict as the old key for every row (an attempt cannot name a call that is not stored, in its
day), creating a day locks nothing that ingest holds (``ATTACH PARTITION`` takes ``SHARE UPDATE
EXCLUSIVE`` on the parent), and dropping a day checks nothing: ``attempts_pD`` goes first, then
``calls_pD``, which nothing else references. ``calls.route_id -> routes`` stays on the parent.

Idempotency by ``request_id``
-----------------------------
A unique constraint of a partitioned table must include the partition key, so ``calls`` cannot
keep ``request_id`` unique by itself: ``(request_id, started_at)`` would let a re-posted record
whose ``started_at`` differs (another clock, another day) be stored twice. Weighed:

1. ``UNIQUE (request_id, started_at)``: free, but wrong for exactly that case. Refused.
2. A non-unique index on ``calls.request_id`` plus a look-up before insert, serialised by
   advisory locks on the ids' hashes: dedup rows disappear with their partitions (no pruning),
   but every record probes the index of every retained day (14+ probes each at the default
   retention) and a 1,000-record batch takes up to 1,000 locks (``max_locks_per_transaction``
   is 64 per connection by default: out of shared memory under load). Refused.
3. Rotating unpartitioned dedup tables (one per week, truncated when expired): cheap pruning,
   but a record written to the old generation by a transaction still in flight is invisible to
   one checking it from the new generation: concurrent re-posts around a rotation double count.
   Refused.
4. **A small unpartitioned table** ``call_request_ids (request_id PRIMARY KEY, started_at)``
   written by the same statement that inserts the calls (a data-modifying CTE: ``INSERT INTO
   call_request_ids ... ON CONFLICT DO NOTHING RETURNING request_id`` feeds ``INSERT INTO calls``
   only the ids it inserted). Chosen. The primary key is the arbiter, so it is exactly as
   correct as the old unique constraint: a second transaction inserting an id that a first one
   has inserted but not committed waits for it and then skips the record, whatever its
   ``started_at``; ids are inserted in sorted order, so concurrent batches wait rather than
   deadlock. Its cost is one narrow row and one b-tree entry per call, and its rows must be
   deleted (they are not dropped with a partition): retention deletes, in bounded batches, the
   rows older than the oldest day still stored (a BRIN index on ``started_at`` finds them),
   after dropping the days, so a request id is remembered as long as its call is stored.

What is accepted, and when partitions are made
----------------------------------------------
The api refuses (422, field ``started_at``) a record that started more than
``HEDGEROW_RETENTION_S`` ago (the store would delete it at once; it would also need a partition
for a day retention already dropped) or more than a day ahead of the server's clock (the
schema's rule), so only days in ``[today - retention, today + 1]`` can be needed by the api.
Partitions are made

* **ahead of need** by every retention run on the lease holder (hourly): yesterday to
  :data:`DAYS_AHEAD` days ahead, and by migration 0010 for today onwards;
* **on demand** by ingest, for a batch that has a day without one (a late record, an odd
  clock): a catalog look-up finds the missing days, and they are created in the batch's own
  transaction before anything else is written, under a transaction-scoped advisory lock
  (:data:`PARTITION_LOCK`) so that concurrent creators of a day wait for each other instead of
  failing. Creating tables inside the batch means a rolled-back batch leaves no partition.

The api does not look the days up for every batch: each ``serve`` process keeps the days it
has seen exist in a :class:`DayPartitionCache` (learnt after the batch committed, so a day made
by a rolled-back batch is never cached). Only a day that is not cached costs the catalog
look-up, whichever process made it. A cached day is trusted only while it ends after ``now -
retention_s``: retention drops a day only once it ended ``retention_s`` + :data:`DROP_GRACE_S`
ago, so it cannot have dropped a trusted day. A day dropped some other way (by hand, or by a
process with a shorter retention) makes the batch fail with :class:`DayPartitionMissing`,
nothing written; the api then forgets every cached day and runs the batch once more, which
looks the days up and makes the missing one.

Deadlocks
---------
Attaching a partition to ``calls`` clones the parent's key to ``routes`` and so waits for any
transaction that inserted a route. Ingest therefore creates missing days *before* it creates
routes: a batch that creates a day holds no lock on ``routes`` yet, and one that holds a lock on
``routes`` creates no day, so the two never wait on each other in a cycle. Retention's drop locks
``calls`` before ``attempts``, the order in which ingest writes them.

Direct callers of :func:`hedgerow.controller.store.ingest.ingest_calls` (benchmarks, tests) are not
bounded: any day gets its partition.

Retention drops a day once the whole day ended ``HEDGEROW_RETENTION_S`` plus
:data:`DROP_GRACE_S` ago and every (route, hour) of it is folded into a rollup that counts all its
rows (see :mod:`hedgerow.controller.store.retention`); the grace keeps the drop clear of a batch that
the api validated just before the cutoff moved past its day.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from hedgerow.controller.errors import StoreError

__all__ = [
    "DAYS_AHEAD",
    "DROP_GRACE_S",
    "PARTITIONED_TABLES",
    "PARTITION_LOCK",
    "DayPartitionCache",
    "DayPartitionMissing",
    "day_bounds",
    "day_of",
    "ensure_day_partitions",
    "is_partition_name",
    "missing_days",
    "partition_days",
    "partition_ddl",
    "partition_name",
]

#: Partitioned tables and their partition key columns.
PARTITIONED_TABLES: dict[str, str] = {"calls": "started_at", "attempts": "call_started_at"}
#: Days after today whose partitions every retention run makes sure exist.
DAYS_AHEAD = 3
#: Extra seconds a day waits, after its end + retention, before its partitions may be dropped.
DROP_GRACE_S = 3600.0
#: Key of the transaction-scoped advisory lock held while creating partitions ("hedgepart").
PARTITION_LOCK = 0x6865646770617274 & 0x7FFFFFFFFFFFFFFF

_NAME = re.compile(r"^(calls|attempts)_p(\d{8})$")


def day_of(moment: datetime) -> date:
    """The UTC day of an aware datetime.

    Raises:
        ValueError: ``moment`` is naive.
    """
    if moment.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware (UTC); got a naive datetime")
    return moment.astimezone(UTC).date()


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """``[start, end)`` of a UTC day, as aware datetimes."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start, start + timedelta(days=1)


def partition_name(table: str, day: date) -> str:
    """``calls_p20261202``: the partition of ``table`` (``calls`` or ``attempts``) for ``day``.

    Raises:
        ValueError: ``table`` is not partitioned.
    """
    if table not in PARTITIONED_TABLES:
        raise ValueError(f"table {table!r} is not partitioned (only {', '.join(PARTITIONED_TABLES)})")
    return f"{table}_p{day:%Y%m%d}"


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is the name of a day partition (``calls_pYYYYMMDD``, ``attempts_pYYYYMMDD``)."""
    return _NAME.match(name) is not None


def partition_ddl(day: date) -> list[str]:
    """The statements that create and attach the ``calls`` and ``attempts`` partitions of ``day``.

    Each table is created on its own, given its keys, then attached (``SHARE UPDATE EXCLUSIVE`` on
    the parent: ingest in flight neither blocks it nor is blocked). Attaching scans the new,
    empty table only. The partitioned index ``(route_id, started_at)`` and the key to ``routes``
    are added to ``calls_pD`` by the attach.
    """
    start, end = day_bounds(day)
    bounds = f"FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
    calls, attempts = partition_name("calls", day), partition_name("attempts", day)
    return [
        f"CREATE TABLE {calls} (LIKE calls INCLUDING DEFAULTS)",
        f"ALTER TABLE {calls} ADD CONSTRAINT pk_{calls} PRIMARY KEY (id)",
        f"ALTER TABLE calls ATTACH PARTITION {calls} FOR VALUES {bounds}",
        f"CREATE TABLE {attempts} (LIKE attempts INCLUDING DEFAULTS)",
        f"ALTER TABLE {attempts} ADD CONSTRAINT pk_{attempts} PRIMARY KEY (id), "
        f"ADD CONSTRAINT uq_{attempts}_call_id_attempt_index UNIQUE (call_id, attempt_index), "
        f"ADD CONSTRAINT fk_{attempts}_call_id_{calls} FOREIGN KEY (call_id) REFERENCES {calls} (id) "
        "ON DELETE CASCADE",
        f"ALTER TABLE attempts ATTACH PARTITION {attempts} FOR VALUES {bounds}",
    ]


async def partition_days(connection: AsyncConnection) -> list[date]:
    """The days that have a ``calls`` partition attached, oldest first."""
    rows = await connection.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'calls'::regclass"
        )
    )
    days = []
    for (name,) in rows.all():
        match = _NAME.match(name)
        if match:
            days.append(datetime.strptime(match.group(2), "%Y%m%d").date())
    return sorted(days)


async def missing_days(connection: AsyncConnection, days: Iterable[date]) -> list[date]:
    """Of ``days``, those without a ``calls`` or an ``attempts`` partition (one catalog query)."""
    wanted = sorted(set(days))
    if not wanted:
        return []
    names = [partition_name(table, day) for day in wanted for table in PARTITIONED_TABLES]
    rows = await connection.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent IN ('calls'::regclass, 'attempts'::regclass) AND c.relname = ANY(:names)"
        ),
        {"names": names},
    )
    present = {name for (name,) in rows.all()}
    return [day for day in wanted if any(partition_name(t, day) not in present for t in PARTITIONED_TABLES)]


async def ensure_day_partitions(connection: AsyncConnection, days: Iterable[date]) -> list[date]:
    """Create the ``calls`` and ``attempts`` partitions of every day in ``days`` that lacks them.

    Runs in the connection's transaction (the caller commits): takes :data:`PARTITION_LOCK`
    (held to the end of the transaction, so concurrent creators wait, then find the day made),
    looks the days up again, and creates the missing ones. Safe to re-run.

    Args:
        connection: a connection to a PostgreSQL store at revision 0010 or later.
        days: UTC days, any order, repeats allowed.

    Returns:
        The days created (oldest first); empty when all existed.

    Raises:
        sqlalchemy.exc.DBAPIError: from the database (e.g. a table of that name that is not a
            partition: a store edited by hand).
    """
    wanted = sorted(set(days))
    if not wanted or not await missing_days(connection, wanted):
        return []
    await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK})
    created = []
    for day in await missing_days(connection, wanted):
        for statement in partition_ddl(day):
            await connection.exec_driver_sql(statement)
        created.append(day)
    return created


class DayPartitionMissing(StoreError):
    """A row of a batch had no partition for its day, though the day was believed to exist.

    Raised by ingest when a day trusted from a :class:`DayPartitionCache` was dropped meanwhile
    (PostgreSQL refuses the row: SQLSTATE 23514, "no partition of relation ... found for
    row"). The batch's transaction is unusable and must be rolled back (nothing of it is
    written); forget the cached days and run the batch again.
    """


class DayPartitionCache:
    """The UTC days whose ``calls`` and ``attempts`` partitions are known to exist, kept by one process.

    Learns days only once the transaction that found or made them committed (:meth:`add`).
    :meth:`unknown` trusts a known day only while it ends after ``now - retention_s``: older
    days may be dropped by retention at any time (see the module docstring), so they are
    looked up every time.

    Args:
        retention_s: the store's ``HEDGEROW_RETENTION_S``, seconds, > 0.
        max_days: most days kept (the days a store can need are about ``retention_s`` / 1 day
            plus :data:`DAYS_AHEAD`); past it the cache starts again empty.

    Raises:
        ValueError: ``retention_s`` <= 0 or ``max_days`` < 1.
    """

    def __init__(self, retention_s: float, max_days: int = 1000) -> None:
        if not retention_s > 0:
            raise ValueError(f"retention_s: must be > 0 seconds, got {retention_s!r}")
        if max_days < 1:
            raise ValueError(f"max_days: must be >= 1, got {max_days!r}")
        self._retention = timedelta(seconds=retention_s)
        self._max_days = max_days
        self._days: set[date] = set()

    def __len__(self) -> int:
        """Days known."""
        return len(self._days)

    def unknown(self, days: Iterable[date], *, now: datetime) -> list[date]:
        """Of ``days``, those to look up: not known, or ending at or before ``now - retention_s``.

        Args:
            days: UTC days, any order, repeats allowed.
            now: the current time (aware).

        Returns:
            The days to look up, oldest first (empty: every day is trusted).
        """
        horizon = now - self._retention
        return sorted({day for day in days if day not in self._days or day_bounds(day)[1] <= horizon})

    def add(self, days: Iterable[date]) -> None:
        """Remember days that exist (call only after the transaction that checked them committed)."""
        new = set(days) - self._days
        if len(self._days) + len(new) > self._max_days:
            self._days.clear()
        self._days.update(new)

    def forget(self) -> None:
        """Forget every day (after :class:`DayPartitionMissing`)."""
        self._days.clear()
