"""SQLite connections whose statements run on the event loop's thread while they hold a transaction.

aiosqlite runs every call in a thread of the connection's own, and CPython's ``sqlite3`` releases
the GIL around each ``sqlite3_step``: an ``executemany`` of 1,000 rows takes the GIL back 1,000
times from the event loop's thread, which meanwhile validates other requests. Measured with four
concurrent posters (``bench/ingest.py``'s records, 40k per run, this 2-core machine): the server
burned ~10% more CPU and stored ~15-20% fewer records per second than with the same statements run
on the loop's own thread.

:func:`connect_inline_in_transaction` makes an aiosqlite connection that keeps aiosqlite's
thread for what may wait on another process (opening a transaction, whose ``BEGIN IMMEDIATE``
waits in SQLite's busy handler for the write lock) and runs every statement of an open
transaction on the calling thread, but the ``COMMIT``. Meant for a connection whose transactions
all start with ``BEGIN IMMEDIATE`` (the group commit writer,
:mod:`hedgerow.controller.store.group_commit`): once it holds the write lock nothing it runs waits
for a lock in WAL mode (readers never block a writer), so the loop is held only for one statement
at a time (an ``executemany`` of a batch), never for another process. The commit goes to
aiosqlite's thread: it may run the WAL's automatic checkpoint, which copies every page written
since the last one into the database file and syncs it, however many another process wrote (a
controller tick publishing 1,000 routes from its worker process); in a profile of a ``serve``
ingesting during such ticks the commit was 28 of the 50 samples its ingest spent inline, each
sample time taken from polls. A deferred transaction would take the lock at its first write,
inline: do not use these connections for those.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from functools import partial
from typing import Any

import aiosqlite

__all__ = ["InlineInTransaction", "connect_inline_in_transaction"]


class InlineInTransaction(aiosqlite.Connection):
    """An aiosqlite connection that runs calls on the caller's thread inside a transaction."""

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` here when the connection is in a transaction and ``fn`` is not its commit,
        else in aiosqlite's thread.

        After a call run here the loop gets a turn (``asyncio.sleep(0)``), as it would while
        waiting for aiosqlite's thread: other requests wait for one statement, not for a whole
        transaction.
        """
        connection = self._connection
        if (
            self._running
            and connection is not None
            and connection.in_transaction
            and fn != connection.commit  # may checkpoint the WAL: see the module docstring
        ):
            result = fn(*args, **kwargs)
            await asyncio.sleep(0)
            return result
        return await super()._execute(fn, *args, **kwargs)  # type: ignore[no-untyped-call]  # aiosqlite's own


async def connect_inline_in_transaction(path: str, **kwargs: Any) -> InlineInTransaction:
    """Open ``path`` as an :class:`InlineInTransaction` connection.

    Args:
        path: the SQLite file.
        **kwargs: passed to :func:`sqlite3.connect` (``check_same_thread`` is always False: the
            connection is used from aiosqlite's thread and from the loop's, never at once).
    """
    connector = partial(sqlite3.connect, path, **{**kwargs, "check_same_thread": False})
    connection = InlineInTransaction(connector, iter_chunk_size=64)
    connection._thread.daemon = True  # as SQLAlchemy's aiosqlite dialect does for its own
    await connection  # starts aiosqlite's thread and connects in it
    return connection
