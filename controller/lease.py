"""A lease row that elects the one process running the scheduled jobs.

The holder renews the lease with a conditional UPDATE
(``WHERE name = :name AND (holder = :holder OR expires_at < :now)``), which succeeds for the
current holder, or for anyone once the lease has expired; when no row exists yet it is created
with ``INSERT ... ON CONFLICT DO NOTHING``. Both statements are atomic on SQLite and PostgreSQL,
so of two processes racing for a free lease exactly one wins. Times come from the caller's clock
(UTC); keep the clocks of the replicas in sync (NTP) and the TTL well above their skew.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, or_, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from hedgerow.controller.db import dialect_insert
from hedgerow.controller.models import Lease, utc_now

__all__ = ["CONTROLLER_LEASE", "make_holder_id", "acquire_lease", "release_lease"]

#: Name of the lease of the controller job.
CONTROLLER_LEASE = "controller"


def make_holder_id() -> str:
    """A holder id unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _now(now: datetime | None) -> datetime:
    if now is None:
        return utc_now()
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    return now.astimezone(timezone.utc)


async def acquire_lease(
    sessionmaker: async_sessionmaker,
    name: str,
    holder: str,
    ttl_s: float,
    *,
    now: datetime | None = None,
) -> bool:
    """Take or renew the lease ``name`` for ``holder`` until ``now + ttl_s``.

    Args:
        sessionmaker: from :func:`hedgerow.controller.db.make_sessionmaker`.
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
            update(Lease.__table__)
            .where(
                Lease.__table__.c.name == name,
                or_(Lease.__table__.c.holder == holder, Lease.__table__.c.expires_at < now),
            )
            .values(holder=holder, expires_at=expires_at)
            .returning(Lease.__table__.c.name)
        )
        if renewed.first() is not None:
            return True
        created = await session.execute(
            dialect_insert(session, Lease.__table__)
            .values(name=name, holder=holder, expires_at=expires_at)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(Lease.__table__.c.name)
        )
        return created.first() is not None


async def release_lease(sessionmaker: async_sessionmaker, name: str, holder: str) -> bool:
    """Give up the lease ``name`` if ``holder`` holds it, so another process can take it at once.

    Returns:
        True when a lease held by ``holder`` was removed.
    """
    async with sessionmaker() as session, session.begin():
        result = await session.execute(
            delete(Lease.__table__)
            .where(Lease.__table__.c.name == name, Lease.__table__.c.holder == holder)
            .returning(Lease.__table__.c.name)
        )
        return result.first() is not None
