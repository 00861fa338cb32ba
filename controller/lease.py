"""A lease row that elects the one process running the scheduled jobs.

The ``leases`` table has one row per lease: ``(name, holder, expires_at)``. A process takes or
renews it with one conditional UPDATE::

    UPDATE leases SET holder = :me, expires_at = :now + :ttl
     WHERE name = :name AND (holder = :me OR expires_at < :now)
    RETURNING name

which succeeds for the current holder, or for anyone once the lease has expired; when no row
exists yet it is created with ``INSERT ... ON CONFLICT (name) DO NOTHING RETURNING name``. A
returned row means "you hold it". Both statements are atomic on SQLite (one writer at a time)
and PostgreSQL (under READ COMMITTED a second concurrent UPDATE waits for the first, then
re-checks its WHERE on the new row and no longer matches), so of two processes racing for a free
or expired lease exactly one wins. Times come from the caller's clock (UTC); keep the replicas'
clocks in sync (NTP) and the TTL well above their skew.

Timing (see :mod:`hedgerow.controller.scheduler`): the holder renews every ``ttl / 3`` and at the
start of every tick; every other replica tries at the same times. If the holder dies at ``k``
(``kill -9``: no release), its lease ends at ``last renewal + ttl <= k + ttl``, and the first tick
job of another replica after that takes the lease and ticks, so ticks resume by
``k + ttl + interval``. Worked number: defaults ``HEDGEROW_LEASE_TTL_S=30``,
``HEDGEROW_CONTROLLER_INTERVAL_S=60``: ticks resume within 30 + 60 = 90 s, under two lease periods
plus one interval (120 s). ``tests/e2e/test_lease_two_serve.py`` runs two ``hedgerow serve``
processes on one PostgreSQL database with ttl 4 s and interval 2 s: one history row per 2 s
while both run, and after SIGKILL of the holder the survivor's first row came 5.1 s later
(bound 4 + 2 = 6 s; the test allows 2 * 4 + 2 = 10 s). A graceful shutdown releases the lease
(:func:`release_lease`), so the hand-over then takes at most one interval.

A holder that cannot renew in time steps down before its lease can pass to another: the
scheduler notes (monotonic clock) when its last successful renewal *started* (the row then says
"valid until that moment + ttl" on this process's clock) and counts itself the holder only for
:data:`LEASE_SAFETY_FRACTION` (3/4) of the TTL after it; past that it starts no tick and
publishes nothing until a renewal succeeds again. The last quarter of the TTL (7.5 s at the
default 30 s) is the margin for what the local clock cannot see: the other replicas judge
expiry by their own wall clocks (skew), and a renewal may commit a little after it started.
Renewals are attempted every ``ttl / 3``, so one renewal may fail outright (or come late) and
the next one, at ``2 ttl / 3``, still lands inside the window.

A tick's publish is also fenced in the database (:func:`check_lease_held`): in the publishing
transaction, after the routes' publish locks, the lease row is read (``FOR SHARE`` on
PostgreSQL; SQLite's write lock is already held) and the transaction is rolled back
(:class:`LeaseLost`) unless this holder still holds it, unexpired. A takeover is an ``UPDATE``
of that row, so it is either committed before the check (which then sees the new holder) or
waits until the publish committed: a stale leader never publishes after another took over.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import cast

from sqlalchemy import Table, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from hedgerow.controller.errors import ControllerError
from hedgerow.controller.store.db import dialect_insert
from hedgerow.controller.store.models import Lease, utc_now

#: The leases table (core statements: no ORM identity map for a row many processes write).
_LEASES = cast(Table, Lease.__table__)

__all__ = [
    "CONTROLLER_LEASE",
    "LEASE_SAFETY_FRACTION",
    "LeaseLost",
    "acquire_lease",
    "check_lease_held",
    "lease_holder",
    "make_holder_id",
    "release_lease",
]

#: Name of the lease of the controller job.
CONTROLLER_LEASE = "controller"
#: Fraction of the TTL, counted from the start of the last successful renewal, during which a
#: holder acts as the holder (see the module docstring for the margin the rest leaves).
LEASE_SAFETY_FRACTION = 0.75


class LeaseLost(ControllerError):
    """This process no longer holds the lease it acted under: what it was about to write is not.

    Attributes:
        lease: the lease's name.
        holder: this process's holder id.
        why: what the check found (e.g. ``"other holds it"``).
    """

    def __init__(self, lease: str, holder: str, why: str) -> None:
        self.lease = lease
        self.holder = holder
        self.why = why
        super().__init__(f"the {lease} lease is no longer held by {holder}: {why}")

    def __reduce__(self) -> tuple[type[LeaseLost], tuple[str, str, str]]:
        """Pickle by the constructor's arguments (it crosses from a tick worker process)."""
        return (type(self), (self.lease, self.holder, self.why))


def make_holder_id() -> str:
    """A holder id unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _now(now: datetime | None) -> datetime:
    if now is None:
        return utc_now()
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    return now.astimezone(UTC)


async def acquire_lease(
    sessionmaker: async_sessionmaker[AsyncSession],
    name: str,
    holder: str,
    ttl_s: float,
    *,
    now: datetime | None = None,
) -> bool:
    """Take or renew the lease ``name`` for ``holder`` until ``now + ttl_s``.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        name: the lease's name (e.g. :data:`CONTROLLER_LEASE`).
        holder: who asks (see :func:`make_holder_id`).
        ttl_s: seconds the lease stays valid without renewal, > 0.
        now: the current time (aware UTC; default: the clock).

    Returns:
        True when ``holder`` holds the lease now, False when someone else does.

    Raises:
        ValueError: ``ttl_s`` not positive, or ``now`` naive.
    """
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
    now = _now(now)
    expires_at = now + timedelta(seconds=ttl_s)
    async with sessionmaker() as session, session.begin():
        renewed = await session.execute(
            update(_LEASES)
            .where(
                _LEASES.c.name == name,
                or_(_LEASES.c.holder == holder, _LEASES.c.expires_at < now),
            )
            .values(holder=holder, expires_at=expires_at)
            .returning(_LEASES.c.name)
        )
        if renewed.first() is not None:
            return True
        created = await session.execute(
            dialect_insert(session, _LEASES)
            .values(name=name, holder=holder, expires_at=expires_at)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(_LEASES.c.name)
        )
        return created.first() is not None


async def release_lease(sessionmaker: async_sessionmaker[AsyncSession], name: str, holder: str) -> bool:
    """Give up the lease ``name`` if ``holder`` holds it, so another process can take it at once.

    Returns:
        True when a lease held by ``holder`` was removed.
    """
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            delete(_LEASES).where(_LEASES.c.name == name, _LEASES.c.holder == holder).returning(_LEASES.c.name)
        )
        return result.first() is not None


async def lease_holder(
    sessionmaker: async_sessionmaker[AsyncSession], name: str, *, now: datetime | None = None
) -> tuple[str, datetime] | None:
    """Who holds the lease ``name`` now, and until when.

    Args:
        sessionmaker: from :func:`hedgerow.controller.store.db.make_sessionmaker`.
        name: the lease's name (e.g. :data:`CONTROLLER_LEASE`).
        now: the current time (aware UTC; default: the clock).

    Returns:
        ``(holder, expires_at)`` (aware UTC) while the lease is held, None when it is free or expired.

    Raises:
        ValueError: ``now`` naive.
    """
    now = _now(now)
    async with sessionmaker() as session:
        row = (
            await session.execute(select(_LEASES.c.holder, _LEASES.c.expires_at).where(_LEASES.c.name == name))
        ).first()
    if row is None:
        return None
    expires_at = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
    return None if expires_at < now else (row.holder, expires_at)


async def check_lease_held(session: AsyncSession, name: str, holder: str, *, now: datetime | None = None) -> None:
    """Fence a write: check, inside the session's open transaction, that ``holder`` holds ``name``.

    On PostgreSQL the lease row is read ``FOR SHARE``: until the transaction ends, a takeover
    (the ``UPDATE`` of :func:`acquire_lease`) waits, so what the transaction writes commits while
    the row still names ``holder``. On SQLite call it after the transaction took the write lock
    (any write first): nothing can change the row before the commit.

    Args:
        session: a session whose transaction is open.
        name: the lease's name.
        holder: the holder the write is made for.
        now: the current time (aware UTC; default: the clock).

    Raises:
        LeaseLost: the lease is held by another, expired, or gone (roll back).
        ValueError: ``now`` naive.
    """
    now = _now(now)
    query = select(_LEASES.c.holder, _LEASES.c.expires_at).where(_LEASES.c.name == name)
    if (await session.connection()).dialect.name == "postgresql":
        query = query.with_for_update(read=True)
    row = (await session.execute(query)).first()
    if row is None:
        raise LeaseLost(name, holder, "the lease row is gone (released)")
    if row.holder != holder:
        raise LeaseLost(name, holder, f"{row.holder} holds it")
    expires_at = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
    if expires_at <= now:
        raise LeaseLost(name, holder, f"it expired at {expires_at.isoformat()}")
