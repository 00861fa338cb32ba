"""Connections whose statements run on the loop's thread inside a transaction, but the commit.

A commit may run the WAL's automatic checkpoint (every page another process wrote since the last
one, copied and synced): it runs in aiosqlite's thread so that the event loop serves polls
meanwhile. The statements of the transaction run on the loop's own thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from hedgerow.controller.store.sqlite_inline import connect_inline_in_transaction


async def test_statements_run_inline_and_the_commit_in_aiosqlites_thread(tmp_path: Path) -> None:
    connection = await connect_inline_in_transaction(str(tmp_path / "inline.db"), isolation_level=None)
    try:
        seen: list[tuple[str, int]] = []
        await connection.set_trace_callback(lambda statement: seen.append((statement, threading.get_ident())))
        await connection.execute("CREATE TABLE t (x INTEGER)")
        await connection.execute("BEGIN IMMEDIATE")
        await connection.execute("INSERT INTO t VALUES (1)")
        await connection.commit()
        loop_thread = threading.get_ident()
        threads = {statement.split()[0]: ident for statement, ident in seen}
        assert threads["BEGIN"] != loop_thread  # may wait for another process's lock: not here
        assert threads["INSERT"] == loop_thread
        assert threads["COMMIT"] != loop_thread
        async with connection.execute("SELECT x FROM t") as cursor:
            assert [tuple(row) for row in await cursor.fetchall()] == [(1,)]
    finally:
        await connection.close()
