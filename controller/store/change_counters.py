"""Read the change counters that database triggers raise (``change_counters``, migration 0008).

A process that caches a view of the store (the threshold table that clients poll) reads the
view's counter to learn, with one primary-key read, whether any process changed the data
behind it. Read the counter *before* the data: under READ COMMITTED a write committed between
the two reads then shows up as a newer counter on the next check (one needless re-render),
never as an old counter beside new data.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hedgerow.controller.store.models import ChangeCounter

__all__ = ["THRESHOLD_TABLE", "read_change_counter"]

#: The counter of the threshold table (every write of ``thresholds``, every update of ``routes``).
THRESHOLD_TABLE = "threshold_table"


async def read_change_counter(session: AsyncSession, name: str = THRESHOLD_TABLE) -> int | None:
    """The current version of counter ``name`` (None when the store has no such row).

    Args:
        session: an open session (the read runs in its transaction, or autocommits).
        name: the counter, :data:`THRESHOLD_TABLE` by default.
    """
    return await session.scalar(select(ChangeCounter.version).where(ChangeCounter.name == name))
