"""Benchmark: what a page of the calls explorer costs, shallow and deep, filtered and not.

A fresh store gets ``--calls`` calls of one route spread over the last ``--days`` days (PostgreSQL:
one partition a day), 1% of them failovers won by upstream ``c``, the rest won by ``a`` (primary)
or ``b`` (hedge). Then, each timed ``--repeat`` times (median reported, milliseconds):

- ``first``: the newest page (:func:`~hedgerow.controller.store.calls_query.recent_calls`, 50 calls);
- ``deep_page``: the page after the call ``--depth`` of the way down (its cursor), as the explorer
  pages, with its attempts;
- ``keyset_rows`` / ``offset_rows``: the calls of that deep page alone (no attempts), read after
  the cursor as the explorer does, and read with ``OFFSET`` (the baseline keyset paging replaces);
- ``rare_outcome``: the first page of ``outcome=failover`` (1% of calls: about 5,000 examined);
- ``no_match``: ``winner=nobody``: nothing matches, so the search stops at ``MAX_SCAN_CALLS``.

The kinds take turns in each round (so a load from elsewhere weighs on all alike); the deep page
is the one after call ``--depth`` (a fraction of the calls, default 0.9).

On a SQLite file, and on PostgreSQL when ``HEDGEROW_TEST_DATABASE_URL`` is set (a database of its
own, dropped after). Run: ``python bench/calls_explorer.py [--calls 200000] [--days 7]
[--repeat 15] [--depth 0.9] [--json bench/results/calls_explorer.json]``. Prints a table and writes JSON. Not a
test: nothing is asserted. Compare the rows of one run with each other (ratios): the machine may
be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import and_, or_, select

from hedgerow.client.records import AttemptRecord, CallRecord
from hedgerow.controller.calls_filters import MAX_SCAN_CALLS, decode_cursor
from hedgerow.controller.store.calls_query import recent_calls
from hedgerow.controller.store.db import make_engine, make_sessionmaker, upgrade_database
from hedgerow.controller.store.ingest import ingest_calls, route_defaults
from hedgerow.controller.store.models import Call, Route
from hedgerow.settings import Settings

PAGE = 50


def _record(i: int, started_at: datetime) -> CallRecord:
    """Call ``i``: a failover won by ``c`` for every 100th, a hedge won by ``b`` for every 10th, else ``a``."""
    if i % 100 == 0:
        attempts: tuple[AttemptRecord, ...] = (
            AttemptRecord("a", "primary", 0.0, None, 0.05, "failed", 503, "http_503", 0),
            AttemptRecord("c", "backup", 0.05, 0.6, 1.6, "won", 200, None, 20),
        )
        return CallRecord(
            f"c{i}",
            "r",
            "m1",
            started_at,
            winner="backup",
            hedged=True,
            hedge_reason="primary_error",
            ttft_s=0.6,
            e2e_s=1.6,
            prompt_tokens=100,
            completion_tokens=20,
            attempts=attempts,
        )
    if i % 10 == 0:
        attempts = (
            AttemptRecord("a", "primary", 0.0, None, 1.3, "cancelled", 200, None, 0),
            AttemptRecord("b", "backup", 1.0, 1.3, 2.3, "won", 200, None, 20),
        )
        return CallRecord(
            f"c{i}",
            "r",
            "m1",
            started_at,
            winner="backup",
            hedged=True,
            hedge_reason="ttft_timeout",
            hedge_after_s=1.0,
            ttft_s=1.3,
            e2e_s=2.3,
            prompt_tokens=100,
            completion_tokens=20,
            attempts=attempts,
        )
    attempts = (AttemptRecord("a", "primary", 0.0, 0.4, 1.4, "won", 200, None, 20),)
    return CallRecord(
        f"c{i}",
        "r",
        "m1",
        started_at,
        winner="primary",
        ttft_s=0.4,
        e2e_s=1.4,
        prompt_tokens=100,
        completion_tokens=20,
        attempts=attempts,
    )


async def _medians_ms(repeat: int, runs: dict[str, Callable[[], Awaitable[Any]]]) -> dict[str, float]:
    """The median wall time of each of ``runs``, milliseconds; the runs take turns in each round,
    so a load from elsewhere on the machine weighs on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            await run()
            times[name].append((time.perf_counter() - start) * 1000)
    return {f"{name}_ms": round(statistics.median(values), 2) for name, values in times.items()}


async def measure(url: str, calls: int, days: float, repeat: int, depth_share: float = 0.9) -> dict[str, Any]:
    """Seed a fresh store at ``url``; time each kind of page. Returns the row of the table."""
    upgrade_database(url)
    engine = make_engine(url)
    sessionmaker = make_sessionmaker(engine)
    now = datetime.now(UTC)
    step_s = days * 86_400 / calls
    defaults = route_defaults(Settings())
    seed_start = time.perf_counter()
    for first in range(0, calls, 5000):
        batch = [_record(i, now - timedelta(seconds=i * step_s)) for i in range(first, min(first + 5000, calls))]
        async with sessionmaker() as session, session.begin():
            await ingest_calls(session, batch, defaults=defaults)
    seed_s = time.perf_counter() - seed_start
    depth = max(1, int(calls * depth_share))
    async with sessionmaker() as session:
        route_id = await session.scalar(select(Route.id).where(Route.route == "r", Route.model == "m1"))
        middle = (
            await session.execute(
                select(Call.started_at, Call.id)
                .order_by(Call.started_at.desc(), Call.id.desc())
                .offset(depth - 1)
                .limit(1)
            )
        ).one()
    from hedgerow.controller.calls_filters import encode_cursor

    after = decode_cursor(encode_cursor(middle[0], middle[1]))
    results: dict[str, Any] = {"store": url.split("+")[0], "calls": calls, "days": days, "seed_s": round(seed_s, 1)}

    async def page(**kwargs: Any) -> Any:
        async with sessionmaker() as session:
            return await recent_calls(session, "r", "m1", limit=PAGE, **kwargs)

    newest_first = (Call.started_at.desc(), Call.id.desc())
    mine = select(Call).where(Call.route_id == route_id)  # the explorer's query: one route, on its index

    async def offset_page() -> Any:
        async with sessionmaker() as session:
            return list(await session.scalars(mine.order_by(*newest_first).offset(depth).limit(PAGE)))

    async def keyset_rows() -> Any:
        started, call_id = after
        older = and_(Call.started_at <= started, or_(Call.started_at < started, Call.id < call_id))
        async with sessionmaker() as session:
            return list(await session.scalars(mine.where(older).order_by(*newest_first).limit(PAGE)))

    keyset = await page(after=after)
    assert [c["request_id"] for c in keyset.calls] == [c.request_id for c in await offset_page()]
    assert [c.request_id for c in await keyset_rows()] == [c.request_id for c in await offset_page()]
    rare = await page(outcome="failover")
    assert len(rare.calls) == min(PAGE, (calls + 99) // 100) and {c["winner_upstream"] for c in rare.calls} == {"c"}
    none = await page(winner="nobody")
    assert none.calls == [] and (none.scan_stopped_at is not None) == (calls > MAX_SCAN_CALLS)
    runs: dict[str, Callable[[], Awaitable[Any]]] = {
        "first": page,
        "deep_page": lambda: page(after=after),
        "keyset_rows": keyset_rows,
        "offset_rows": offset_page,
        "rare_outcome": lambda: page(outcome="failover"),
        "no_match": lambda: page(winner="nobody"),
    }
    results |= await _medians_ms(repeat, runs)
    await engine.dispose()
    return results


async def main(args: argparse.Namespace) -> None:
    """Measure on SQLite (and PostgreSQL when configured); print the table, write the JSON."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import create_pg_database, drop_pg_database

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(
            await measure(f"sqlite+aiosqlite:///{tmp}/bench.db", args.calls, args.days, args.repeat, args.depth)
        )
    base = os.environ.get("HEDGEROW_TEST_DATABASE_URL")
    if base:
        url = await create_pg_database(base, "hedgerow_bench_calls")
        try:
            rows.append(await measure(url, args.calls, args.days, args.repeat, args.depth))
        finally:
            await drop_pg_database(url)
    columns = [
        "store",
        "calls",
        "seed_s",
        "first_ms",
        "deep_page_ms",
        "keyset_rows_ms",
        "offset_rows_ms",
        "rare_outcome_ms",
        "no_match_ms",
    ]
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[c]) for c in columns))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"page": PAGE, "max_scan": MAX_SCAN_CALLS, "results": rows}, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--depth", type=float, default=0.9)
    parser.add_argument("--json", default="")
    asyncio.run(main(parser.parse_args()))
